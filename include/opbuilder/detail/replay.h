// A Function<T> call handed to runtime.jit while it traces (not for operator authors).
//
// The jit hook (runtime/jit/tracing.py cpp_hook) takes the op's name, a Python callable that
// replays the call on new arguments, and the arguments. The callable is one CPython builtin made
// here from a plain function pointer, the same code for every Function and binding layer; only
// the pointer's target (converting the arguments and calling Apply) is compiled per Function.
#pragma once

#include <Python.h>

#include <cstdint>
#include <type_traits>

#include "opbuilder/detail/binding.h"
#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/detail/visibility.h"
#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// Bumped whenever ReplayTarget's fields change: to_jax's probe reads them (opbuilder/bridges/
// interop_jax_ffi.py's _REPLAY_ABI) and refuses a target of another number.
constexpr std::uint64_t kReplayAbi = 0x0b0ffe9100000003ull;

// Sets this module's probe mark (binding.h's ProbeRefusesPython: ctx->saved_data then refuses, naming
// `where`; nullptr clears it) on this thread and returns the previous one. One per module: to_jax's probe
// runs a Function once so, to learn whether it uses saved_data (such a call takes the host route).
inline const char *SwapNoPython(const char *where) {
  const char *old = ProbeRefusesPython();
  ProbeRefusesPython() = where;
  return old;
}

// One replay target: `fn(args, nargs)` gets exactly `nargs` arguments and returns a new
// reference, or nullptr with the Python error set. `no_python` (after `abi`, kReplayAbi): the
// module's SwapNoPython (opbuilder/bridges/interop_jax_ffi.py calls it).
struct ReplayTarget {
  PyObject *(*fn)(PyObject *const *args, Py_ssize_t nargs);
  Py_ssize_t nargs;
  std::uint64_t abi;
  const char *(*no_python)(const char *where);
};

// The replay callable's body: `self` is a capsule holding the ReplayTarget.
OB_CORE_FN PyObject *ReplayCall(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

// hook(name, replay, args) with `replay` calling `target`; the hook's result (new reference).
OB_CORE_FN PyObject *TraceCall(PyObject *hook, PyObject *name, const ReplayTarget &target, PyObject *args);

// A tensor the replay was given or the hook returned (a runtime.Tensor, numpy array, DLPack object).
OB_CORE_FN TensorPtr ReplayTensor(PyObject *o);

// A list or tuple of tensors, as ReplayTensor takes each.
OB_CORE_FN TensorPtrList ReplayTensorList(PyObject *o);

// A list of runtime.Tensors (None for a null tensor), new reference.
OB_CORE_FN PyObject *TensorListToObject(const TensorPtrList &ts);

// A traced call's argument or result as a Python object (new reference): tensors by the core,
// other values by the binding layer.
template <typename Dep, typename V>
PyObject *ReplayToPython(const V &v) {
  if constexpr (std::is_same_v<V, TensorPtr>) {
    return TensorToObject(v);
  } else if constexpr (std::is_same_v<V, TensorPtrList>) {
    return TensorListToObject(v);
  } else {
    return Binding<Dep>::ToPython(v);
  }
}

// A replay's argument, or the hook's result, as the C++ value `V`.
template <typename Dep, typename V>
V ReplayFromPython(PyObject *o) {
  if constexpr (std::is_same_v<V, TensorPtr>) {
    return ReplayTensor(o);
  } else if constexpr (std::is_same_v<V, TensorPtrList>) {
    return ReplayTensorList(o);
  } else {
    return Binding<Dep>::template FromPython<V>(o);
  }
}

}  // namespace detail
}  // namespace opbuilder

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#if __has_include("../../../src/core/replay.cpp")
#include "../../../src/core/replay.cpp"
#else  // a copy of these headers (vendored): the installed ones' sources, found from the include path
#include "../src/core/replay.cpp"
#endif
#endif
