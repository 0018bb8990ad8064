// speedmatrix._core: wiring only. Each area registers its own bindings.
#include <pybind11/pybind11.h>

#include "register.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "speedmatrix compiled core: streaming client, parsers, statistics";
  // CMake passes pyproject.toml's version (the one source).
  m.attr("version") = SPEEDMATRIX_VERSION;
  speedmatrix::bindings::register_clock(m);
  speedmatrix::bindings::register_prom(m);
  speedmatrix::bindings::register_stats(m);
  speedmatrix::bindings::register_chain(m);
  speedmatrix::bindings::register_cell(m);
}
