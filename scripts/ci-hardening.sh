#!/usr/bin/env bash
# Hardening checks of docs/RELIABILITY.md, run by scripts/test.sh (and so by .ci/run):
#   1. libFuzzer (clang-14) on the SSE parser, the chunked decoder, the OpenAI stream decoder
#      and the Prometheus parser, each seeded from tests/data and tests/fuzz/seeds, under
#      ASan+UBSan, for FUZZ_SECONDS each; plus the Python discovery-answer fuzzer. A crash
#      input is kept in tests/fuzz/regressions/<target>/ (ctest replays them) and fails CI.
#   2. The C++ tests under ASan+UBSan, and under TSan.
#   3. One end-to-end cell through the Python bindings with an ASan+UBSan _core.
# Build folders: build/fuzz, build/asan, build/tsan. Cold on 2 cores the ASan build of the
# whole tree dominates (docs/RELIABILITY.md has the measured times).
# HARDENING_SKIP="fuzz tsan ..." skips steps (fuzz, asan, tsan, e2e).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-25}
SKIP=" ${HARDENING_SKIP:-} "
PY=${PYTHON:-python3}
CLANGXX=${CLANGXX:-$(command -v clang++-14 || command -v clang++ || true)}
CLANGC=${CLANGC:-$(command -v clang-14 || command -v clang || true)}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# Sanitizer builds: -O1 and line tables only, about half the compile time of RelWithDebInfo.
SAN_BUILD=(-DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS_INIT=-O1)
status=0
t_start=$SECONDS
step() { echo "hardening: $* ($((SECONDS - t_start)) s)"; }

