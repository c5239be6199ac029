// A Function<T>'s optional shape rule:
//
//   static ShapeVector InferShape(const TensorPtr &x, const TensorPtr &y);  // Forward's arguments minus ctx
//   (std::vector<ShapeVector> when Forward returns TensorPtrList, one shape per output)
//
// It reads only shapes and dtypes of its tensor arguments, so Python can ask for the output shapes
// without running the kernel (Function<T>::InferShapeFunction(), bound as "<name>_infer_shape":
// to_torch's fake kernel, to_jax's result shapes). Outputs take the dtype of the first tensor
// argument, unless InferShape returns OutputSpec (std::vector<OutputSpec>: one per output), which
// names each output's dtype too: {shape, kInt64} for an index output. In a debug build
// (debug_mode=True) or with OPBUILDER_DEBUG set, Apply checks every output against it; to_torch
// checks every eager call's outputs against it.
#pragma once

#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "opbuilder/detail/visibility.h"
#include "opbuilder/tensor.h"

namespace opbuilder {

// One output as InferShape describes it when its dtype is not the first tensor argument's.
struct OutputSpec {
  ShapeVector shape;
  DataType dtype;
};

namespace detail OB_HIDDEN {
namespace infer_shape {

// T declares a member named InferShape (of any kind): looked up in a class derived from T and a
// decoy that declares it too, the name is then ambiguous (as function_checks.h does for Forward).
struct Decoy {
  static void InferShape();
};
template <typename T>
struct WithDecoy : T, Decoy {};
template <typename T, typename = void>
struct Declared : std::true_type {};
template <typename T>
struct Declared<T, std::void_t<decltype(&WithDecoy<T>::InferShape)>> : std::false_type {};
template <typename T, typename = void>
struct DeclaredInFinal : std::false_type {};  // a final class cannot be derived from
template <typename T>
struct DeclaredInFinal<T, std::void_t<decltype(&T::InferShape)>> : std::true_type {};

template <typename Void, typename T, typename... A>
struct Call {
  static constexpr bool callable = false;
  using type = void;
};
template <typename T, typename... A>
struct Call<std::void_t<decltype(T::InferShape(std::declval<A &>()...))>, T, A...> {
  static constexpr bool callable = true;
  using type = std::decay_t<decltype(T::InferShape(std::declval<A &>()...))>;
};

}  // namespace infer_shape

template <typename T>
constexpr bool kDeclaresInferShape =
    std::conditional_t<std::is_final_v<T>, infer_shape::DeclaredInFinal<T>, infer_shape::Declared<T>>::value;

// Instantiated when T declares InferShape, with Forward's return type R and its arguments.
template <typename T, typename R, typename... Args>
struct InferShapeChecks {
  using C = infer_shape::Call<void, T, Args...>;
  using Want = std::conditional_t<std::is_same_v<R, TensorPtr>, ShapeVector, std::vector<ShapeVector>>;
  using WantSpec = std::conditional_t<std::is_same_v<R, TensorPtr>, OutputSpec, std::vector<OutputSpec>>;
  static_assert(C::callable,
                "Function<T>: T::InferShape cannot be called with Forward's arguments (without the "
                "AutogradContext *): it must be static and take the parameters Forward takes after ctx (T is "
                "named in the 'In instantiation of InferShapeChecks<T, ...>' line)");
  static constexpr bool returns_ok =
      std::is_same_v<typename C::type, Want> || std::is_same_v<typename C::type, WantSpec>;
  static_assert(!C::callable || returns_ok,
                "Function<T>: T::InferShape must return ShapeVector when Forward returns TensorPtr, and "
                "std::vector<ShapeVector> (one shape per output) when Forward returns TensorPtrList (or "
                "OutputSpec and std::vector<OutputSpec>, to name each output's dtype)");
  static constexpr bool ok = C::callable && returns_ok;
};

// A debug build (CustomOpBuilder(debug_mode=True): -O0, no __OPTIMIZE__) or OPBUILDER_DEBUG set (not
// empty, not "0"): Apply checks Forward's outputs against InferShape.
inline bool DebugChecks() {
#if !defined(__OPTIMIZE__)
  return true;
#else
  static const bool on = [] {
    const char *v = std::getenv("OPBUILDER_DEBUG");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
#endif
}

// One output as InferShape gave it: its shape, and its dtype when InferShape named one (OutputSpec).
struct InferredOutput {
  ShapeVector shape;
  std::optional<DataType> dtype;
};

inline std::vector<InferredOutput> ShapeList(ShapeVector s) { return {InferredOutput{std::move(s), std::nullopt}}; }
inline std::vector<InferredOutput> ShapeList(std::vector<ShapeVector> s) {
  std::vector<InferredOutput> out;
  out.reserve(s.size());
  for (auto &e : s) out.push_back(InferredOutput{std::move(e), std::nullopt});
  return out;
}
inline std::vector<InferredOutput> ShapeList(OutputSpec s) { return {InferredOutput{std::move(s.shape), s.dtype}}; }
inline std::vector<InferredOutput> ShapeList(std::vector<OutputSpec> s) {
  std::vector<InferredOutput> out;
  out.reserve(s.size());
  for (auto &e : s) out.push_back(InferredOutput{std::move(e.shape), e.dtype});
  return out;
}

// The dtype of the first tensor among Forward's arguments (float32 if there is none).
template <typename A>
void FirstDtype(const A &a, std::optional<DataType> *dt) {
  if (*dt) return;
  using D = std::decay_t<A>;
  if constexpr (std::is_same_v<D, TensorPtr>) {
    if (a) *dt = a->dtype();
  } else if constexpr (std::is_same_v<D, std::optional<TensorPtr>>) {
    if (a && *a) *dt = (*a)->dtype();
  } else if constexpr (std::is_same_v<D, TensorPtrList>) {
    for (const auto &t : a) {
      if (t) {
        *dt = t->dtype();
        return;
      }
    }
  }
}
template <typename... A>
DataType OutputDtype(const A &...args) {
  std::optional<DataType> dt;
  (FirstDtype(args, &dt), ...);
  return dt.value_or(kFloat32);
}

// An output's shape and dtype without its data: one zeroed element seen at every index.
OB_CORE_FN TensorPtr MetaTensor(DataType dtype, ShapeVector shape);

// An output InferShape described, as a MetaTensor: its dtype, else `first` (the first tensor argument's).
inline TensorPtr MetaTensor(DataType first, InferredOutput o) {
  return MetaTensor(o.dtype.value_or(first), std::move(o.shape));
}

// What InferShape said for one call, to check Forward's outputs against (OPBUILDER_DEBUG).
struct InferredShapes {
  std::vector<InferredOutput> shapes;
  DataType dtype = kFloat32;  // the first tensor argument's: outputs without a dtype of their own take it
};

OB_CORE_FN void CheckInferredShapes(const std::string &name, const InferredShapes &want, const TensorPtrList &outs);

}  // namespace detail
}  // namespace opbuilder

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#if __has_include("../../../src/core/infer_shape.cpp")
#include "../../../src/core/infer_shape.cpp"
#else  // a copy of these headers (vendored): the installed ones' sources, found from the include path
#include "../src/core/infer_shape.cpp"
#endif
#endif
