#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "register.hpp"
#include "speedmatrix/stats.hpp"
#include "speedmatrix/stats_interference.hpp"

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

using I64 = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;
using U8 = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>;
using I32 = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>;

// The records' columns as contiguous arrays (held here, so that `view` stays
// valid while this object lives) and a RecordView over them; checks lengths
// and event indices.
struct Columns {
  I64 sent, first, done, prompt, out_tok;
  U8 outcome, phase, source;
  I32 ev_req, ev_tok, slot;
  I64 ev_t;
  RecordView view;

  Columns(const py::dict& requests, const py::dict& events) {
    sent = column<ns_t>(requests, "requests", "sent_ns");
    first = column<ns_t>(requests, "requests", "first_token_ns");
    done = column<ns_t>(requests, "requests", "done_ns");
    outcome = column<std::uint8_t>(requests, "requests", "outcome");
    phase = column<std::uint8_t>(requests, "requests", "phase");
    prompt = column<std::int64_t>(requests, "requests", "prompt_tokens");
    ev_req = column<std::int32_t>(events, "events", "request");
    ev_t = column<ns_t>(events, "events", "t_ns");
    ev_tok = column<std::int32_t>(events, "events", "tokens");
    // optional: usage totals of chunk-counted requests (saved runs have them)
    const bool usage = requests.contains("output_tokens") && requests.contains("token_source");
    out_tok = usage ? column<std::int64_t>(requests, "requests", "output_tokens")
                    : py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>();
    source = usage ? column<std::uint8_t>(requests, "requests", "token_source")
                   : py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>();
    const py::ssize_t n = sent.size();
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
    view.sent_ns = span_of(sent);
    view.first_token_ns = span_of(first);
    view.done_ns = span_of(done);
    view.outcome = span_of(outcome);
    view.phase = span_of(phase);
    view.prompt_tokens = span_of(prompt);
    view.ev_request = span_of(ev_req);
    view.ev_t_ns = span_of(ev_t);
    view.ev_tokens = span_of(ev_tok);
    if (usage) {
      if (out_tok.size() != n || source.size() != n) {
        throw py::value_error("request columns have different lengths");
      }
      view.output_tokens = span_of(out_tok);
      view.token_source = span_of(source);
    }
    // optional: the slot column (saved runs have it) gives the first wave
    if (requests.contains("slot")) {
      slot = column<std::int32_t>(requests, "requests", "slot");
      if (slot.size() != n) throw py::value_error("request columns have different lengths");
      view.slot = span_of(slot);
    }
  }
};

// One member of a row struct, named as the column it becomes (columns_of).
template <class Row, class T>
struct Field {
  const char* name;
  T Row::*member;
};
template <class Row, class T>
Field<Row, T> field(const char* name, T Row::*member) {
  return {name, member};
}

// A dict of 1-D arrays, one per field, aligned with `rows`: d[name][i] = rows[i].*member.
template <class Row, class... T>
py::dict columns_of(const std::vector<Row>& rows, Field<Row, T>... fields) {
  py::dict d;
  const auto n = static_cast<py::ssize_t>(rows.size());
  auto add = [&](auto f) {
    using V = std::remove_cvref_t<decltype(rows[0].*(f.member))>;
    py::array_t<V> a(n);
    auto m = a.template mutable_unchecked<1>();
    for (py::ssize_t i = 0; i < n; ++i) m(i) = rows[static_cast<std::size_t>(i)].*(f.member);
    d[f.name] = a;
  };
  (add(fields), ...);
  return d;
}

// A dict with one entry per field of `row`: d[name] = row.*member.
template <class Row, class... T>
py::dict dict_of(const Row& row, Field<Row, T>... fields) {
  py::dict d;
  ((d[fields.name] = row.*(fields.member)), ...);
  return d;
}

// f(view) over the records' columns, run without the GIL: safe, the view points into
// arrays `cols` holds and f touches nothing else. `cols` outlives the release, so its
// references are dropped with the GIL held.
template <class F>
auto over_records(const py::dict& requests, const py::dict& events, F&& f) {
  const Columns cols(requests, events);
  py::gil_scoped_release nogil;
  return f(cols.view);
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
  d["tbt_count"] = f.tbt_count;
  d["tbt_mean_ms"] = f.tbt_mean_ms;
  d["tbt_quantiles_ms"] = f.tbt_quantiles_ms;
  d["bin_tok_s"] = f.bin_tok_s;
  return d;
}

