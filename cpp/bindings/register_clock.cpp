#include "register.hpp"
#include "speedmatrix/clock.hpp"

namespace speedmatrix::bindings {

void register_clock(pybind11::module_& m) {
  m.def("now_ns", &now_ns,
        "CLOCK_MONOTONIC in ns: the clock of every record (and of the built-in engine's stamps).");
}

}  // namespace speedmatrix::bindings
