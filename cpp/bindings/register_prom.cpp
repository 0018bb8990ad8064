#include <pybind11/stl.h>

#include "register.hpp"
#include "speedmatrix/prom.hpp"

namespace py = pybind11;

namespace speedmatrix::bindings {

void register_prom(py::module_& m) {
  m.def(
      "parse_prometheus",
      [](std::string_view text) {
        const std::vector<PromSample> samples = parse_prometheus(text);
        py::list out;
        for (const PromSample& s : samples) {
          py::dict labels;
          for (const auto& [k, v] : s.labels) labels[to_str(k)] = to_str(v);
          out.append(py::make_tuple(to_str(s.name), labels, s.value));
        }
        return out;
      },
      py::arg("text"),
      "Parses a Prometheus text page: [(name, {label: value}, value)]; malformed lines are "
      "skipped.");
}

}  // namespace speedmatrix::bindings
