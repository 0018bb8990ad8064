// speedmatrix._core: wiring only. Each area registers its own bindings.
#include <pybind11/pybind11.h>

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "speedmatrix compiled core: streaming client, parsers, statistics";
  m.attr("version") = "0.1.0";
}
