#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "register.hpp"
#include "speedmatrix/cell.hpp"
#include "speedmatrix/pacer.hpp"

namespace py = pybind11;

namespace speedmatrix::bindings {
namespace {

// CellResult as Python sees it: scalars plus dicts of numpy arrays, built
// once when run() returns.
struct PyCellResult {
  ns_t warmup_start_ns = kNever, ramp_start_ns = kNever, window_start_ns = kNever,
       window_end_ns = kNever, end_ns = kNever;
  double client_cpu_s = 0, loop_lag_max_ms = 0;
  std::int32_t client_threads = 1;
  bool stopped = false, ramp_capped = false;
  std::string stopped_by;
  std::int64_t stalls = 0;
  std::int32_t warmup_retried = 0;
  std::int64_t backoffs = 0;
  double backoff_s = 0;
  std::string stop_reason;
  std::string fatal_error;
  std::string events_note;           // why the token events were held in memory, else ""
  std::string requests_note;         // why the request records were held in memory, else ""
  std::size_t requests_spilled = 0;  // request records that went to the spill files
  py::dict requests, events, metrics;
  py::list outputs;  // RequestOutput per request (CellSpec.keep_output), else empty
};

// Hands a vector's buffer to numpy without copying: the array owns it.
template <class T>
py::array_t<T> adopt(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(heap->size())},
                        {static_cast<py::ssize_t>(sizeof(T))}, heap->data(), owner);
}

// Hands a plain event column to numpy without copying: the array owns it (a vector, or a
// mapping of a spill file that is unmapped when the array goes).
template <class T>
py::array_t<T> adopt(PlainColumn<T>&& c) {
  auto* heap = new PlainColumn<T>(std::move(c));
  py::capsule owner(heap, [](void* p) { delete static_cast<PlainColumn<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(heap->size())},
                        {static_cast<py::ssize_t>(sizeof(T))}, heap->data(), owner);
}

// The request records as columns, in one pass (spilled records are read back in blocks).
void request_columns(const RequestLog& q, py::dict& d) {
  const std::size_t n = q.size();
  const auto len = static_cast<py::ssize_t>(n);
  py::array_t<std::int32_t> slot(len), body(len), http_status(len), retries(len),
      reasoning_deltas(len);
  py::array_t<std::uint8_t> phase(len), token_source(len), outcome(len);
  py::array_t<std::int64_t> scheduled(len), sent(len), first_byte(len), first_token(len),
      first_content(len), done(len), prompt(len), output(len), reasoning(len), cached(len);
  py::list finish(n), kind(n), message(n);
  auto* p_slot = slot.mutable_data();
  auto* p_body = body.mutable_data();
  auto* p_status = http_status.mutable_data();
  auto* p_retries = retries.mutable_data();
  auto* p_reasoning_deltas = reasoning_deltas.mutable_data();
  auto* p_phase = phase.mutable_data();
  auto* p_source = token_source.mutable_data();
  auto* p_outcome = outcome.mutable_data();
  auto* p_scheduled = scheduled.mutable_data();
  auto* p_sent = sent.mutable_data();
  auto* p_first_byte = first_byte.mutable_data();
  auto* p_first_token = first_token.mutable_data();
  auto* p_first_content = first_content.mutable_data();
  auto* p_done = done.mutable_data();
  auto* p_prompt = prompt.mutable_data();
  auto* p_output = output.mutable_data();
  auto* p_reasoning = reasoning.mutable_data();
  auto* p_cached = cached.mutable_data();
  q.for_each(0, n, [&](std::size_t i, const RequestRecord& x) {
    p_slot[i] = x.slot;
    p_body[i] = x.body;
    p_status[i] = x.http_status;
    p_retries[i] = x.retries;
    p_reasoning_deltas[i] = x.reasoning_deltas;
    p_phase[i] = static_cast<std::uint8_t>(x.phase);
    p_source[i] = static_cast<std::uint8_t>(x.token_source);
    p_outcome[i] = static_cast<std::uint8_t>(x.outcome);
    p_scheduled[i] = x.scheduled_ns;
    p_sent[i] = x.sent_ns;
    p_first_byte[i] = x.first_byte_ns;
    p_first_token[i] = x.first_token_ns;
    p_first_content[i] = x.first_content_ns;
    p_done[i] = x.done_ns;
    p_prompt[i] = x.prompt_tokens;
    p_output[i] = x.output_tokens;
    p_reasoning[i] = x.reasoning_tokens;
    p_cached[i] = x.cached_tokens;
    finish[i] = to_str(x.finish_reason);
    kind[i] = to_str(x.error_kind);
    message[i] = to_str(x.error_message);
  });
  d["slot"] = slot;
  d["body"] = body;
  d["phase"] = phase;
  d["scheduled_ns"] = scheduled;
  d["sent_ns"] = sent;
  d["first_byte_ns"] = first_byte;
  d["first_token_ns"] = first_token;
  d["first_content_ns"] = first_content;
  d["done_ns"] = done;
  d["http_status"] = http_status;
  d["prompt_tokens"] = prompt;
  d["output_tokens"] = output;
  d["reasoning_tokens"] = reasoning;
  d["cached_tokens"] = cached;
  d["reasoning_deltas"] = reasoning_deltas;
  d["token_source"] = token_source;
  d["outcome"] = outcome;
  d["finish_reason"] = finish;
  d["error_kind"] = kind;
  d["error_message"] = message;
  d["retries"] = retries;
}

