// Compile-time checks of a Function<T>: that T declares Forward and Backward
// with signatures Apply can call. Each failure is one static_assert inside
// FunctionChecks<T, Args...>, so the compiler's "In instantiation of" line
// names the user's class T (a static_assert message cannot), and the builder
// shows that line with the assertion (opbuilder/compile/ninja_run.py). Apply calls
// Forward and Backward only when every check passes, so a failed check is the
// only error reported for it.
#pragma once

#include <type_traits>
#include <utility>

#include "opbuilder/detail/visibility.h"
#include "opbuilder/tensor.h"

namespace opbuilder {

class AutogradContext;

namespace detail OB_HIDDEN {
namespace function_checks {

// T has a member named Forward (Backward) of any kind, overloaded or a template included: looking
// the name up in a class derived from T and from a decoy that declares it is then ambiguous.
struct ForwardDecoy {
  static void Forward();
};
struct BackwardDecoy {
  static void Backward();
};
template <typename T, typename Decoy>
struct Both : T, Decoy {};

template <typename T, typename = void>
struct HasForward : std::true_type {};
template <typename T>
struct HasForward<T, std::void_t<decltype(&Both<T, ForwardDecoy>::Forward)>> : std::false_type {};
template <typename T, typename = void>
struct HasBackward : std::true_type {};
template <typename T>
struct HasBackward<T, std::void_t<decltype(&Both<T, BackwardDecoy>::Backward)>> : std::false_type {};

// A final class cannot be derived from: the name is then taken as present, and the call checks say the rest.
template <typename T>
constexpr bool kHasForward = std::is_final_v<T> || HasForward<T>::value;
template <typename T>
constexpr bool kHasBackward = std::is_final_v<T> || HasBackward<T>::value;

// What T::Forward(ctx, args...) returns, if it can be called so (void_t in the first slot, as the
// arguments are a pack).
template <typename Void, typename T, typename... A>
struct ForwardCall {
  static constexpr bool callable = false;
  using type = void;
};
template <typename T, typename... A>
struct ForwardCall<std::void_t<decltype(T::Forward(std::declval<AutogradContext *>(), std::declval<A>()...))>, T,
                   A...> {
  static constexpr bool callable = true;
  using type = decltype(T::Forward(std::declval<AutogradContext *>(), std::declval<A>()...));
};

template <typename T, typename = void>
struct BackwardCall {
  static constexpr bool callable = false;
  using type = void;
};
template <typename T>
struct BackwardCall<T, std::void_t<decltype(T::Backward(std::declval<AutogradContext *>(),
                                                        std::declval<TensorPtrList>()))>> {
  static constexpr bool callable = true;
  using type = decltype(T::Backward(std::declval<AutogradContext *>(), std::declval<TensorPtrList>()));
};

}  // namespace function_checks

// Instantiated by Function<T>::Apply with T and the arguments Forward will be given; `ok` when
// Forward and Backward can be called as Apply calls them.
template <typename T, typename... Args>
struct FunctionChecks {
  using Fwd = function_checks::ForwardCall<void, T, Args...>;
  using Bwd = function_checks::BackwardCall<T>;
  static constexpr bool has_forward = function_checks::kHasForward<T>;
  static constexpr bool forward_ok = has_forward && Fwd::callable;
  static constexpr bool returns_ok =
      !forward_ok || std::is_same_v<typename Fwd::type, TensorPtr> || std::is_same_v<typename Fwd::type, TensorPtrList>;
  static constexpr bool has_backward = function_checks::kHasBackward<T>;
  static constexpr bool backward_ok = has_backward && Bwd::callable;
  static constexpr bool backward_returns_ok =
      !backward_ok || std::is_convertible_v<typename Bwd::type, TensorPtrList>;

  static_assert(has_forward,
                "Function<T>: T has no Forward. Declare it in T (T is named in the 'In instantiation of "
                "FunctionChecks<T, ...>' line): static TensorPtr Forward(AutogradContext *ctx, <the arguments "
                "given to Apply>) (or returning TensorPtrList)");
  static_assert(!has_forward || forward_ok,
                "Function<T>: T::Forward cannot be called as T::Forward(AutogradContext *ctx, <the arguments given "
                "to Apply>): it must be static, take AutogradContext * first, then parameters that accept Apply's "
                "arguments (T and the arguments are named in the 'In instantiation of FunctionChecks<T, Args...>' "
                "line)");
  static_assert(returns_ok, "Function<T>: T::Forward must return TensorPtr or TensorPtrList");
  static_assert(has_backward,
                "Function<T>: T has no Backward. Declare it in T (T is named in the 'In instantiation of "
                "FunctionChecks<T, ...>' line): static TensorPtrList Backward(AutogradContext *ctx, "
                "TensorPtrList grad_outputs)");
  static_assert(!has_backward || backward_ok,
                "Function<T>: T::Backward cannot be called as T::Backward(AutogradContext *ctx, TensorPtrList "
                "grad_outputs): it must be static and take exactly these (T is named in the 'In instantiation of "
                "FunctionChecks<T, ...>' line)");
  static_assert(backward_returns_ok,
                "Function<T>: T::Backward must return TensorPtrList (one gradient per Forward argument, nullptr "
                "for none)");

  static constexpr bool ok = forward_ok && returns_ok && backward_ok && backward_returns_ok;
};

}  // namespace detail
}  // namespace opbuilder
