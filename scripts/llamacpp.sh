#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU, Release, only that target) for the
# real-engine tests, into a cache folder outside the clone, and reuses it when
# present. The source is the `llama-cpp-python` sdist's vendor/llama.cpp, from
# the package registry the machines already reach; nothing is fetched at build
# time (no web UI download, no curl, no OpenSSL).
#
#   scripts/llamacpp.sh          build if missing, then print the engine's build
#   scripts/llamacpp.sh --path   print where the binary is (or will be); builds nothing
#
# Environment:
#   SPEEDMATRIX_CACHE              cache root (default ~/.cache/speedmatrix)
#   SPEEDMATRIX_LLAMACPP_VERSION   llama-cpp-python sdist version (pinned below)
# The cache is keyed by that version; native CPU flags are fine because the
# cache belongs to the machine that built it.
set -euo pipefail

VERSION="${SPEEDMATRIX_LLAMACPP_VERSION:-0.3.36}"
CACHE="${SPEEDMATRIX_CACHE:-$HOME/.cache/speedmatrix}"
DEST="$CACHE/llama.cpp-py$VERSION"
BIN="$DEST/bin/llama-server"
LOG="$DEST/build.log"
PY=${PYTHON:-python3}

if [[ "${1:-}" == "--path" ]]; then
  echo "$BIN"
  exit 0
fi

print_build() {
  # llama-server prints "version: N (commit)" and "built with ..." on --version.
  echo "llamacpp: $BIN"
  "$BIN" --version 2>&1 | sed 's/^/llamacpp: /'
}

if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
  print_build
  exit 0
fi

mkdir -p "$DEST"
# Two test runs on one machine must not build into the same folder at once.
exec 9>"$DEST/.lock"
flock 9
if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
  print_build
  exit 0
fi

start_s=$(date +%s)
echo "llamacpp: building llama-server from llama-cpp-python $VERSION (log: $LOG)"
: >"$LOG"
SRC="$DEST/src"
rm -rf "$SRC" "$DEST/build"
mkdir -p "$SRC"
# --no-build-isolation: pip only reads the sdist's metadata, it installs no
# build backend; the tarball is all that is needed.
$PY -m pip download -q --disable-pip-version-check --no-deps --no-build-isolation \
    --no-binary :all: "llama-cpp-python==$VERSION" -d "$SRC" >>"$LOG" 2>&1
tar -xzf "$SRC"/llama_cpp_python-"$VERSION".tar.gz -C "$SRC"
LLAMA="$SRC/llama_cpp_python-$VERSION/vendor/llama.cpp"
[[ -f "$LLAMA/CMakeLists.txt" ]] || { echo "llamacpp: no vendor/llama.cpp in the sdist" >&2; exit 1; }

cmake -S "$LLAMA" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      >>"$LOG" 2>&1 || { echo "llamacpp: configure failed, see $LOG" >&2; tail -20 "$LOG" >&2; exit 1; }
cmake --build "$DEST/build" --target llama-server -j"$(nproc)" >>"$LOG" 2>&1 ||
  { echo "llamacpp: build failed, see $LOG" >&2; tail -30 "$LOG" >&2; exit 1; }
mkdir -p "$DEST/bin"
cp "$DEST/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
# The build tree and the source are large and not needed to run the binary.
rm -rf "$DEST/build" "$SRC"
echo "llamacpp: built in $(($(date +%s) - start_s)) s"
print_build