PyCellResult to_python(CellResult&& r) {
  PyCellResult out;
  out.warmup_start_ns = r.warmup_start_ns;
  out.ramp_start_ns = r.ramp_start_ns;
  out.ramp_capped = r.ramp_capped;
  out.stopped_by = r.stopped_by;
  out.stalls = r.stalls;
  out.warmup_retried = r.warmup_retried;
  out.backoffs = r.backoffs;
  out.backoff_s = r.backoff_s;
  out.stop_reason = r.stop_reason;
  out.window_start_ns = r.window_start_ns;
  out.window_end_ns = r.window_end_ns;
  out.end_ns = r.end_ns;
  out.client_cpu_s = r.client_cpu_s;
  out.client_threads = r.client_threads;
  out.loop_lag_max_ms = r.loop_lag_max_ms;
  out.stopped = r.stopped;
  out.fatal_error = r.fatal_error;

  request_columns(r.requests, out.requests);
  for (RequestOutput& o : r.outputs) out.outputs.append(py::cast(std::move(o)));
  out.requests_note = r.requests.note();
  out.requests_spilled = r.requests.spilled();

  // A cell that spilled its events gets arrays over the spill files (records.hpp).
  EventColumns::Plain e = r.events.take_plain();
  out.events_note = r.events.note();
  out.events["request"] = adopt(std::move(e.request));
  out.events["t_ns"] = adopt(std::move(e.t_ns));
  out.events["tokens"] = adopt(std::move(e.tokens));
  out.events["server_ns"] = adopt(std::move(e.server_ns));

  MetricSamples& ms = r.metrics;
  py::list names;
  for (const std::string& n : ms.names) names.append(to_str(n));
  const auto rows = static_cast<py::ssize_t>(ms.t_ns.size());
  const auto cols = static_cast<py::ssize_t>(ms.names.size());
  py::array_t<double> values({rows, cols});
  if (rows * cols > 0)
    std::copy(ms.values.begin(), ms.values.begin() + rows * cols, values.mutable_data());
  out.metrics["names"] = names;
  out.metrics["t_ns"] = adopt(std::move(ms.t_ns));
  out.metrics["values"] = values;
  out.metrics["failures"] = ms.failures;
  return out;
}

std::vector<std::string> bodies_from(const py::iterable& items) {
  std::vector<std::string> out;
  for (py::handle h : items) {
    if (py::isinstance<py::bytes>(h)) {
      out.emplace_back(h.cast<std::string>());
    } else if (py::isinstance<py::str>(h)) {
      out.emplace_back(h.cast<std::string>());   // UTF-8
    } else if (PyObject_CheckBuffer(h.ptr())) {  // bytearray, memoryview, numpy bytes
      const py::buffer_info info = py::reinterpret_borrow<py::buffer>(h).request();
      out.emplace_back(static_cast<const char*>(info.ptr),
                       static_cast<std::size_t>(info.size * info.itemsize));
    } else {
      throw py::type_error("request bodies must be bytes or str");
    }
  }
  return out;
}

py::list bodies_to(const std::vector<std::string>& bodies) {
  py::list l;
  for (const std::string& b : bodies) l.append(py::bytes(b));
  return l;
}

