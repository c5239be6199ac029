// NB_MODULE (nanobind's own macro, not OB_MODULE): its m.def functions are recorded whole by runtime.jit;
// a class's method is not, so a trace that meets it runs eagerly. tests/test_jit_raw_modules.py.
#include <nanobind/nanobind.h>

#include "jit_raw_bound.h"

namespace nb = nanobind;

// a def() on a plain nanobind::module_ (the module handed to a helper by its base type): not recorded whole
static void BindPlain(nb::module_ &m) { m.def("post_plain", &raw_ops::Post); }

NB_MODULE(OB_EXTENSION_NAME, m) {
  m.def("post", &raw_ops::Post);
  BindPlain(m);
  nb::class_<raw_ops::Poster>(m, "Poster").def(nb::init<>()).def("post", &raw_ops::Poster::post)
      .def("pick", &raw_ops::Poster::pick);
}
