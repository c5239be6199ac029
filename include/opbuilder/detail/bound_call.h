// A module function (OB_MODULE's m.def) handed to runtime.jit while it traces (not for operator authors).
//
// A traced graph must replay what the caller's call did. A module function may do more than one
// Function's Apply: work before or after it (an epilogue writing the output, a prologue writing an
// input), a Function picked by a tensor's value, two Applies. Recording each Apply would drop the rest
// on replay. So OB_MODULE's `m` is a TracedModule: each m.def binds the function behind one check of
// the trace flag (one load and a branch per call). While a trace records, the call goes to
// runtime/jit/tracing.py `bound_hook` with the module's function object and its arguments as Python
// objects; the trace records one node whose target is that function, so a replay runs the whole function
// (its Applies then record their own autograd nodes; its check finds no trace recording on the thread).
//
// Only signatures whose values cross to Python and back unchanged are recorded: tensors, numbers,
// strings, vectors and optionals of them; results of tensors (TensorPtr, TensorPtrList, a tuple or pair of TensorPtr).
// A call of another signature that mentions a tensor stops the trace (the call, and that signature,
// run eagerly: runtime.jit.tracing.no_trace). A signature without tensors is bound as it is.
#pragma once

#include <Python.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "opbuilder/detail/ffi_bound.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/detail/replay.h"
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/detail/visibility.h"
#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// ---- what a value is, for the trace ---------------------------------------------------------------
template <typename T>
struct IsTensorish : std::bool_constant<std::is_same_v<T, TensorPtr> || std::is_same_v<T, TensorPtrList> ||
                                        std::is_same_v<T, std::optional<TensorPtr>>> {};
template <typename T>
struct IsPlainValue : std::bool_constant<std::is_arithmetic_v<T> || std::is_same_v<T, std::string>> {};
template <typename T>
struct IsPlainValue<std::vector<T>> : IsPlainValue<T> {};
template <typename T>
struct IsPlainValue<std::optional<T>> : IsPlainValue<T> {};

// An argument type that crosses to Python and back unchanged: by value or const reference.
template <typename A>
struct ArgCrosses
    : std::bool_constant<(std::is_same_v<A, std::decay_t<A>> ||
                          (std::is_lvalue_reference_v<A> && std::is_const_v<std::remove_reference_t<A>>)) &&
                         (IsTensorish<std::decay_t<A>>::value || IsPlainValue<std::decay_t<A>>::value)> {};

// A result a graph node can hold: tensors only.
template <typename R>
struct ResultIsTensors : std::bool_constant<std::is_same_v<R, TensorPtr> || std::is_same_v<R, TensorPtrList>> {};
template <typename... T>
struct ResultIsTensors<std::tuple<T...>> : std::bool_constant<(std::is_same_v<T, TensorPtr> && ...)> {};
template <typename A, typename B>
struct ResultIsTensors<std::pair<A, B>>
    : std::bool_constant<std::is_same_v<A, TensorPtr> && std::is_same_v<B, TensorPtr>> {};

template <typename T>
struct MentionsTensor : IsTensorish<T> {};
template <typename... T>
struct MentionsTensor<std::tuple<T...>> : std::bool_constant<(MentionsTensor<T>::value || ...)> {};
template <typename A, typename B>
struct MentionsTensor<std::pair<A, B>> : std::bool_constant<MentionsTensor<A>::value || MentionsTensor<B>::value> {};
template <typename T>
struct MentionsTensor<std::vector<T>> : MentionsTensor<T> {};

// ---- a callable's signature ---------------------------------------------------------------------
template <typename R, typename... A>
struct FnSig {
  static constexpr bool kKnown = true;
  using Ret = R;
  static constexpr bool kRecorded = ResultIsTensors<std::decay_t<R>>::value && !std::is_reference_v<R> &&
                                    (ArgCrosses<A>::value && ...);
  static constexpr bool kTensors = MentionsTensor<std::decay_t<R>>::value ||
                                   (MentionsTensor<std::decay_t<A>>::value || ...);
};
template <typename T, typename = void>
struct CallSig {
  static constexpr bool kKnown = false;  // a generic lambda, an overloaded functor: bound as it is
};
template <typename R, typename... A>
struct CallSig<R (*)(A...), void> : FnSig<R, A...> {};
template <typename R, typename... A>
struct CallSig<R (*)(A...) noexcept, void> : FnSig<R, A...> {};
template <typename M>
struct OperatorSig {
  static constexpr bool kKnown = false;
};
template <typename C, typename R, typename... A>
struct OperatorSig<R (C::*)(A...)> : FnSig<R, A...> {};
template <typename C, typename R, typename... A>
struct OperatorSig<R (C::*)(A...) const> : FnSig<R, A...> {};
template <typename C, typename R, typename... A>
struct OperatorSig<R (C::*)(A...) noexcept> : FnSig<R, A...> {};
template <typename C, typename R, typename... A>
struct OperatorSig<R (C::*)(A...) const noexcept> : FnSig<R, A...> {};
template <typename T>
struct CallSig<T, std::void_t<decltype(&T::operator())>> : OperatorSig<decltype(&T::operator())> {};

// runtime._native.bound_hook (runtime/jit/tracing.py), looked up once per module, kept for the process.
inline PyObject *BoundHook() {
  static PyObject *hook = nullptr;  // with the GIL held: no other thread runs this between check and store
  if (hook == nullptr) hook = ImportAttr("runtime._native", "bound_hook");
  return hook;
}

// While a trace records: stop it (signatures the trace cannot record; `why`, a str, or None: the signature's
// values), then the caller runs the call.
inline void StopTrace(PyObject *name, PyObject *why) {
  PyRef r = PyRef::Steal(Check(PyObject_CallFunctionObjArgs(BoundHook(), name, Py_None, why, nullptr)));
}

