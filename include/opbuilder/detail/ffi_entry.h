// A Function<T>'s Forward and Backward on tensor lists, as plain function pointers, for handler code
// compiled once and not per Function: OB_XLA_FFI's handlers (xla_ffi_handlers.h Handlers) run a
// Function through its FfiEntry. (to_jax's generic handlers run the whole module function instead:
// detail/ffi_bound.h.) Not for operator authors.
//
// A Function has an entry for each argument list whose every argument is a TensorPtr (XLA passes
// buffers only). Only a module that includes opbuilder/xla_ffi.h compiles one (OB_XLA_FFI's
// EntryOfForward): every other operator pays nothing for it.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "opbuilder/detail/binding.h"
#include "opbuilder/detail/call_rules.h"
#include "opbuilder/detail/function_checks.h"
#include "opbuilder/detail/tensor_details.h"
#include "opbuilder/tensor.h"

// Included by autograd.h after detail/function_details.h (AsList, FunctionName, AcceptsViews).
namespace opbuilder {
namespace detail OB_HIDDEN {

// Bumped whenever a field of FfiEntry changes: a caller refuses an entry of another number.
constexpr std::uint64_t kFfiEntryAbi = 0x0b0ff1e000000003ull;

struct FfiEntry {
  std::uint64_t abi;  // kFfiEntryAbi
  std::size_t nargs;  // Forward's arguments after ctx, every one a TensorPtr
  bool views;         // T declares kAcceptsViews
  const std::string &(*name)();
  WriteState *(*writes)();            // Function<T>::Writes: what the runtime's calls showed
  WriteState *(*forward_writes)();    // the same for the FFI forward handler's calls (they record nothing)
  WriteState *(*cotangent_writes)();  // what T::Backward showed of writes into the cotangents it got
  // T::Forward(ctx, in[0], ..., in[nargs - 1]) into *out. While it runs, new host tensors of an offered
  // size are built in that buffer (OfferedBuffers) and NoPythonHandler() is `where` (which
  // names the caller). Throws what Forward throws.
  void (*forward)(AutogradContext *ctx, const TensorPtr *in, TensorPtrList *out, const OfferedBuffers *offer,
                  const char *where);
  // T::Backward(ctx, *grads) into *out, on the same terms.
  void (*backward)(AutogradContext *ctx, TensorPtrList *grads, TensorPtrList *out, const OfferedBuffers *offer,
                   const char *where);
};

// While alive: this module's Offered() is `offer` and its NoPythonHandler() is `where`.
class FfiCallScope {
 public:
  FfiCallScope(const OfferedBuffers *offer, const char *where) : offered_(Offered()), where_(NoPythonHandler()) {
    if (offer != nullptr) Offered() = *offer;
    NoPythonHandler() = where;
  }
  ~FfiCallScope() {
    Offered() = offered_;
    NoPythonHandler() = where_;
  }
  FfiCallScope(const FfiCallScope &) = delete;
  FfiCallScope &operator=(const FfiCallScope &) = delete;

 private:
  OfferedBuffers offered_;
  const char *where_;
};

// const TensorPtr & for each index (a class member, not an alias: nvcc's front end takes an alias that
// ignores its parameter for no parameter pack at all)
template <std::size_t>
struct FfiArg {
  using type = const TensorPtr &;
};

// Whether T::Forward takes ctx and one const TensorPtr & per index.
template <typename T, typename Seq, typename = void>
struct FfiCallable : std::false_type {};
template <typename T, std::size_t... I>
struct FfiCallable<T, std::index_sequence<I...>,
                   std::void_t<decltype(T::Forward(std::declval<AutogradContext *>(),
                                                   std::declval<typename FfiArg<I>::type>()...))>>
    : std::true_type {};

// Whether T is a Function Apply accepts with `Args` (function_checks.h's conditions, without its
// static_asserts, which Apply's own FunctionChecks raises once): an entry for an invalid T would add
// errors after that one.
template <typename T, typename... Args>
constexpr bool FfiValid() {
  using Fwd = function_checks::ForwardCall<void, T, Args...>;
  using Bwd = function_checks::BackwardCall<T>;
  if constexpr (function_checks::kHasForward<T> && function_checks::kHasBackward<T> && Fwd::callable &&
                Bwd::callable) {
    return (std::is_same_v<typename Fwd::type, TensorPtr> || std::is_same_v<typename Fwd::type, TensorPtrList>) &&
           std::is_convertible_v<typename Bwd::type, TensorPtrList>;
  } else {
    return false;
  }
}

template <typename T>
WriteState *FfiForwardWrites() {
  static WriteState state{kWritesUnknown};
  return &state;
}
template <typename T>
WriteState *FfiCotangentWrites() {
  static WriteState state{kWritesUnknown};
  return &state;
}

template <typename T, typename Seq>
struct FfiEntryOf;
template <typename T, std::size_t... I>
struct FfiEntryOf<T, std::index_sequence<I...>> {
  static void Forward(AutogradContext *ctx, const TensorPtr *in, TensorPtrList *out, const OfferedBuffers *offer,
                      const char *where) {
    FfiCallScope scope(offer, where);
    (void)in;
    *out = AsList(T::Forward(ctx, in[I]...));
  }
  static void Backward(AutogradContext *ctx, TensorPtrList *grads, TensorPtrList *out, const OfferedBuffers *offer,
                       const char *where) {
    FfiCallScope scope(offer, where);
    *out = T::Backward(ctx, std::move(*grads));
  }
  static constexpr FfiEntry kEntry{kFfiEntryAbi,
                                   sizeof...(I),
                                   AcceptsViews<T>::value,
                                   &FunctionName<T>,
                                   &T::Writes,
                                   &FfiForwardWrites<T>,
                                   &FfiCotangentWrites<T>,
                                   &Forward,
                                   &Backward};
};

// The entry of T for Apply's argument types `Args` (decayed), or nullptr when one is not a TensorPtr.
template <typename T, typename... Args>
constexpr const FfiEntry *FfiEntryFor() {
  if constexpr (sizeof...(Args) > 0 && (std::is_same_v<Args, TensorPtr> && ...) && FfiValid<T, Args...>()) {
    if constexpr (FfiCallable<T, std::index_sequence_for<Args...>>::value) {
      return &FfiEntryOf<T, std::index_sequence_for<Args...>>::kEntry;
    } else {
      return nullptr;
    }
  } else {
    return nullptr;
  }
}

}  // namespace detail
}  // namespace opbuilder