// The HttpOptions fields, held in CellSpec::http, read and written under their own names.
void def_http_fields(py::class_<CellSpec>& spec) {
  spec.def_property(
          "url", [](const CellSpec& s) { return s.http.url; },
          [](CellSpec& s, std::string v) { s.http.url = std::move(v); })
      .def_property(
          "headers", [](const CellSpec& s) { return s.http.headers; },
          [](CellSpec& s, std::vector<std::string> v) { s.http.headers = std::move(v); })
      // The key goes in, never out: reading it back gives "***" (or "" when
      // unset), so a spec printed or logged from Python cannot leak it.
      .def_property(
          "api_key",
          [](const CellSpec& s) { return std::string(s.http.api_key.empty() ? "" : "***"); },
          [](CellSpec& s, std::string v) { s.http.api_key = std::move(v); })
      .def_property(
          "api", [](const CellSpec& s) { return s.http.api; },
          [](CellSpec& s, ApiKind v) { s.http.api = v; })
      .def_property(
          "connect_timeout_s", [](const CellSpec& s) { return s.http.connect_timeout_s; },
          [](CellSpec& s, double v) { s.http.connect_timeout_s = v; })
      .def_property(
          "idle_timeout_s", [](const CellSpec& s) { return s.http.idle_timeout_s; },
          [](CellSpec& s, double v) { s.http.idle_timeout_s = v; })
      .def_property(
          "tls_verify", [](const CellSpec& s) { return s.http.tls_verify; },
          [](CellSpec& s, bool v) { s.http.tls_verify = v; })
      .def_property(
          "ca_file", [](const CellSpec& s) { return s.http.ca_file; },
          [](CellSpec& s, std::string v) { s.http.ca_file = std::move(v); })
      .def_property(
          "max_event_bytes", [](const CellSpec& s) { return s.http.max_event_bytes; },
          [](CellSpec& s, std::size_t v) { s.http.max_event_bytes = v; })
      .def_property(
          "record_events", [](const CellSpec& s) { return s.http.record_events; },
          [](CellSpec& s, bool v) { s.http.record_events = v; })
      .def_property(
          "server_stamps", [](const CellSpec& s) { return s.http.server_stamps; },
          [](CellSpec& s, bool v) { s.http.server_stamps = v; });
}

// CellRunner.progress(): the live counters and the latest /metrics sample.
py::dict progress_dict(const CellRunner& runner) {
  const CellProgress& p = runner.progress();
  py::dict d;
  d["tokens"] = p.tokens.load(std::memory_order_relaxed);
  d["completed"] = p.completed.load(std::memory_order_relaxed);
  d["errors"] = p.errors.load(std::memory_order_relaxed);
  d["in_flight"] = p.in_flight.load(std::memory_order_relaxed);
  d["first_tokens"] = p.first_tokens.load(std::memory_order_relaxed);
  d["window_start_ns"] = p.window_start_ns.load(std::memory_order_relaxed);
  d["warmup_total"] = p.warmup_total.load(std::memory_order_relaxed);
  d["warmup_done"] = p.warmup_done.load(std::memory_order_relaxed);
  // The sampler's latest sample by metric name (None: absent from that
  // scrape); empty when the cell samples no /metrics or none came yet.
  const CellProgress::Metrics m = p.metrics();
  py::dict latest;
  for (std::size_t i = 0; i < m.names.size() && i < m.values.size(); ++i) {
    if (std::isnan(m.values[i]))
      latest[py::str(m.names[i])] = py::none();
    else
      latest[py::str(m.names[i])] = m.values[i];
  }
  d["metrics"] = latest;
  d["metrics_t_ns"] = m.t_ns;
  d["metrics_samples"] = m.samples;
  d["metrics_failures"] = m.failures;
  return d;
}

