// The details of Function<T> (autograd.h): what its Apply is built from. A Function type's own
// code is what depends on its types (the argument list, Forward's call, the names); everything
// else is RunFunction's, compiled once in the core library (src/core/autograd.cpp, the runner's
// helpers in detail/function_runner.h). Not for operator authors. Included by autograd.h only, between
// AutogradContext (complete here) and Function<T>.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include <atomic>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "opbuilder/detail/call_rules.h"
#include "opbuilder/detail/context_state.h"
#include "opbuilder/detail/function_checks.h"
#include "opbuilder/detail/infer_shape.h"
#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {


inline ContextState &State(AutogradContext &ctx) { return ctx.st_; }
inline const ContextState &State(const AutogradContext &ctx) { return ctx.st_; }

OB_CORE_FN std::string Demangle(const char *name);

// A class's name for messages from its typeid name: demangled, "(anonymous namespace)::" left out.
OB_CORE_FN std::string DisplayName(const char *mangled);

// The class name for messages, made once.
template <typename T>
const std::string &FunctionName() {
  static const std::string name = DisplayName(typeid(T).name());
  return name;
}

// The same name as a Python str (borrowed, lives as long as the module).
template <typename T>
PyObject *FunctionNamePy() {
  static std::atomic<PyObject *> stored{nullptr};  // made under the GIL; a race leaks one str at most
  PyObject *s = stored.load(std::memory_order_acquire);
  if (s != nullptr) return s;
  s = Check(PyUnicode_FromStringAndSize(FunctionName<T>().data(), static_cast<Py_ssize_t>(FunctionName<T>().size())));
  PyObject *expected = nullptr;
  if (stored.compare_exchange_strong(expected, s, std::memory_order_acq_rel)) return s;
  Py_DECREF(s);
  return expected;
}

// The tensor a Forward argument is (a TensorPtr, or an engaged std::optional<TensorPtr>), else nullptr.
template <typename A>
Tensor *TensorArg(const A &arg) {
  if constexpr (std::is_same_v<std::decay_t<A>, TensorPtr>) {
    return arg.get();
  } else if constexpr (std::is_same_v<std::decay_t<A>, std::optional<TensorPtr>>) {
    return arg ? arg->get() : nullptr;
  } else {
    return nullptr;
  }
}

inline int IndexOf(const TensorPtrList &list, const Tensor *t) {
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i].get() == t) return static_cast<int>(i);
  }
  return -1;
}

inline TensorPtrList AsList(TensorPtr t) { return TensorPtrList{std::move(t)}; }
inline TensorPtrList AsList(TensorPtrList l) { return l; }
template <typename R>
R FromList(TensorPtrList l) {
  if constexpr (std::is_same_v<R, TensorPtr>) {
    return std::move(l[0]);
  } else {
    return l;
  }
}

inline bool WantsGrad(const Tensor *t) {
  return t != nullptr && t->requires_grad() && t->py_object() != nullptr && IsDifferentiable(t->dtype());
}

// A TensorPtrList argument is one argument with one Backward entry: its tensors get no gradient.
// One that wants a gradient while it would be recorded is an error, not a silent zero.
template <typename A>
void CheckListArg(const A &arg, std::size_t index, const std::string &name) {
  if constexpr (std::is_same_v<std::decay_t<A>, TensorPtrList>) {
    for (std::size_t k = 0; k < arg.size(); ++k) {
      if (WantsGrad(arg[k].get())) {
        throw std::runtime_error(name + ": argument " + std::to_string(index) + " is a list of tensors and its " +
                                 "element " + std::to_string(k) + " requires grad, but Function<T> gives " +
                                 "gradients to TensorPtr arguments only (Backward returns one per argument); " +
                                 "pass that tensor as a TensorPtr argument, or stop its gradient first");
      }
    }
  }
}

