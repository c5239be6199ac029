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

// What a bound function keeps besides its callable: one per m.def, made by the core library and kept for the
// process (a module is never unloaded). Only the few lines that depend on the function's type are compiled
// per operator (BoundFn, TracedBoundCall below); the rest is the core's, compiled once.
struct BoundSite {
  PyObject *name;  // the function's name (str), for the node
  // the module's function object (set once def() made it): what a replay runs. Its own check finds no trace
  // recording on the replaying thread, so it calls the function; no second function object is compiled
  std::shared_ptr<PyObject *> target;
  PyObject *stop;  // a str saying why no call of it is recorded (keyword-only arguments), or nullptr
  PyObject *ffi;   // a capsule of its FfiBoundEntry (detail/ffi_bound.h; to_jax's probe reads it), or None
};

// def()'s part before the binding layer's def: the site of `name` in `module` (one target cell per name: each
// overload def()'d under it points at the cell, which holds the newest function object, since nanobind empties
// an earlier one when an overload is added). Module init only, with the GIL held.
OB_CORE_FN const BoundSite *NewBoundSite(PyObject *module, const char *name, bool keyword_only,
                                         const FfiBoundEntry *ffi);
// ... and after it: the module's function object of that name becomes the site's replay target.
OB_CORE_FN void BoundSiteDefined(const BoundSite &site, PyObject *module, const char *name);
// While a trace records, with the GIL held: stops it for a call of `site` it cannot record.
OB_CORE_FN void StopBoundTrace(const BoundSite &site);
// While a trace records, with the GIL held: hands the call (its arguments, a tuple) to runtime/jit/tracing.py
// `bound_hook`; its result, a new reference (Py_NotImplemented: the trace did not take the call).
OB_CORE_FN PyObject *RecordBoundCall(const BoundSite &site, PyObject *args);

// A recorded signature's call while a trace records: true with the result in *out when the trace took it.
// Out of line and cold: the bound function's own code stays a check and a call.
template <typename R, typename... A>
__attribute__((noinline, cold)) bool TracedBoundCall(const BoundSite &site, R *out, const A &...a) {
  GilForRefcount gil;  // under call_guard<gil_scoped_release>: the trace is Python's
  if (site.stop != nullptr) {
    StopBoundTrace(site);
    return false;
  }
  PyRef args = PyRef::Steal(Check(PyTuple_New(static_cast<Py_ssize_t>(sizeof...(A)))));
  Py_ssize_t k = 0;
  (PyTuple_SET_ITEM(args.get(), k++, ReplayToPython<R>(a)), ...);
  (void)k;
  PyRef res = PyRef::Steal(RecordBoundCall(site, args.get()));
  if (res.get() == Py_NotImplemented) return false;
  *out = ReplayFromPython<R, R>(res.get());
  return true;
}

// An extra of def() that a replay, which passes every argument by position, could not honour: a keyword-only
// marker (the binding layer's header specializes it).
template <typename T>
struct IsKeywordOnly : std::false_type {};

// ---- a result over an argument's memory ----------------------------------------------------------
// A Tensor a function builds on its argument's storage (x[:2] in C++, no Function around it) and returns
// is a view of that argument, as torch's x[:2] in a Python function is (BindReturnedView, for each result
// bound to no Python object that shares an argument's storage).
inline const Tensor *ArgTensor(const TensorPtr &a) { return a.get(); }
inline const Tensor *ArgTensor(const std::optional<TensorPtr> &a) { return a ? a->get() : nullptr; }
template <typename T>
const Tensor *ArgTensor(const T &) {
  return nullptr;
}
inline const TensorPtrList *ArgList(const TensorPtrList &a) { return &a; }
template <typename T>
const TensorPtrList *ArgList(const T &) {
  return nullptr;
}
// A module function's arguments, for the check of its results.
struct ReturnedArgs {
  const Tensor *const *tensors;       // per argument, the tensor it is, or null
  const TensorPtrList *const *lists;  // per argument, the list of tensors it is, or null
  std::size_t n;
};
// The tensor argument whose storage `r` shares (its control block, not only its memory: `x` and `x.detach()`
// are two arguments over one array, and a slice on `y->storage()` is y's), or null: pointer compares, out of
// line so that each bound function compiles a call, not the loop.
OB_CORE_FN const Tensor *StorageArgument(const Tensor &r, const ReturnedArgs &args);
inline void CheckReturned(const TensorPtr &r, const ReturnedArgs &args) {
  if (!r || r->py_object() != nullptr) return;
  if (const Tensor *a = StorageArgument(*r, args)) BindReturnedView(r, *a);
}
inline void CheckReturned(const TensorPtrList &r, const ReturnedArgs &args) {
  for (const auto &t : r) CheckReturned(t, args);
}
template <typename... T>
void CheckReturned(const std::tuple<T...> &r, const ReturnedArgs &args) {
  std::apply([&](const auto &...t) { (CheckReturned(t, args), ...); }, r);
}
template <typename T, typename U>
void CheckReturned(const std::pair<T, U> &r, const ReturnedArgs &args) {
  CheckReturned(r.first, args);
  CheckReturned(r.second, args);
}
// An argument as the function takes it; a tensor (or list, or optional) by value as a copy, so the check
// after the call still sees it.
template <typename A>
decltype(auto) PassArg(std::remove_reference_t<A> &a) {
  if constexpr (IsTensorish<A>::value) {
    return static_cast<const A &>(a);
  } else {
    return static_cast<A &&>(a);
  }
}

