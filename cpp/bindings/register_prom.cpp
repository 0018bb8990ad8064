#include <pybind11/stl.h>

#include <string>

#include "register.hpp"
#include "speedmatrix/prom.hpp"

namespace py = pybind11;

namespace speedmatrix::bindings {

void register_prom(py::module_& m) {
  m.def(
      "parse_prometheus",
      [](std::string_view text, bool strict) {
        int bad = 0;
        const std::vector<PromSample> samples = parse_prometheus(text, &bad);
        if (strict && bad > 0) {
          throw py::value_error(std::to_string(bad) + " line(s) are not Prometheus text");
        }
        py::list out;
        for (const PromSample& s : samples) {
          py::dict labels;
          for (const auto& [k, v] : s.labels) labels[to_str(k)] = to_str(v);
          out.append(py::make_tuple(to_str(s.name), labels, s.value));
        }
        return out;
      },
      py::arg("text"), py::arg("strict") = false,
      "Parses a Prometheus text page: [(name, {label: value}, value)]; malformed lines are "
      "skipped,\nor with strict=True raise ValueError (a page that is not Prometheus text).");
  m.def(
      "reduce_prometheus",
      [](std::string_view text, const std::vector<std::string>& names,
         const std::vector<std::string>& how) {
        std::vector<Reduce> reduce;
        reduce.reserve(how.size());
        for (const std::string& h : how) reduce.push_back(h == "max" ? Reduce::kMax : Reduce::kSum);
        return reduce_by_name(parse_prometheus(text), names, reduce);
      },
      py::arg("text"), py::arg("names"), py::arg("how") = std::vector<std::string>{},
      "One value per name from a Prometheus text page, reduced over its label sets as the "
      "cell's\nsampler does (\"sum\" or \"max\" per name; NaN for a name without a number).");
}

}  // namespace speedmatrix::bindings