// ---- what Forward and Backward are given ------------------------------------
// A Function sees C-contiguous, writable tensors unless it declares
//   static constexpr bool kAcceptsViews = true;
// and then gets every tensor as the caller passed it (any strides, read-only memory).
template <typename T, typename = void>
struct AcceptsViews : std::false_type {};
template <typename T>
struct AcceptsViews<T, std::void_t<decltype(T::kAcceptsViews)>> : std::bool_constant<T::kAcceptsViews> {};

// A Function that declares
//   static constexpr bool kConstArgs = true;
// promises its Forward and Backward never write a tensor argument or a saved one (no MarkDirty, no write
// through a pointer, no in-place Apply on it, no writable view of it handed on, none kept past the call):
// to_jax's handler lends it JAX's own buffers (tensor_details.h LentScope), read-only. Any other type
// gets lent memory as its private copy.
template <typename T, typename = void>
struct ConstArgs : std::false_type {};
template <typename T>
struct ConstArgs<T, std::void_t<decltype(T::kConstArgs)>> : std::bool_constant<T::kConstArgs> {};

inline bool NeedsPrivateCopy(const Tensor &t) { return !t.is_contiguous() || !t.is_writable(); }

// A private contiguous copy standing for `t`: same requires_grad, bound to the
// same runtime.Tensor (so grad edges, versions and MarkDirty refer to the caller's).
OB_CORE_FN TensorPtr PrivateCopy(const Tensor &t);

// Whether Forward gets a private copy of `t`. Lent memory first becomes the tensor's own private copy
// unless the type declares kConstArgs: Forward may then write it, as it would the caller's writable
// tensor, and the function sees the write. (A kConstArgs type reads lent memory, always contiguous, in
// place; any other read-only memory it gets as any type does.)
template <bool kViews, bool kConst>
bool NeedsCopy(const Tensor &t) {
  if constexpr (kConst) {
    if (TensorAccess::IsLent(t)) return false;
  } else {
    TensorAccess::Unlend(t);
  }
  if constexpr (kViews) {
    return false;
  } else {
    return NeedsPrivateCopy(t);
  }
}

// The private copies one Apply makes: per argument (`origs[i]` the caller's tensor, `copies[i]` its copy;
// n slots) and for the elements of list arguments (`listed`). The same elements in two places (one tensor,
// or two over the same memory and layout; positional or inside a list) get one copy, as Forward would get
// them without copies: a write through one (MarkDirty) is what the other reads and saves, as in torch,
// where both are that memory.
struct ArgCopies {
  struct Listed;  // the list elements copied, each with its copy (the core's; made by the first)
  Tensor **origs;
  TensorPtr *copies;
  std::size_t n;
  Listed *listed = nullptr;

  ArgCopies(Tensor **o, TensorPtr *c, std::size_t count) : origs(o), copies(c), n(count) {}
  ~ArgCopies() {
    if (listed != nullptr) FreeListed(listed);
  }
  ArgCopies(const ArgCopies &) = delete;
  ArgCopies &operator=(const ArgCopies &) = delete;

  // Argument i's private copy of `caller`.
  OB_CORE_FN const TensorPtr &For(Tensor *caller, std::size_t i);
  // A list element's private copy of `caller`.
  OB_CORE_FN TensorPtr ForListed(const TensorPtr &caller);
  OB_CORE_FN static void FreeListed(Listed *listed);
};

