// Cost of one precision check (cell.cpp's should_end) at a given number of window events:
// the PrecisionScan over the event columns (spilled past 2^18 events, as a cell keeps them)
// against the old way, unpacking the columns and calling summarize_cell. Prints figures;
// never a test (docs/PERFORMANCE.md holds the latest).
//
//   cmake -S . -B build/bench -DSPEEDMATRIX_BUILD_BENCH=ON -DSPEEDMATRIX_BUILD_PYTHON=OFF \
//     -DCMAKE_BUILD_TYPE=Release && cmake --build build/bench --target precision_check_bench
//   build/bench/precision_check_bench 1000000 10000000
#include <sys/resource.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "speedmatrix/clock.hpp"
#include "speedmatrix/records.hpp"
#include "speedmatrix/stats.hpp"

using namespace speedmatrix;

namespace {

// CPU time of this thread: other load on a shared machine inflates it less than wall time.
double seconds_since(ns_t cpu0) { return static_cast<double>(thread_cpu_ns() - cpu0) / 1e9; }

long max_rss_mb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

}  // namespace

int main(int argc, char** argv) {
  for (int a = 1; a < argc; ++a) {
    const std::size_t n_ev = std::stoull(argv[a]);
    // 1024 streams of ~4 requests each, one token an event, ~25K events/s
    const std::size_t n_req = 4096;
    std::vector<ns_t> sent(n_req, 0), first(n_req, 0), done(n_req, kNever);
    std::vector<std::uint8_t> outcome(n_req, 0), phase(n_req, 1);
    std::vector<std::int64_t> prompt(n_req, -1);
    EventColumns ev;  // the cell's default spill threshold
    std::mt19937_64 rng(1);
    ns_t t = 0;
    for (std::size_t i = 0; i < n_ev; ++i) {
      t += 20'000 + static_cast<ns_t>(rng() % 40'000);
      ev.push(static_cast<std::int32_t>(i % n_req), t, 1, kNever);
    }
    RecordView v;
    v.sent_ns = sent;
    v.first_token_ns = first;
    v.done_ns = done;
    v.outcome = outcome;
    v.phase = phase;
    v.prompt_tokens = prompt;
    const long rss0 = max_rss_mb();
    const ns_t t_scan = thread_cpu_ns();
    PrecisionScan scan(v, 0, t);
    ev.for_each(0, ev.size(), [&scan](std::size_t, std::int32_t q, ns_t at, std::int32_t k) {
      scan.add(q, at, k);
    });
    const CellFigures f = scan.finish();
    const double scan_s = seconds_since(t_scan);
    const long rss_scan = max_rss_mb();
    const ns_t t_old = thread_cpu_ns();
    const EventColumns::Plain p = ev.plain_copy();
    v.ev_request = {p.request.data(), p.request.size()};
    v.ev_t_ns = {p.t_ns.data(), p.t_ns.size()};
    v.ev_tokens = {p.tokens.data(), p.tokens.size()};
    const CellFigures g = summarize_cell(v, 0, t);
    const double old_s = seconds_since(t_old);
    std::printf(
        "%zu events (%.0f s of window): PrecisionScan %.3f s CPU, peak RSS +%ld MB | unpack + "
        "summarize_cell %.3f s CPU, peak RSS +%ld MB | same precision: %s\n",
        n_ev, static_cast<double>(t) / 1e9, scan_s, rss_scan - rss0, old_s, max_rss_mb() - rss_scan,
        f.precision == g.precision ? "yes" : "NO");
  }
  return 0;
}
