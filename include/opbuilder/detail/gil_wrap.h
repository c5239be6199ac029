// In an operator module, a GIL release inside an XLA FFI run does nothing.
//
// to_jax's XLA FFI route runs a module function on XLA's thread, without the GIL and without a Python
// thread state (detail/ffi_bound.h, whose FfiBoundScope counts GilFreeRun()). A body, Forward or
// Backward that releases the GIL around a long kernel (nanobind's or pybind11's gil_scoped_release,
// Py_BEGIN_ALLOW_THREADS) calls PyEval_SaveThread there, which CPython answers with a fatal error, and
// pybind11's release first asserts PyGILState_Check(): the process aborts.
//
// The builder links each module with `--wrap` for PyEval_SaveThread, PyEval_RestoreThread and
// PyGILState_Check (builder.py's _GIL_WRAP), so the module's own calls reach the functions below. While
// this thread runs a function for XLA and does not hold the GIL, there is nothing to release: the
// release returns null, the restore of null returns, and the check says "held", which is what the code
// between them may assume (it may not touch Python objects on either route). Anywhere else they are
// CPython's. A body that takes the GIL (gil_scoped_acquire) inside such a run gets real ones.
//
// The builder's generated opbuilder_name.h includes this header in every C++ source of a module (never
// a precompiled header), so the definitions exist once per module (weak, hidden: private to it). The
// __real_ names are weak, so a module linked without --wrap (built outside the builder) still loads;
// it then calls CPython's functions directly, never these. PyGILState_Check is outside the limited
// API; every CPython since 3.4 exports it. Not for operator authors.
#pragma once

#include "opbuilder/detail/gil_free_run.h"

#if defined(__GNUC__) || defined(__clang__)
extern "C" {
struct _ts;  // PyThreadState
__attribute__((weak)) int __real_PyGILState_Check(void);
__attribute__((weak)) struct _ts *__real_PyEval_SaveThread(void);
__attribute__((weak)) void __real_PyEval_RestoreThread(struct _ts *);

__attribute__((weak, visibility("hidden"))) int __wrap_PyGILState_Check(void) {
  return __real_PyGILState_Check() != 0 || opbuilder::detail::GilFreeRun() != 0;
}

__attribute__((weak, visibility("hidden"))) struct _ts *__wrap_PyEval_SaveThread(void) {
  if (opbuilder::detail::GilFreeRun() != 0 && __real_PyGILState_Check() == 0) return nullptr;  // not held
  return __real_PyEval_SaveThread();
}

__attribute__((weak, visibility("hidden"))) void __wrap_PyEval_RestoreThread(struct _ts *state) {
  if (state == nullptr && opbuilder::detail::GilFreeRun() != 0) return;  // the release above did nothing
  __real_PyEval_RestoreThread(state);
}
}
#endif
