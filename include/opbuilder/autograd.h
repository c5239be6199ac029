// Function<T>: a C++ operator with its own Forward and Backward, recorded as
// one node of the Python runtime's graph.
//
//   class CustomMul : public Function<CustomMul> {
//    public:
//     static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y);
//     static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grad_outputs);
//   };
//   m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return CustomMul::Apply(x, y); });
//
// Apply works out which tensor arguments need grad (grad mode on, the
// argument requires grad). When none does it just runs Forward (the fast
// path: no allocation beyond Forward's own, no Python calls). Otherwise it
// fingerprints the tensor arguments, runs Forward with recording off, checks
// that only MarkDirty'd arguments changed, and records a node
// (detail/function_node.h) whose backward calls Backward. The engine checks
// what Backward returns (count, shape, dtype) and names the Function in any
// error. A Forward that throws records nothing.
//
// This header is the API: AutogradContext, then Function<T>. What Apply is built from is in
// detail/function_details.h; the runner it calls (RunFunction: recording, the no-grad checks, a
// bridge's call) is compiled once into the core library (src/core/autograd.cpp).
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#include "opbuilder/detail/binding.h"
#include "opbuilder/detail/call_rules.h"
#include "opbuilder/detail/context_state.h"
#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/ffi_bound.h"
#include "opbuilder/detail/fingerprint.h"
#include "opbuilder/detail/function_checks.h"
#include "opbuilder/detail/infer_shape.h"
#include "opbuilder/detail/replay.h"
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/detail/saved_value.h"
#include "opbuilder/tensor.h"

namespace opbuilder {

class AutogradContext;
namespace detail OB_HIDDEN {
inline ContextState &State(AutogradContext &ctx);
inline const ContextState &State(const AutogradContext &ctx);
}  // namespace detail

class OB_HIDDEN AutogradContext {
 public:
  AutogradContext() = default;
  OB_CORE_FN ~AutogradContext();
  AutogradContext(const AutogradContext &) = delete;
  AutogradContext &operator=(const AutogradContext &) = delete;

  // Keep tensors for Backward (replaces what was saved before; nullptr allowed).
  // Save inputs and outputs here, not in saved_data: their versions are checked.
  // Taken by value: a list made for the call (`SaveForBackward({x, y})`) is kept without a copy, and
  // the one signature keeps `&AutogradContext::SaveForBackward` a plain member pointer.
  OB_CORE_FN void SaveForBackward(TensorPtrList tensors);

  // The saved tensors, by position; an error naming the Function and the slot
  // if one was modified in place since it was saved.
  OB_CORE_FN TensorPtrList GetSavedTensors() const;

  // Does this Forward argument (by identity) need a gradient? Inside Forward only.
  OB_CORE_FN bool NeedGrad(const TensorPtr &tensor) const;

  // Does Forward argument `i` (counting every argument after ctx) need a gradient?
  bool NeedsInputGrad(std::size_t i) const { return i < st_.needs.size() && st_.needs[i]; }

  // These outputs get no gradient and have requires_grad == False.
  OB_CORE_FN void MarkNonDifferentiable(const TensorPtrList &outputs);

  // These arguments were modified in place by Forward, which returns them.
  OB_CORE_FN void MarkDirty(const TensorPtrList &inputs);

  // false: gradients of unused outputs arrive as nullptr instead of zeros.
  void SetMaterializeGrads(bool materialize) { st_.materialize_grads = materialize; }

  // Plain values for Backward: ctx->saved_data["k"] = 3; ...cast<int>() (numbers, strings,
  // tensors, lists of them; with pybind11 also ctx->saved_data["k"] = py::cast(3)).
  std::unordered_map<std::string, detail::SavedValue> saved_data;

  // The Function's class name, for messages.
  const std::string &function_name() const { return *st_.name; }

 private:
  // An error naming the slot if `src` (a runtime.Tensor, or a weak reference to one) moved from `version`.
  void CheckSavedVersion(const detail::Runtime &rt, std::size_t slot, PyObject *src, bool weak,
                         std::int64_t version, PyObject *counter) const;
  void VersionError(std::size_t slot, std::int64_t now, std::int64_t version) const;

  friend detail::ContextState &detail::State(AutogradContext &ctx);
  friend const detail::ContextState &detail::State(const AutogradContext &ctx);
  detail::ContextState st_;
};

}  // namespace opbuilder

#include "opbuilder/detail/function_details.h"  // needs AutogradContext; Function<T> needs it

