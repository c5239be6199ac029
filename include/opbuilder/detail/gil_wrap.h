// In an operator module, a GIL release inside an XLA FFI run does nothing, and a GIL check takes it.
//
// to_jax's XLA FFI route runs a module function on XLA's thread, without the GIL and without a Python
// thread state (detail/ffi_bound.h, whose FfiBoundScope counts GilFreeRun()). A body, Forward or
// Backward that releases the GIL around a long kernel (nanobind's or pybind11's gil_scoped_release,
// Py_BEGIN_ALLOW_THREADS) calls PyEval_SaveThread there, which CPython answers with a fatal error, and
// pybind11's release first asserts PyGILState_Check(): the process aborted.
//
// The builder links each module with `--wrap` for PyEval_SaveThread, PyEval_RestoreThread and
// PyGILState_Check (builder.py's _GIL_WRAP), so the module's own calls reach the functions below. While
// this thread runs a function for XLA and does not hold the GIL:
// - a release returns null (there is nothing to release) and the restore of null returns;
// - a check takes the GIL (PyGILState_Ensure) and says "held", which is then true: pybind11's release
//   that follows releases it for real, and code that asked in order to touch Python may (the idiom
//   `if (!PyGILState_Check()) { acquire }`). The outermost run gives it back when it ends.
// Anywhere else they are CPython's.
//
// The builder's generated opbuilder_name.h includes this header in every C++ source of a module (never
// a precompiled header), so the definitions exist once per module (weak, hidden: private to it). The
// __real_ names are weak, so a module linked without --wrap (built outside the builder) still loads;
// it then calls CPython's functions directly, never these. PyGILState_Check is outside the limited
// API; every CPython since 3.4 exports it. Not for operator authors.
#pragma once

#include "opbuilder/detail/gil_free_run.h"  // (which includes nothing)

#if defined(__GNUC__) || defined(__clang__)
extern "C" {
struct _ts;  // PyThreadState. No <Python.h> here, nor any header: see gil_free_run.h
__attribute__((weak)) int __real_PyGILState_Check(void);
__attribute__((weak)) struct _ts *__real_PyEval_SaveThread(void);
__attribute__((weak)) void __real_PyEval_RestoreThread(struct _ts *);
// PyGILState_Ensure under a name of its own (its PyGILState_STATE is an int-sized enum), so that
// <Python.h>'s declaration, later in the source, does not clash
__attribute__((visibility("default"))) int ob_detail_gil_ensure(void) __asm__("PyGILState_Ensure");

__attribute__((weak, visibility("hidden"))) int __wrap_PyGILState_Check(void) {
  if (__real_PyGILState_Check() != 0) return 1;
  opbuilder::detail::GilFreeRunState &run = opbuilder::detail::GilFreeRun();
  if (run.depth == 0 || run.taken) return 0;  // (taken, and released since: the truth)
  run.gil = ob_detail_gil_ensure();  // an FFI run asks: held from now to the run's end
  run.taken = true;
  return 1;
}

__attribute__((weak, visibility("hidden"))) struct _ts *__wrap_PyEval_SaveThread(void) {
  if (opbuilder::detail::GilFreeRun().depth != 0 && __real_PyGILState_Check() == 0) return nullptr;  // not held
  return __real_PyEval_SaveThread();
}

__attribute__((weak, visibility("hidden"))) void __wrap_PyEval_RestoreThread(struct _ts *state) {
  if (state == nullptr && opbuilder::detail::GilFreeRun().depth != 0) return;  // the release above did nothing
  __real_PyEval_RestoreThread(state);
}
}
#endif