// The cell's figures, the precision stop and quantiles with their intervals.
void register_figures(py::module_& m) {
  m.attr("CONFIDENCE") = kConfidence;
  m.attr("Z_TWO_SIDED") = kZ975;
  m.def("t_quantile", &t975, py::arg("df"),
        "Two-sided quantile of Student's t at CONFIDENCE with df degrees of freedom (NaN for "
        "df < 1): the one every interval uses.");
  m.def(
      "summarize_cell",
      [](const py::dict& requests, const py::dict& events, ns_t t0_ns, ns_t t1_ns, double bin_s,
         ns_t steady_from_ns, ns_t ttft_from_ns, const std::vector<double>& tbt_qs) {
        if (!(t1_ns > t0_ns)) throw py::value_error("summarize_cell needs t1_ns > t0_ns");
        if (!(bin_s > 0)) throw py::value_error("summarize_cell needs bin_s > 0");
        for (double q : tbt_qs) {
          if (!(q >= 0 && q <= 1)) throw py::value_error("summarize_cell's tbt_qs lie in [0, 1]");
        }
        return figures_dict(over_records(requests, events, [&](const RecordView& v) {
          return summarize_cell(v, t0_ns, t1_ns, bin_s, steady_from_ns, ttft_from_ns, tbt_qs);
        }));
      },
      py::arg("requests"), py::arg("events"), py::arg("t0_ns"), py::arg("t1_ns"),
      py::arg("bin_s") = 1.0, py::arg("steady_from_ns") = -1, py::arg("ttft_from_ns") = -1,
      py::arg("tbt_qs") = std::vector<double>{},
      "Figures of a cell's window [t0_ns, t1_ns] from its raw records (the dicts of CellResult, "
      "or\n"
      "the same columns loaded from a saved run). TTFT counts requests sent from ttft_from_ns "
      "(-1: t0;\n"
      "pass the ramp's start). Intervals are [lo, hi]; NaN where undefined. tbt_qs: quantiles\n"
      "in [0, 1] of the TBT sample set, given in order as tbt_quantiles_ms (with tbt_count,\n"
      "tbt_mean_ms: the latency distribution's TBT figures).");
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
  m.def(
      "quantiles",
      [](const py::array_t<double, py::array::c_style | py::array::forcecast>& values,
         const std::vector<double>& qs) {
        if (values.ndim() != 1) throw py::value_error("quantiles needs a 1-dimensional array");
        std::vector<double> v(values.data(), values.data() + values.size());
        std::vector<QuantileEstimate> est;
        {
          py::gil_scoped_release nogil;
          est = quantiles(std::move(v), qs);
        }
        py::list out;
        for (const QuantileEstimate& e : est) out.append(py::make_tuple(e.value, e.lo, e.hi));
        return out;
      },
      py::arg("values"), py::arg("qs"),
      "[(value, lo, hi)] per q in [0, 1]: linear-interpolation quantiles of `values` (NaN\n"
      "dropped) with their distribution-free CONFIDENCE intervals from order statistics (NaN\n"
      "on a side whose rank falls outside the sample).");
}

// What the token arrivals of a cell's records add up to, per event, request or window.
void register_arrivals(py::module_& m) {
  m.def(
      "coalesced_share",
      [](const py::dict& requests, const py::dict& events, ns_t t0_ns, ns_t t1_ns) {
        const Columns cols(requests, events);
        return coalesced_share(cols.view, t0_ns, t1_ns);
      },
      py::arg("requests"), py::arg("events"), py::arg("t0_ns"), py::arg("t1_ns"),
      "Share of the window's token events that came with another in one delivery of their\n"
      "stream (a read, or reads within 1 ms of its first); NaN without token events.");
  m.def(
      "request_tokens",
      [](const py::dict& requests, const py::dict& events, ns_t t0_ns, ns_t t1_ns) {
        const std::vector<RequestTokens> rows = over_records(
            requests, events, [&](const RecordView& v) { return request_tokens(v, t0_ns, t1_ns); });
        return columns_of(rows, field("tokens", &RequestTokens::tokens),
                          field("window_tokens", &RequestTokens::window_tokens),
                          field("first_ns", &RequestTokens::first_ns),
                          field("last_ns", &RequestTokens::last_ns),
                          field("max_gap_ms", &RequestTokens::max_gap_ms));
      },
      py::arg("requests"), py::arg("events"), py::arg("t0_ns"), py::arg("t1_ns"),
      "Per request (aligned with the records, every phase), what its token arrivals add up to:\n"
      "{tokens, window_tokens (arrivals in [t0_ns, t1_ns]), first_ns, last_ns (-1 without\n"
      "one), max_gap_ms (the longest silence before an arrival; NaN without a gap)}. Streamed\n"
      "from the event columns in the transport's order: O(requests) memory.");
  m.def(
      "token_arrivals",
      [](const py::dict& requests, const py::dict& events, int phase) {
        const std::vector<Arrival> arrivals = over_records(
            requests, events, [&](const RecordView& v) { return token_arrivals(v, phase); });
        return columns_of(arrivals, field("request", &Arrival::request),
                          field("t_ns", &Arrival::t_ns), field("tokens", &Arrival::tokens),
                          field("gap_ms", &Arrival::gap_ms));
      },
      py::arg("requests"), py::arg("events"), py::arg("phase") = 1,
      "Token arrivals of a cell's records (the one derivation the figures use): events of one\n"
      "request's delivery (a read, or reads within 1 ms of its first) merged, usage-scaled, "
      "ordered by request then time, as arrays\n"
      "{request, t_ns, tokens, gap_ms} (gap_ms: ms per token since the request's previous\n"
      "arrival, NaN for its first). phase: requests of that phase (1 = window, 0 = warm-up),\n"
      "-1 = all.");
  m.def(
      "interference_figures",
      [](const std::vector<std::vector<ns_t>>& streams,
         const std::vector<std::pair<ns_t, ns_t>>& prefills, ns_t long_gap_ns) {
        std::vector<PrefillWindow> windows;
        for (const auto& [start_ns, end_ns] : prefills) windows.push_back({start_ns, end_ns});
        using IF = InterferenceFigures;
        return dict_of(interference_figures(streams, windows, long_gap_ns),
                       field("overlap_gaps", &IF::overlap_gaps),
                       field("clear_gaps", &IF::clear_gaps),
                       field("p99_tbt_overlap_ms", &IF::p99_tbt_overlap_ms),
                       field("p99_tbt_clear_ms", &IF::p99_tbt_clear_ms),
                       field("tbt_inflation", &IF::tbt_inflation),
                       field("gaps_over_long", &IF::gaps_over_long));
      },
      py::arg("streams"), py::arg("prefills"), py::arg("long_gap_ns") = 100'000'000,
      "The prefill-interference figures (stats_interference.hpp): streams = each decoder's\n"
      "token arrival ns, prefills = (start_ns, end_ns) of each interfering prompt.");
}

}  // namespace

void register_stats(py::module_& m) {
  register_figures(m);
  register_arrivals(m);
}

}  // namespace speedmatrix::bindings
