// The areas of speedmatrix._core; each is defined in its own register_<area>.cpp.
#pragma once

#include <pybind11/pybind11.h>

#include <string_view>

namespace speedmatrix::bindings {

void register_clock(pybind11::module_& m);
void register_prom(pybind11::module_& m);
void register_stats(pybind11::module_& m);
void register_chain(pybind11::module_& m);
void register_cell(pybind11::module_& m);

// Text from the network may not be valid UTF-8: decode with replacement
// instead of raising.
inline pybind11::str to_str(std::string_view s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::str>(o);
}

}  // namespace speedmatrix::bindings