void register_cell_spec(py::module_& m) {
  py::enum_<ApiKind>(m, "ApiKind")
      .value("completions", ApiKind::kCompletions)
      .value("chat", ApiKind::kChat);

  py::class_<CellSpec> spec(m, "CellSpec",
                            "What one cell sends, to where, for how long (see cell.hpp).");
  spec.def(py::init<>());
  def_http_fields(spec);
  spec.def_property(
          "warmup_bodies", [](const CellSpec& s) { return bodies_to(s.warmup_bodies); },
          [](CellSpec& s, const py::iterable& v) { s.warmup_bodies = bodies_from(v); })
      .def_readwrite("warmup_timeout_s", &CellSpec::warmup_timeout_s)
      .def_readwrite("warmup_retries", &CellSpec::warmup_retries)
      .def_property(
          "bodies", [](const CellSpec& s) { return bodies_to(s.bodies); },
          [](CellSpec& s, const py::iterable& v) { s.bodies = bodies_from(v); })
      .def_readwrite("concurrency", &CellSpec::concurrency)
      .def_readwrite("duration_s", &CellSpec::duration_s)
      .def_readwrite("max_requests", &CellSpec::max_requests)
      .def_readwrite("mode", &CellSpec::mode)
      .def_readwrite("rate_per_s", &CellSpec::rate_per_s)
      .def_readwrite("arrival", &CellSpec::arrival)
      .def_readwrite("gamma_shape", &CellSpec::gamma_shape)
      .def_readwrite("schedule_ns", &CellSpec::schedule_ns)
      .def_readwrite("max_concurrency", &CellSpec::max_concurrency)
      .def_readwrite("seed", &CellSpec::seed)
      .def_readwrite("drain_timeout_s", &CellSpec::drain_timeout_s)
      .def_readwrite("steady_window", &CellSpec::steady_window)
      .def_readwrite("ramp_cap_s", &CellSpec::ramp_cap_s)
      .def_readwrite("plateau_settle_s", &CellSpec::plateau_settle_s)
      .def_readwrite("stall_min_s", &CellSpec::stall_min_s)
      .def_readwrite("unreachable_after_s", &CellSpec::unreachable_after_s)
      .def_readwrite("stall_gap_factor", &CellSpec::stall_gap_factor)
      .def_readwrite("stall_pause_cap_s", &CellSpec::stall_pause_cap_s,
                     "a silence every stream shares is spared this long (0: cut it)")
      .def_readwrite("precision", &CellSpec::precision)
      .def_readwrite("min_duration_s", &CellSpec::min_duration_s)
      .def_readwrite("precision_check_s", &CellSpec::precision_check_s)
      .def_readwrite("metrics_url", &CellSpec::metrics_url)
      .def_readwrite("metrics_interval_s", &CellSpec::metrics_interval_s)
      .def_readwrite("metric_names", &CellSpec::metric_names)
      .def_readwrite("metric_reduce", &CellSpec::metric_reduce)
      .def_readwrite("spill_events", &CellSpec::spill_events)
      .def_readwrite("spill_requests", &CellSpec::spill_requests)
      .def_readwrite("spill_dir", &CellSpec::spill_dir)
      .def_readwrite("keep_output", &CellSpec::keep_output,
                     "Keep each request's delivered text and token ids (CellResult.outputs).")
      .def_readwrite("keep_output_max_bytes", &CellSpec::keep_output_max_bytes,
                     "Cap per request of the kept output: text bytes + 4 a token id.")
      .def_readwrite("chain", &CellSpec::chain,
                     "free-running sessions: a ChainFeed their later turns are pushed into")
      .def_readwrite("client_threads", &CellSpec::client_threads,
                     "event loops: N > 1 on their own threads, 1 one loop, 0 auto (loops.hpp)")
      .def("__repr__", [](const CellSpec& s) {
        return "<CellSpec url=" + s.http.url + " concurrency=" + std::to_string(s.concurrency) +
               " bodies=" + std::to_string(s.bodies.size()) +
               " warmup=" + std::to_string(s.warmup_bodies.size()) +
               " duration_s=" + std::to_string(s.duration_s) +
               (s.precision > 0 ? " precision=" + std::to_string(s.precision) : "") +
               (s.http.api_key.empty() ? "" : " api_key=***") + ">";
      });
}