if [[ $SKIP != *" fuzz "* ]]; then
  if [[ -z $CLANGXX ]]; then
    echo "hardening: clang++ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2
    exit 1
  fi
  step "building the fuzz targets (clang, ASan+UBSan)"
  CC=$CLANGC CXX=$CLANGXX cmake -S . -B build/fuzz -DSPEEDMATRIX_BUILD_FUZZ=ON \
    -DSPEEDMATRIX_BUILD_PYTHON=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="$SAN" -DCMAKE_EXE_LINKER_FLAGS="$SAN" >/dev/null
  cmake --build build/fuzz -j"$JOBS" --target fuzz_sse fuzz_chunked fuzz_openai fuzz_prom >/dev/null
  for t in sse chunked openai prom; do
    corpus=$(mktemp -d)
    cp tests/fuzz/seeds/"$t"/* "$corpus"/ 2>/dev/null || true
    case $t in sse | openai) cp tests/data/streams/* "$corpus"/ ;; esac
    mkdir -p tests/fuzz/regressions/"$t"
    step "fuzzing $t for ${FUZZ_SECONDS} s"
    if ! build/fuzz/fuzz_"$t" -max_total_time="$FUZZ_SECONDS" -max_len=65536 -rss_limit_mb=2048 \
      -timeout=10 -artifact_prefix="tests/fuzz/regressions/$t/" -print_final_stats=1 \
      "$corpus" >"build/fuzz/$t.log" 2>&1; then
      echo "hardening: fuzz_$t found a crash; the input is kept in tests/fuzz/regressions/$t/" >&2
      tail -40 "build/fuzz/$t.log" >&2
      status=1
    fi
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "build/fuzz/$t.log" | tr '\n' ' '
    echo
    rm -rf "$corpus"
  done
  step "fuzzing the discovery-answer parsers (Python) for ${FUZZ_SECONDS} s"
  # against the installed package (scripts/test.sh installs it first), as pytest runs
  $PY tests/fuzz/fuzz_discovery.py --seconds "$FUZZ_SECONDS" || status=1
fi

if [[ $SKIP != *" asan "* ]]; then
  step "C++ tests under ASan+UBSan"
  cmake -S . -B build/asan -DSPEEDMATRIX_BUILD_TESTS=ON -DSPEEDMATRIX_BUILD_PYTHON=ON \
    "${SAN_BUILD[@]}" -DCMAKE_CXX_FLAGS="-O1 -g1 $SAN" \
    -DCMAKE_EXE_LINKER_FLAGS="$SAN" -DCMAKE_SHARED_LINKER_FLAGS="$SAN" >/dev/null
  cmake --build build/asan -j"$JOBS" >/dev/null
  # A timing test slowed by ASan may miss its bound under load: one rerun, as the project's
  # rule for real-time tests; a sanitizer report fails the same way twice.
  ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan --output-on-failure -j"$JOBS" --repeat until-pass:2 \
    >build/asan/ctest.log 2>&1 ||
    { tail -60 build/asan/ctest.log >&2; status=1; }
  tail -3 build/asan/ctest.log
fi

if [[ $SKIP != *" e2e "* ]]; then
  step "one cell end to end through the Python bindings, _core under ASan+UBSan"
  pkg=build/asan/pkg
  rm -rf "$pkg" && mkdir -p "$pkg"
  cp -r python/speedmatrix "$pkg"/
  rm -f "$pkg"/speedmatrix/_core*.so
  cp build/asan/_core*.so "$pkg"/speedmatrix/
  mkdir -p "$pkg"/speedmatrix/_bin && cp build/asan/speedmatrix-sim "$pkg"/speedmatrix/_bin/
  out=$(mktemp -d)
  # Python itself is not built with ASan: preload the runtime; its own allocations leak by
  # design at exit, so leak checking is off here (the C++ tests above check leaks).
  if ! LD_PRELOAD="$(gcc -print-file-name=libasan.so)" \
    ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:verify_asan_link_order=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 PYTHONPATH="$ROOT/$pkg" \
    $PY -c "
import sys
from speedmatrix.sim import Sim
from speedmatrix import cli
with Sim('fixed') as s:
    code = cli.main(['run', '--url', s.url, '--contexts', '64', '--concurrency', '4',
                     '--duration', '2s', '--max-output', '200', '--out', '$out/run',
                     '--quiet', '--no-report'])
sys.exit(code)
" >build/asan/e2e.log 2>&1; then
    tail -40 build/asan/e2e.log >&2
    status=1
  fi
  rm -rf "$out"
fi

if [[ $SKIP != *" tsan "* ]]; then
  # The suites with threads: the cell runner (loop thread, /metrics sampler, stop from
  # another thread), the scheduler, the HTTP client, the many-loop runner (loops.hpp) and the
  # sessions' chain feed (a feeder thread pushes while the loop takes); the parsers are
  # single-threaded.
  step "C++ tests with threads under TSan (cell, scheduler, http, loops, chain)"
  TS="-fsanitize=thread -fno-omit-frame-pointer"
  cmake -S . -B build/tsan -DSPEEDMATRIX_BUILD_TESTS=ON -DSPEEDMATRIX_BUILD_PYTHON=OFF \
    "${SAN_BUILD[@]}" -DCMAKE_CXX_FLAGS="-O1 -g1 $TS" -DCMAKE_EXE_LINKER_FLAGS="$TS" >/dev/null
  cmake --build build/tsan -j"$JOBS" --target test_cell test_scheduler test_http test_loops test_chain >/dev/null
  # TSan slows the loop ~5-15x: timing assertions of these suites (test_cell's "all four
  # cancelled streams seen closed" wait) can miss their bounds. A race report or a crash
  # fails CI; a timing miss alone is listed as a warning.
  if ! TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build/tsan --output-on-failure -j"$JOBS" -R "^test_(cell|scheduler|http|loops|chain)\." \
    >build/tsan/ctest.log 2>&1; then
    if grep -q "ThreadSanitizer\|Exception: \|SEGFAULT\|Child aborted" build/tsan/ctest.log; then
      tail -80 build/tsan/ctest.log >&2
      status=1
    else
      echo "hardening: warning: no race reported; timing assertions missed under TSan:" >&2
      grep -E "^\s+[0-9]+ - " build/tsan/ctest.log >&2 || true
    fi
  fi
  tail -3 build/tsan/ctest.log
fi

step "done, status $status"
exit $status
