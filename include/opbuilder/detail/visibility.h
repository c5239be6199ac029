// OB_HIDDEN marks types that hold pybind11 objects with hidden visibility, as
// pybind11's own namespace is; otherwise GCC warns (-Wattributes) in code
// built without -fvisibility=hidden. Every extension keeps its own copy anyway.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define OB_HIDDEN __attribute__((visibility("hidden")))
#else
#define OB_HIDDEN
#endif
#include "opbuilder/detail/core_lib.h"
