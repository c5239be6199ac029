// The core library, libobcore: the bodies of the binding-neutral core's non-template functions
// (those the headers mark OB_CORE_FN), compiled once per toolchain and header contents for every
// nanobind operator (see opbuilder/detail/core_lib.h and opbuilder/native/core_lib.py). One translation
// unit, as nanobind's nb_combined.cpp: the headers are read once. Built with -DOB_CORE_BUILD
// -DOB_CORE_TAG=<tag>; an operator built with the same tag binds to these definitions instead of
// compiling its own.
#ifndef OB_CORE_BUILD
#error "core_lib.cpp is built by opbuilder (python -m opbuilder build), with OB_CORE_BUILD and OB_CORE_TAG"
#endif

#include "opbuilder/autograd.h"
#include "opbuilder/detail/binding.h"
#include "opbuilder/detail/bound_call.h"
#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/fingerprint.h"
#include "opbuilder/detail/function_node.h"
#include "opbuilder/detail/infer_shape.h"
#include "opbuilder/detail/replay.h"
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/dtype.h"
#include "opbuilder/tensor.h"

// the bodies, one file per header that declares them
#include "autograd.cpp"
#include "binding.cpp"
#include "bound_call.cpp"
#include "dtype.cpp"
#include "errors.cpp"
#include "fingerprint.cpp"
#include "infer_shape.cpp"
#include "replay.cpp"
#include "runtime_bridge.cpp"
#include "tensor.cpp"
