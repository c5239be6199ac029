// Whether this thread runs a module function for XLA without the GIL (detail/gil_wrap.h says why it
// matters). Not for operator authors.
#pragma once

#include "opbuilder/detail/visibility.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// How many XLA FFI runs of a module function this thread is inside (ffi_bound.h's FfiBoundScope).
// Hidden, so each module counts its own.
inline int &GilFreeRun() {
  static thread_local int depth = 0;
  return depth;
}

}  // namespace detail
}  // namespace opbuilder