void register_cell_runner(py::module_& m) {
  py::class_<RequestOutput>(m, "RequestOutput",
                            "What one request's stream delivered (CellSpec.keep_output).")
      .def_property_readonly(
          "text",
          [](const RequestOutput& o) {
            // a hostile (or cut) stream may not be valid UTF-8: replaced, never an exception
            return py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(
                o.text.data(), static_cast<py::ssize_t>(o.text.size()), "replace"));
          })
      .def_property_readonly("token_ids",
                             [](const RequestOutput& o) -> py::object {
                               if (!o.ids_streamed) return py::none();
                               return py::cast(o.token_ids);
                             })
      .def_readonly("truncated", &RequestOutput::truncated)
      .def("__repr__", [](const RequestOutput& o) {
        return "<RequestOutput text_bytes=" + std::to_string(o.text.size()) +
               " token_ids=" + (o.ids_streamed ? std::to_string(o.token_ids.size()) : "None") +
               (o.truncated ? " truncated" : "") + ">";
      });
  py::class_<PyCellResult>(m, "CellResult", "Raw records and timings of one cell.")
      .def_readonly("warmup_start_ns", &PyCellResult::warmup_start_ns)
      .def_readonly("ramp_start_ns", &PyCellResult::ramp_start_ns)
      .def_readonly("window_start_ns", &PyCellResult::window_start_ns)
      .def_readonly("ramp_capped", &PyCellResult::ramp_capped)
      .def_readonly("stopped_by", &PyCellResult::stopped_by)
      .def_readonly("stalls", &PyCellResult::stalls)
      .def_readonly("warmup_retried", &PyCellResult::warmup_retried)
      .def_readonly("backoffs", &PyCellResult::backoffs)
      .def_readonly("backoff_s", &PyCellResult::backoff_s)
      .def_readonly("stop_reason", &PyCellResult::stop_reason)
      .def_readonly("window_end_ns", &PyCellResult::window_end_ns)
      .def_readonly("end_ns", &PyCellResult::end_ns)
      .def_readonly("client_cpu_s", &PyCellResult::client_cpu_s)
      .def_readonly("client_threads", &PyCellResult::client_threads)
      .def_readonly("loop_lag_max_ms", &PyCellResult::loop_lag_max_ms)
      .def_readonly("stopped", &PyCellResult::stopped)
      .def_readonly("fatal_error", &PyCellResult::fatal_error)
      .def_readonly("events_note", &PyCellResult::events_note)
      .def_readonly("requests_note", &PyCellResult::requests_note)
      .def_readonly("requests_spilled", &PyCellResult::requests_spilled)
      .def_readonly("requests", &PyCellResult::requests)
      .def_readonly("events", &PyCellResult::events)
      .def_readonly("metrics", &PyCellResult::metrics)
      .def_readonly("outputs", &PyCellResult::outputs)
      .def("__repr__", [](const PyCellResult& r) {
        return "<CellResult requests=" + std::to_string(py::len(r.requests["slot"])) +
               " events=" + std::to_string(py::len(r.events["t_ns"])) +
               (r.fatal_error.empty() ? "" : " fatal_error=" + r.fatal_error) + ">";
      });

  py::class_<CellRunner>(m, "CellRunner",
                         "Runs one cell; run() once, stop()/progress() from any thread.")
      .def(py::init<CellSpec>(), py::arg("spec"))
      .def(
          "run",
          [](CellRunner& runner) {
            CellResult r;
            {
              // Safe without the GIL: the runner copied its CellSpec at
              // construction and run() touches only C++ state it owns (no
              // Python object is read or written until the GIL is back).
              // `runner` stays alive: this call's `self` holds a reference.
              // Releasing it lets other threads (progress displays, stop()
              // on Ctrl-C) run for the whole cell.
              py::gil_scoped_release nogil;
              r = runner.run();
            }
            return to_python(std::move(r));
          },
          "Runs warm-up and window on this thread with the GIL released; returns a CellResult.")
      .def("stop", &CellRunner::stop, py::call_guard<py::gil_scoped_release>(),
           "Ends the cell early from another thread; in-flight requests are cancelled, records "
           "kept.")
      .def("progress", &progress_dict);
}

}  // namespace

// The arrivals an open-loop cell's pacer makes in [0, duration_s): what a cell of that
// arrival law, rate, shape and seed sends (the shards deal this one schedule).
std::vector<ns_t> arrival_offsets(const std::string& arrival, double rate_per_s, double shape,
                                  std::uint64_t seed, double duration_s) {
  std::string why;
  const std::unique_ptr<Pacer> pacer = make_pacer(arrival, rate_per_s, shape, seed, &why);
  if (!pacer) throw py::value_error(why);
  const auto end = static_cast<ns_t>(duration_s * 1e9);
  std::vector<ns_t> out;
  for (std::int64_t k = 0;; ++k) {
    const ns_t due = pacer->due_ns(k);
    if (due == kNever || due >= end) break;
    out.push_back(due);
  }
  return out;
}

void register_cell(py::module_& m) {
  register_cell_spec(m);
  register_cell_runner(m);
  m.def("arrival_offsets_ns", &arrival_offsets, py::arg("arrival"), py::arg("rate_per_s"),
        py::arg("gamma_shape"), py::arg("seed"), py::arg("duration_s"),
        "An open-loop cell's arrival times (ns from its window's start) in [0, duration_s), "
        "from the same pacer the cell runs.");
}

}  // namespace speedmatrix::bindings