namespace opbuilder {

template <typename Derived>
class Function {
 public:
  // Runs Forward (and records a node for Backward when an input needs grad).
  // Tensor arguments that are strided views or read-only memory reach Forward
  // as private contiguous copies, unless Derived declares kAcceptsViews. With
  // kConstArgs (Forward and Backward write no argument or saved tensor), to_jax
  // lends Forward JAX's buffers in place, read-only.
  template <typename... Args>
  static auto Apply(Args &&...args) {
    const detail::Runtime &rt = detail::Runtime::Get();
    // an XLA FFI handler's run of a bound function: no Python, never traced (detail/ffi_bound.h); Apply,
    // Forward and Backward are trusted with the memory the handler lends (tensor_details.h LentScope)
    if (detail::InFfiRun() != nullptr) {
      detail::LentScope trusted(true);
      return Prepare(rt, std::index_sequence_for<Args...>{}, std::forward<Args>(args)...);
    }
    // the rest reads and records Python state; a bound function may have released the GIL (call_guard)
    detail::GilForRefcount gil;
    if (*rt.trace_flag != 0) return Traced(std::forward<Args>(args)...);
    return Prepare(rt, std::index_sequence_for<Args...>{}, std::forward<Args>(args)...);
  }

  // T::InferShape as a function to bind next to the op, m.def("<name>_infer_shape", T::InferShapeFunction()):
  // it takes Forward's arguments (minus ctx) and returns the outputs' shapes and dtypes as tensors
  // without data (every element one zero), running no kernel. Needs one (non-template) Forward.
  static constexpr auto InferShapeFunction() {
    return &detail::InferShapeBinder<Derived, decltype(&Derived::Forward)>::Call;
  }

 private:
  // runtime.jit is tracing: hand the call to its hook (runtime/jit/tracing.py cpp_hook), which
  // records one graph node whose target replays this Apply (without the check) and runs it.
  // The arguments and the result cross as Python objects, converted by the binding layer.
  template <typename... Args>
  static auto Traced(Args &&...args) {
    using R =
        decltype(Prepare(detail::Runtime::Get(), std::index_sequence_for<Args...>{}, std::forward<Args>(args)...));
    detail::PyRef py_args =
        detail::PyRef::Steal(detail::Check(PyTuple_New(static_cast<Py_ssize_t>(sizeof...(Args)))));
    Py_ssize_t k = 0;
    (PyTuple_SET_ITEM(py_args.get(), k++, detail::ReplayToPython<Derived>(args)), ...);
    detail::PyRef out = detail::PyRef::Steal(
        detail::TraceCall(detail::Runtime::Get().trace_hook, detail::FunctionNamePy<Derived>(),
                          Replay<std::index_sequence_for<Args...>, Args...>::kTarget, py_args.get()));
    return detail::ReplayFromPython<Derived, R>(out.get());
  }

  // The replay's target: the arguments converted to what Apply got (Args), then Apply's work.
  template <typename Seq, typename... Args>
  struct Replay;
  template <std::size_t... I, typename... Args>
  struct Replay<std::index_sequence<I...>, Args...> {
    static PyObject *Call(PyObject *const *py_args, Py_ssize_t) {
      try {
        std::tuple<std::decay_t<Args>...> a{
            detail::ReplayFromPython<Derived, std::decay_t<Args>>(py_args[I])...};
        (void)py_args;
        return detail::ReplayToPython<Derived>(
            Prepare(detail::Runtime::Get(), std::index_sequence<I...>{}, static_cast<Args &&>(std::get<I>(a))...));
      } catch (...) {
        detail::Binding<Derived>::SetErrorFromCurrentException();
        return nullptr;
      }
    }
    static constexpr detail::ReplayTarget kTarget{&Call, static_cast<Py_ssize_t>(sizeof...(Args)),
                                                  detail::kReplayAbi, &detail::SwapNoPython};
  };

  static constexpr bool kViews = detail::AcceptsViews<Derived>::value;
  static constexpr bool kConst = detail::ConstArgs<Derived>::value;

 public:
  // What Derived's calls showed of writes into its arguments, one per type (call_rules.h WriteKnowledge):
  // decides whether a call keeps the arguments a write would be refused for. Public for the XLA FFI
  // handlers (xla_ffi.h), which read and teach the same knowledge.
  static detail::WriteState *Writes() {
    static detail::WriteState state{detail::kWritesUnknown};
    return &state;
  }

 private:
  template <std::size_t... I, typename... Args>
  static auto Prepare(const detail::Runtime &rt, std::index_sequence<I...>, Args &&...args) {
    std::array<Tensor *, sizeof...(Args) + 1> originals{};
    std::array<TensorPtr, sizeof...(Args) + 1> copies;
    detail::ArgCopies made(originals.data(), copies.data(), sizeof...(Args));
    return Run(rt, originals.data(), detail::ForwardArg<kViews, kConst>(std::forward<Args>(args), made, I)...);
  }

