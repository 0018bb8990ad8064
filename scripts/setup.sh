#!/usr/bin/env bash
# Installs everything speedmatrix needs on a fresh Debian machine and installs
# the package itself (compiling the C++ core). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(g++ cmake pkg-config libcurl4-openssl-dev nlohmann-json3-dev
              libsimdjson-dev libevent-dev libgtest-dev libgmock-dev)
# Test-only: chromium opens the HTML report; openssl makes the TLS test's certificate;
# clang-format checks the C++ formatting.
if [[ "${SPEEDMATRIX_WITH_BROWSER:-0}" == 1 ]]; then DEB_PACKAGES+=(chromium openssl clang-format); fi
# Test-only: scripts/ci-hardening.sh builds libFuzzer targets with Debian's clang.
if [[ "${SPEEDMATRIX_WITH_FUZZ:-0}" == 1 ]]; then DEB_PACKAGES+=(clang-14 libclang-rt-14-dev); fi
PY=${PYTHON:-python3}
# The extension compiles against the headers of the Python that installs it;
# Debian's python3 ships them apart (a pyenv or venv Python has them already).
if ! $PY -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  DEB_PACKAGES+=(python3-dev)
fi

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

extras="${SPEEDMATRIX_EXTRAS:-}"
echo "setup: installing speedmatrix${extras:+[$extras]} (compiles the C++ core)"
$PY -m pip install -q --disable-pip-version-check ".${extras:+[$extras]}"