// What Forward gets for argument `i` of `n`: tensors (TensorPtr, std::optional<TensorPtr>,
// the elements of a TensorPtrList) made contiguous where needed (the copy kept in
// `copies[i]`, `origs[i]` set to the caller's tensor: ArgCopies), everything else as it came. A
// tensor passes by reference: no reference count is touched on the common path.
// A list's lent elements become private copies whatever the type: the handler follows an argument,
// not the elements of a list (xla_ffi_handlers.h LentArgs).
template <bool kViews, bool kConst, typename A>
decltype(auto) ForwardArg(A &&arg, ArgCopies &made, std::size_t i) {
  using D = std::decay_t<A>;
  if constexpr (std::is_same_v<D, TensorPtr>) {
    if (arg && NeedsCopy<kViews, kConst>(*arg)) return made.For(arg.get(), i);
    return static_cast<const TensorPtr &>(arg);
  } else if constexpr (std::is_same_v<D, std::optional<TensorPtr>>) {
    if (arg && *arg && NeedsCopy<kViews, kConst>(**arg)) {
      return std::optional<TensorPtr>(made.For(arg->get(), i));
    }
    return std::optional<TensorPtr>(std::forward<A>(arg));
  } else if constexpr (std::is_same_v<D, TensorPtrList> && kViews) {
    for (const auto &t : arg) {
      if (t) TensorAccess::Unlend(*t);
    }
    return std::forward<A>(arg);
  } else if constexpr (std::is_same_v<D, TensorPtrList>) {
    TensorPtrList list(std::forward<A>(arg));
    for (auto &t : list) {
      if (t && NeedsCopy<kViews, false>(*t)) t = made.ForListed(t);
    }
    return list;
  } else {
    return std::forward<A>(arg);
  }
}

// Function<T>::InferShapeFunction()'s target: Forward's parameters (minus ctx) in, T::InferShape's
// outputs out as MetaTensors (shape and dtype, no data), one TensorPtr or a list as Forward returns.
template <typename Derived, typename F>
struct InferShapeBinder;
template <typename Derived, typename R, typename... A>
struct InferShapeBinder<Derived, R (*)(AutogradContext *, A...)> {
  static R Call(A... args) {
    static_assert(kDeclaresInferShape<Derived>, "Function<T>::InferShapeFunction(): T declares no InferShape");
    if constexpr (InferShapeChecks<Derived, R, A...>::ok) {
      const DataType dtype = OutputDtype(args...);
      TensorPtrList outs;
      for (auto &s : ShapeList(Derived::InferShape(args...))) outs.push_back(MetaTensor(dtype, std::move(s)));
      if constexpr (std::is_same_v<R, TensorPtr>) {
        return std::move(outs[0]);
      } else {
        return outs;
      }
    } else {
      return R();
    }
  }
};


// One Apply call's Forward, type-erased: T::Forward(ctx, the arguments `call` points to), its
// result stored in *single (Forward returns TensorPtr) or *list (TensorPtrList).
using ForwardFn = void (*)(AutogradContext *ctx, void *call, TensorPtr *single, TensorPtrList *list);
// Its Backward (the node keeps it: detail/function_node.h, which declares the same alias).
using BackwardFn = TensorPtrList (*)(AutogradContext *, TensorPtrList);

// What Function<T>::Apply hands the runner: all that depends on T and the arguments.
struct FunctionCall {
  const std::string *name;
  Tensor *const *args;       // per Forward argument: its tensor, or nullptr
  Tensor *const *originals;  // per argument: the caller's tensor where Forward gets a private copy
  std::size_t nargs;
  ForwardFn forward;
  void *call;
  BackwardFn backward;
  ErrorFn set_error;
  PyObject *(*name_py)();
  WriteState *writes;  // the Function type's (Function<T>::Writes): when arguments are kept (call_rules.h)
};

// Apply's work once the arguments are prepared, compiled once (the core library) rather than per
// Function: runs Forward (recording off) and, when an argument needs a gradient and grad mode is on,
// records the node; else only the no-grad checks. The result goes to *single or *list as Forward's.
OB_CORE_FN void RunFunction(const Runtime &rt, const FunctionCall &f, TensorPtr *single,
                            TensorPtrList *list);

// Before T::Backward: an error if the node was released; else the gradients as Backward sees
// them (contiguous copies where needed, unless the Function accepts views).
OB_CORE_FN void PrepareBackward(AutogradContext &ctx, TensorPtrList &grads, bool views);

}  // namespace detail
}  // namespace opbuilder
