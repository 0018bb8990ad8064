#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "register.hpp"
#include "speedmatrix/stats.hpp"

namespace py = pybind11;

namespace speedmatrix::bindings {
namespace {

// A column of a records dict as a contiguous array of T (converted, and so
// copied, only when the caller's dtype or layout differs).
template <class T>
py::array_t<T, py::array::c_style | py::array::forcecast> column(const py::dict& d,
                                                                 const char* group,
                                                                 const char* name) {
  if (!d.contains(name))
    throw py::key_error(std::string(group) + " records lack the column '" + name + "'");
  auto a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(d[name]);
  if (!a) throw py::type_error(std::string(group) + "['" + name + "'] is not a numeric array");
  if (a.ndim() != 1)
    throw py::value_error(std::string(group) + "['" + name + "'] must be 1-dimensional");
  return a;
}

template <class A>
auto span_of(const A& a) {
  return std::span(a.data(), static_cast<std::size_t>(a.size()));
}

py::list interval(const Interval& i) {
  py::list l;
  l.append(i.lo);
  l.append(i.hi);
  return l;
}

py::dict figures_dict(const CellFigures& f) {
  py::dict d;
  d["measured_s"] = f.measured_s;
  d["output_tokens"] = f.output_tokens;
  d["total_tok_s"] = f.total_tok_s;
  d["tbt_ms"] = f.tbt_ms;
  d["per_request_tok_s"] = f.per_request_tok_s;
  d["ttft_ms"] = f.ttft_ms;
  d["ttft_first_wave_ms"] = f.ttft_first_wave_ms;
  d["decode_tok_s_per_request"] = f.decode_tok_s_per_request;
  d["decode_requests"] = f.decode_requests;
  d["decode_tok_s_per_request_ci"] = interval(f.decode_tok_s_per_request_ci);
  d["error_slot_s"] = f.error_slot_s;
  d["precision"] = f.precision;
  d["avg_active"] = f.avg_active;
  d["completed"] = f.completed;
  d["started"] = f.started;
  d["errors"] = f.errors;
  d["total_tok_s_ci"] = interval(f.total_tok_s_ci);
  d["tbt_ms_ci"] = interval(f.tbt_ms_ci);
  d["per_request_tok_s_ci"] = interval(f.per_request_tok_s_ci);
  d["ttft_ms_ci"] = interval(f.ttft_ms_ci);
  d["drift"] = f.drift;
  d["drifting"] = f.drifting;
  d["ttft_p90_ms"] = f.ttft_p90_ms;
  d["ttft_p99_ms"] = f.ttft_p99_ms;
  d["tbt_p90_ms"] = f.tbt_p90_ms;
  d["tbt_p99_ms"] = f.tbt_p99_ms;
  d["bin_tok_s"] = f.bin_tok_s;
  return d;
}

}  // namespace

void register_stats(py::module_& m) {
  m.def(
      "summarize_cell",
      [](const py::dict& requests, const py::dict& events, ns_t t0_ns, ns_t t1_ns, double bin_s,
         ns_t steady_from_ns, ns_t ttft_from_ns) {
        if (!(t1_ns > t0_ns)) throw py::value_error("summarize_cell needs t1_ns > t0_ns");
        if (!(bin_s > 0)) throw py::value_error("summarize_cell needs bin_s > 0");
        const auto sent = column<ns_t>(requests, "requests", "sent_ns");
        const auto first = column<ns_t>(requests, "requests", "first_token_ns");
        const auto done = column<ns_t>(requests, "requests", "done_ns");
        const auto outcome = column<std::uint8_t>(requests, "requests", "outcome");
        const auto phase = column<std::uint8_t>(requests, "requests", "phase");
        const auto prompt = column<std::int64_t>(requests, "requests", "prompt_tokens");
        const auto ev_req = column<std::int32_t>(events, "events", "request");
        const auto ev_t = column<ns_t>(events, "events", "t_ns");
        const auto ev_tok = column<std::int32_t>(events, "events", "tokens");
        // optional: usage totals of chunk-counted requests (saved runs have them)
        const bool usage = requests.contains("output_tokens") && requests.contains("token_source");
        const auto out_tok =
            usage ? column<std::int64_t>(requests, "requests", "output_tokens")
                  : py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>();
        const auto source =
            usage ? column<std::uint8_t>(requests, "requests", "token_source")
                  : py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>();
        // optional: the slot column (saved runs have it) gives the first wave
        const bool slots = requests.contains("slot");
        const auto slot =
            slots ? column<std::int32_t>(requests, "requests", "slot")
                  : py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>();
        const py::ssize_t n = sent.size();
        if (slots && slot.size() != n)
          throw py::value_error("request columns have different lengths");
        for (py::ssize_t len :
             {first.size(), done.size(), outcome.size(), phase.size(), prompt.size()}) {
          if (len != n) throw py::value_error("request columns have different lengths");
        }
        if (ev_t.size() != ev_req.size() || ev_tok.size() != ev_req.size()) {
          throw py::value_error("event columns have different lengths");
        }
        const std::int32_t* r = ev_req.data();
        for (py::ssize_t i = 0; i < ev_req.size(); ++i) {
          if (r[i] < 0 || r[i] >= n)
            throw py::value_error("events['request'] holds an index outside the requests");
        }
        RecordView v;
        v.sent_ns = span_of(sent);
        v.first_token_ns = span_of(first);
        v.done_ns = span_of(done);
        v.outcome = span_of(outcome);
        v.phase = span_of(phase);
        v.prompt_tokens = span_of(prompt);
        v.ev_request = span_of(ev_req);
        v.ev_t_ns = span_of(ev_t);
        v.ev_tokens = span_of(ev_tok);
        if (slots) v.slot = span_of(slot);
        if (usage) {
          if (out_tok.size() != n || source.size() != n) {
            throw py::value_error("request columns have different lengths");
          }
          v.output_tokens = span_of(out_tok);
          v.token_source = span_of(source);
        }
        CellFigures f;
        {
          // Safe without the GIL: the views point into arrays this frame
          // holds references to, and summarize_cell touches nothing else.
          py::gil_scoped_release nogil;
          f = summarize_cell(v, t0_ns, t1_ns, bin_s, steady_from_ns, ttft_from_ns);
        }
        return figures_dict(f);
      },
      py::arg("requests"), py::arg("events"), py::arg("t0_ns"), py::arg("t1_ns"),
      py::arg("bin_s") = 1.0, py::arg("steady_from_ns") = -1, py::arg("ttft_from_ns") = -1,
      "Figures of a cell's window [t0_ns, t1_ns] from its raw records (the dicts of CellResult, "
      "or\n"
      "the same columns loaded from a saved run). TTFT counts requests sent from ttft_from_ns "
      "(-1: t0;\n"
      "pass the ramp's start). Intervals are [lo, hi]; NaN where undefined.");
  m.def(
      "precision_stop",
      [](double total_tok_s, std::pair<double, double> total_ci, double tbt_ms,
         std::pair<double, double> tbt_ci, double target, double elapsed_s, double min_s) {
        CellFigures f;
        f.total_tok_s = total_tok_s;
        f.total_tok_s_ci = {total_ci.first, total_ci.second};
        f.tbt_ms = tbt_ms;
        f.tbt_ms_ci = {tbt_ci.first, tbt_ci.second};
        return py::make_tuple(precision_stop(f, target, elapsed_s, min_s), precision_of(f));
      },
      py::arg("total_tok_s"), py::arg("total_tok_s_ci"), py::arg("tbt_ms"), py::arg("tbt_ms_ci"),
      py::arg("target"), py::arg("elapsed_s"), py::arg("min_duration_s"),
      "The precision stop the cell runs in C++: (stop, precision reached) for figures and their "
      "intervals.");
}

}  // namespace speedmatrix::bindings