// The wrapper m.def binds for a function `F` of signature R(A...): the check, then `f` or the trace. Two
// pointers, so the binding layer keeps it inside its function record (no allocation, no destructor).
template <typename F, typename R, typename... A>
struct BoundFn {
  F *f;
  const BoundSite *site;

  R operator()(A... a) const {
    if (*Runtime::Get().trace_flag != 0) {
      if constexpr (FnSig<R, A...>::kRecorded) {
        std::remove_cv_t<R> out;  // (a function may return `const TensorPtr`)
        if (TracedBoundCall<std::remove_cv_t<R>, std::decay_t<A>...>(*site, &out, a...)) return out;
      } else {
        GilForRefcount gil;
        StopBoundTrace(*site);
      }
    }
    if constexpr (FnSig<R, A...>::kRecorded) {
      std::remove_cv_t<R> out = (*f)(PassArg<A>(a)...);
      const Tensor *const tensors[sizeof...(A) + 1] = {ArgTensor(a)..., nullptr};
      const TensorPtrList *const lists[sizeof...(A) + 1] = {ArgList(a)..., nullptr};
      CheckReturned(out, ReturnedArgs{tensors, lists, sizeof...(A)});
      return out;
    } else {
      return (*f)(static_cast<A &&>(a)...);
    }
  }
};

// A bool argument takes True or False only, on both layers, as torch's: pybind11's own caster takes any
// object by its truth (None, 5, numpy.float64(0.5)); nanobind's is this strict (StrictBool: binding.h).
template <typename A>
struct ArgIn {
  using type = A;
};
#if !defined(OB_BINDING_NANOBIND)
template <>
struct ArgIn<bool> {
  using type = StrictBool;
};
template <>
struct ArgIn<std::optional<bool>> {
  using type = std::optional<StrictBool>;
};
template <>
struct ArgIn<std::vector<bool>> {
  using type = std::vector<StrictBool>;
};
template <typename A>
struct ArgIn<const A &> {  // const bool&, const std::optional<bool>&, ...: the same, by value
  using type = std::conditional_t<std::is_same_v<typename ArgIn<A>::type, A>, const A &, typename ArgIn<A>::type>;
};
#endif

// The function's own argument from what the binding converted: itself, or a bool made of StrictBool's.
template <typename A, typename In>
decltype(auto) ArgOut(In &x) {
  using D = std::decay_t<A>;
  if constexpr (std::is_same_v<D, std::decay_t<In>>) {
    return static_cast<A &&>(x);
  } else if constexpr (std::is_same_v<D, std::vector<bool>>) {
    return D(x.begin(), x.end());
  } else if constexpr (std::is_same_v<D, std::optional<bool>>) {  // not D(x): that is x.has_value()
    return x ? D(static_cast<bool>(*x)) : D();
  } else {
    return D(x);
  }
}

template <typename F, typename R, typename... A>
auto MakeBoundFn(F *f, const BoundSite *site, FnSig<R, A...> *) {
  const BoundFn<F, R, A...> call{f, site};
  return [call](typename ArgIn<A>::type... a) -> R { return call(ArgOut<A>(a)...); };
}

// to_jax's entry of `f` (detail/ffi_bound.h) for a recorded signature, else nullptr.
template <typename F, typename R, typename... A>
const FfiBoundEntry *BoundFfiEntry(const F *f, const char *name, FnSig<R, A...> *) {
  if constexpr (FnSig<R, A...>::kRecorded) {
    return MakeFfiBoundEntry<F, R, A...>(f, name);
  } else {
    (void)f;
    (void)name;
    return nullptr;
  }
}

// The module of OB_MODULE, NB_MODULE and PYBIND11_MODULE (opbuilder::ObModule): `Module`
// (nanobind::module_ or pybind11::module_) whose def() binds each function with a signature that mentions a
// tensor behind the trace check (BoundFn); everything else is Module's. A submodule is one too.
template <typename Module>
class TracedModule : public Module {
 public:
  TracedModule(const Module &m) : Module(m) {}  // NOLINT: implicit, so `decltype(m) sub = m.def_submodule(..)`

  template <typename Func, typename... Extra>
  TracedModule &def(const char *name, Func &&f, const Extra &...extra) {
    using F = std::decay_t<Func>;
    using Sig = CallSig<F>;
    if constexpr (Bound<Sig>()) {  // (the other branch is not instantiated: a mutable lambda fits only here)
      F *fp = new F(std::forward<Func>(f));  // kept for the process, as its site
      const BoundSite *site = NewBoundSite(this->ptr(), name, (IsKeywordOnly<Extra>::value || ...),
                                           BoundFfiEntry(fp, name, static_cast<Sig *>(nullptr)));
      Module::def(name, MakeBoundFn(fp, site, static_cast<Sig *>(nullptr)), extra...);
      BoundSiteDefined(*site, this->ptr(), name);
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

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#if __has_include("../../../src/core/bound_call.cpp")
#include "../../../src/core/bound_call.cpp"
#else  // a copy of these headers (vendored): the installed ones' sources, found from the include path
#include "../src/core/bound_call.cpp"
#endif
#endif
