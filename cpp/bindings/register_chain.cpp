#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>

#include "register.hpp"
#include "speedmatrix/chain.hpp"

namespace py = pybind11;

namespace speedmatrix::bindings {

void register_chain(py::module_& m) {
  py::class_<FinishedTurn>(m, "FinishedTurn", "A session's turn that ended (chain.hpp).")
      .def_readonly("session", &FinishedTurn::session)
      .def_readonly("turn", &FinishedTurn::turn)
      .def_readonly("body", &FinishedTurn::body)
      .def_property_readonly("outcome",
                             [](const FinishedTurn& t) { return static_cast<int>(t.outcome); })
      .def_property_readonly("error_kind",
                             [](const FinishedTurn& t) { return to_str(t.error_kind); })
      .def_readonly("sent_ns", &FinishedTurn::sent_ns)
      .def_readonly("done_ns", &FinishedTurn::done_ns)
      .def_readonly("due_ns", &FinishedTurn::due_ns)
      .def_readonly("output", &FinishedTurn::output)
      .def("__repr__", [](const FinishedTurn& t) {
        return "<FinishedTurn session=" + std::to_string(t.session) +
               " turn=" + std::to_string(t.turn) +
               " outcome=" + std::to_string(static_cast<int>(t.outcome)) + ">";
      });

  py::class_<ChainFeed, std::shared_ptr<ChainFeed>>(
      m, "ChainFeed",
      "Free-running sessions' later turns, pushed while the cell runs (chain.hpp); set it as "
      "CellSpec.chain.")
      .def(py::init<std::int32_t, std::int32_t, double>(), py::arg("sessions"), py::arg("turns"),
           py::arg("think_time_s") = 0.0)
      .def_property_readonly("sessions", &ChainFeed::sessions)
      .def_property_readonly("turns", &ChainFeed::turns)
      .def(
          "next_finished",
          [](ChainFeed& c, double timeout_s) -> py::object {
            FinishedTurn t;
            bool got = false;
            {
              // Safe without the GIL: only the feed's own state (under its mutex) is read.
              // The cell's loop hands turns over meanwhile; other Python threads run.
              py::gil_scoped_release nogil;
              got = c.next_finished(&t, timeout_s);
            }
            if (!got) return py::none();
            return py::cast(std::move(t));
          },
          py::arg("timeout_s"),
          "The next finished turn, or None after timeout_s or once closed and drained.")
      .def(
          "push",
          [](ChainFeed& c, std::int32_t session, const py::bytes& body) {
            std::string text = body;  // copied with the GIL held
            py::gil_scoped_release nogil;
            return c.push(session, std::move(text));
          },
          py::arg("session"), py::arg("body"),
          "The body of the session's next turn; False (dropped) when it waits for none.")
      .def("end_session", &ChainFeed::end_session, py::arg("session"),
           py::call_guard<py::gil_scoped_release>(), "The session sends no more turns.")
      .def_property_readonly("closed", &ChainFeed::closed)
      .def("close", &ChainFeed::close, py::call_guard<py::gil_scoped_release>())
      .def("ready_ns", &ChainFeed::ready_ns,
           "body_ready_ns by body index (turn x sessions + session); -1 where never pushed.");
}

}  // namespace speedmatrix::bindings