  // Forward and Backward are called only when FunctionChecks (detail/function_checks.h) found them
  // callable; otherwise its static_assert is the one error the compiler reports for them.
  template <typename... Args>
  static auto Run(const detail::Runtime &rt, Tensor *const *originals, Args &&...args) {
    if constexpr (detail::FunctionChecks<Derived, Args...>::ok) {
      return RunChecked(rt, originals, std::forward<Args>(args)...);
    } else {
      return TensorPtr();
    }
  }

  // The part of Apply that needs T: the argument list, Forward's call; the rest is RunFunction.
  template <typename... Args>
  static auto RunChecked(const detail::Runtime &rt, Tensor *const *originals, Args &&...args) {
    using R = decltype(Derived::Forward(std::declval<AutogradContext *>(), std::forward<Args>(args)...));
    constexpr std::size_t kN = sizeof...(Args);
    const std::array<Tensor *, kN + 1> in{{detail::TensorArg(args)..., nullptr}};
    const detail::FfiApplyRunner *ffi = detail::InFfiRun();  // an XLA FFI handler's runner (ffi_bound.h)
    if constexpr ((std::is_same_v<std::decay_t<Args>, TensorPtrList> || ...)) {
      if (ffi == nullptr && detail::GradEnabled(rt)) {
        std::size_t index = 0;
        (detail::CheckListArg(args, index++, detail::FunctionName<Derived>()), ...);
      }
    }
    std::tuple<Args &&...> call(std::forward<Args>(args)...);
    const detail::FunctionCall f{&detail::FunctionName<Derived>(),
                                 in.data(),
                                 originals,
                                 kN,
                                 &ForwardCaller<R, std::index_sequence_for<Args...>, Args...>::Call,
                                 &call,
                                 &BackwardThunk,
                                 &detail::Binding<Derived>::SetErrorFromCurrentException,
                                 &detail::FunctionNamePy<Derived>,
                                 Writes()};
    R out;
    if (ffi != nullptr) {
      if constexpr (std::is_same_v<R, TensorPtr>) {
        ffi->run(ffi->state, f, &out, nullptr);
      } else {
        ffi->run(ffi->state, f, nullptr, &out);
      }
    } else if constexpr (std::is_same_v<R, TensorPtr>) {
      detail::RunFunction(rt, f, &out, nullptr);
    } else {
      detail::RunFunction(rt, f, nullptr, &out);
    }
    return out;
  }

  // detail::ForwardFn for one argument list: T::Forward on the arguments, checked against
  // T::InferShape under OPBUILDER_DEBUG_CHECKS when T declares one.
  template <typename R, typename Seq, typename... Args>
  struct ForwardCaller;
  template <typename R, std::size_t... I, typename... Args>
  struct ForwardCaller<R, std::index_sequence<I...>, Args...> {
    static void Call(AutogradContext *ctx, void *call, TensorPtr *single, TensorPtrList *list) {
      auto &t = *static_cast<std::tuple<Args &&...> *>(call);
      [[maybe_unused]] std::optional<detail::InferredShapes> inferred;
      if constexpr (detail::kDeclaresInferShape<Derived>) {
        if constexpr (detail::InferShapeChecks<Derived, R, Args...>::ok) {
          if (detail::DebugChecks()) {
            inferred.emplace();
            inferred->shapes = detail::ShapeList(Derived::InferShape(std::get<I>(t)...));
            inferred->dtype = detail::OutputDtype(std::get<I>(t)...);
          }
        }
      }
      R out = Derived::Forward(ctx, std::forward<Args>(std::get<I>(t))...);
      if constexpr (detail::kDeclaresInferShape<Derived>) {
        if (inferred) detail::CheckInferredShapes(ctx->function_name(), *inferred, detail::AsList(out));
      }
      if constexpr (std::is_same_v<R, TensorPtr>) {
        *single = std::move(out);
        (void)list;
      } else {
        *list = std::move(out);
        (void)single;
      }
    }
  };

 private:
  static TensorPtrList BackwardThunk(AutogradContext *ctx, TensorPtrList grads) {
    detail::PrepareBackward(*ctx, grads, kViews);
    return Derived::Backward(ctx, std::move(grads));
  }
};

}  // namespace opbuilder

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#if __has_include("../../src/core/autograd.cpp")
#include "../../src/core/autograd.cpp"
#else  // a copy of these headers (vendored): the installed ones' sources, found from the include path
#include "../src/core/autograd.cpp"
#endif
#endif
