// Whether this thread runs a module function for XLA without the GIL, and whether the run took the GIL
// since (detail/gil_wrap.h says why it matters). Not for operator authors.
//
// It includes nothing: gil_wrap.h, which the builder force-includes ahead of a source's own lines,
// includes it, and a source may set the C++ library's configuration (`#define _GLIBCXX_DEBUG`,
// `_GLIBCXX_USE_CXX11_ABI`, `#pragma pack`) before its first include.
#pragma once

namespace opbuilder {
namespace detail __attribute__((visibility("hidden"))) {

struct GilFreeRunState {
  int depth = 0;       // how many XLA FFI runs of a module function this thread is inside (FfiBoundScope)
  bool taken = false;  // a GIL check in the run took the GIL (PyGILState_Ensure); the outermost run gives it back
  int gil = 0;         // what that PyGILState_Ensure returned (a PyGILState_STATE)
};

// This thread's state. Hidden, so each module keeps its own.
inline GilFreeRunState &GilFreeRun() {
  static thread_local GilFreeRunState state;
  return state;
}

}  // namespace detail
}  // namespace opbuilder
