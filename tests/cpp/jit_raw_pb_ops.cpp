// PYBIND11_MODULE built with pybind11 (a module with a class stays on pybind11): with pybind11 >= 3 its
// m.def functions are recorded whole by runtime.jit; a class's method is not, so a trace that meets it
// runs eagerly. tests/test_jit_raw_modules.py.
#include "jit_raw_bound.h"

namespace py = pybind11;

static void BindPlain(py::module_ &m) { m.def("post_plain", &raw_ops::Post); }

PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  m.def("post", &raw_ops::Post);
  BindPlain(m);
  py::class_<raw_ops::Poster>(m, "Poster").def(py::init<>()).def("post", &raw_ops::Poster::post)
      .def("pick", &raw_ops::Poster::pick);
}