// An extra of def() that a replay, which passes every argument by position, could not honour: a keyword-only
// marker (the binding layer's header specializes it).
template <typename T>
struct IsKeywordOnly : std::false_type {};

// The wrapper m.def binds for a function `F` of signature R(A...): the check, then `f` or the hook.
template <typename Dep, typename F, typename R, typename... A>
struct BoundCall {
  std::shared_ptr<F> f;
  // the module's function object (set once def() made it; a new reference kept for the process): what a
  // replay runs. Its own check finds no trace recording on the replaying thread, so it calls `f`; no
  // second function object is compiled per module function
  std::shared_ptr<PyObject *> target;
  PyObject *name;  // the function's name, for the node
  PyObject *stop;  // a str saying why no call of it is recorded (keyword-only arguments), or nullptr
  PyObject *ffi;   // a capsule of its FfiBoundEntry (detail/ffi_bound.h; to_jax's probe reads it), or None

  R operator()(A... a) const {
    if (*Runtime::Get().trace_flag != 0) {
      GilForRefcount gil;  // under call_guard<gil_scoped_release>: the trace is Python's
      if (stop != nullptr) {
        StopTrace(name, stop);
      } else if constexpr (FnSig<R, A...>::kRecorded) {
        PyRef args = PyRef::Steal(Check(PyTuple_New(static_cast<Py_ssize_t>(sizeof...(A)))));
        Py_ssize_t k = 0;
        (PyTuple_SET_ITEM(args.get(), k++, ReplayToPython<Dep>(static_cast<const std::decay_t<A> &>(a))), ...);
        PyRef out =
            PyRef::Steal(Check(PyObject_CallFunctionObjArgs(BoundHook(), name, *target, args.get(), ffi, nullptr)));
        if (out.get() != Py_NotImplemented) return ReplayFromPython<Dep, std::decay_t<R>>(out.get());
      } else {
        StopTrace(name, Py_None);
      }
    }
    return (*f)(static_cast<A &&>(a)...);
  }
};

template <typename Dep, typename F, typename R, typename... A>
auto MakeBoundCall(std::shared_ptr<F> f, const char *name, std::shared_ptr<PyObject *> target, PyObject *stop,
                   FnSig<R, A...> *) {
  PyObject *ffi = Py_None;  // kept for the process, as the name
  const FfiBoundEntry *e = nullptr;
  if constexpr (FnSig<R, A...>::kRecorded) e = MakeFfiBoundEntry<F, R, A...>(f.get(), name);
  if (e != nullptr) {
    ffi = Check(PyCapsule_New(const_cast<FfiBoundEntry *>(e), "opbuilder.ffi_bound", nullptr));
  } else {
    Py_INCREF(ffi);
  }
  BoundCall<Dep, F, R, A...> call{std::move(f), std::move(target), Check(PyUnicode_FromString(name)), stop, ffi};
  return [call](A... a) -> R { return call(static_cast<A &&>(a)...); };
}

// The module function object a replay of `name` in `module` runs, one per name: each overload def()'d under
// it points at the same cell, which holds the newest function object (nanobind empties an earlier one when
// an overload is added; pybind11 keeps one). Module init only, with the GIL held.
inline std::shared_ptr<PyObject *> TargetCell(PyObject *module, const char *name) {
  static std::vector<std::tuple<PyObject *, std::string, std::shared_ptr<PyObject *>>> cells;
  for (auto &[m, n, cell] : cells) {
    if (m == module && n == name) return cell;
  }
  cells.emplace_back(module, name, std::make_shared<PyObject *>(nullptr));
  return std::get<2>(cells.back());
}

// The module of OB_MODULE, NB_MODULE and PYBIND11_MODULE (opbuilder::ObModule): `Module`
// (nanobind::module_ or pybind11::module_) whose def() binds each function with a signature that mentions a
// tensor behind the trace check (BoundCall); everything else is Module's. A submodule is one too.
template <typename Module>
class TracedModule : public Module {
 public:
  TracedModule(const Module &m) : Module(m) {}  // NOLINT: implicit, so `decltype(m) sub = m.def_submodule(..)`

  template <typename Func, typename... Extra>
  TracedModule &def(const char *name, Func &&f, const Extra &...extra) {
    using F = std::decay_t<Func>;
    using Sig = CallSig<F>;
    if constexpr (Bound<Sig>()) {  // (the other branch is not instantiated: a mutable lambda fits only here)
      auto target = TargetCell(this->ptr(), name);
      PyObject *stop = nullptr;
      if constexpr ((IsKeywordOnly<Extra>::value || ...)) {
        stop = Check(PyUnicode_FromString("takes keyword-only arguments, which a replay cannot pass"));
      }
      Module::def(name,
                  MakeBoundCall<F>(std::make_shared<F>(std::forward<Func>(f)), name, target, stop,
                                   static_cast<Sig *>(nullptr)),
                  extra...);
      PyObject *now = Check(PyObject_GetAttrString(this->ptr(), name));  // kept for the process, as the module's
      Py_XDECREF(*target);
      *target = now;
    } else {
      Module::def(name, std::forward<Func>(f), extra...);
    }
    return *this;
  }

  TracedModule def_submodule(const char *name, const char *doc = nullptr) {
    return TracedModule(Module::def_submodule(name, doc));
  }

 private:
  template <typename Sig>
  static constexpr bool Bound() {
    if constexpr (Sig::kKnown) {
      return Sig::kTensors;
    } else {
      return false;
    }
  }
};

}  // namespace detail
}  // namespace opbuilder
