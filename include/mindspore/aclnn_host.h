// custom::CustomLaunchAclnn on the host: the aclnn operators MindSpore's tutorials launch on Ascend,
// computed on the CPU, so a source written for MindSpore's ms_extension.h runs with backend="CPU"
// unchanged. Only ms_extension.h includes this header.
//
//   custom::CustomLaunchAclnn("aclnnMul", {x, y}, {out});
//   custom::CustomLaunchAclnn("aclnnAdd", {x, y, MakeValue<int64_t>(1)}, {out});   // alpha: x + 1 * y
//   custom::CustomLaunchAclnn("aclnnReduceSum", {x, MakeValue(std::vector<int64_t>{0}), MakeValue(false),
//                                                MakeValue(kNumberTypeFloat32)}, {out});
//
// Arguments come in aclnn's order (the inputs, then the outputs). Elementwise operators broadcast
// their inputs to `out`'s shape, which must be exactly the broadcast shape. Floating results are
// computed in double and rounded once to out's dtype; integer results in wrapping int64. A bad call
// (unknown operator, wrong arguments, shapes or dtypes) throws std::invalid_argument (ValueError).
//
// Everything below is a template or inline function: a source that includes ms_extension.h without
// calling CustomLaunchAclnn generates no code for it.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "opbuilder/dtype.h"
#include "opbuilder/tensor.h"

namespace mindspore {
namespace custom {

// One argument of an aclnn call: a tensor (nullptr: an absent optional tensor), a scalar, an int list
// (aclIntArray: dims), or a dtype (aclDataType). MindSpore passes these as ValuePtr; here a value.
class AclnnArg {
 public:
  enum class Kind { kTensor, kFloat, kInt, kBool, kInts, kDtype };

  AclnnArg(opbuilder::TensorPtr t) : kind_(Kind::kTensor), tensor_(std::move(t)) {}  // NOLINT
  AclnnArg(std::nullptr_t) : kind_(Kind::kTensor) {}                                 // NOLINT
  template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  AclnnArg(T v)  // NOLINT: bool, integers, floating point
      : kind_(std::is_same_v<T, bool> ? Kind::kBool : std::is_integral_v<T> ? Kind::kInt : Kind::kFloat),
        int_(std::is_integral_v<T> ? static_cast<std::int64_t>(v) : 0), float_(static_cast<double>(v)) {}
  AclnnArg(std::vector<std::int64_t> v) : kind_(Kind::kInts), ints_(std::move(v)) {}  // NOLINT
  AclnnArg(opbuilder::DataType t) : kind_(Kind::kDtype), dtype_(t) {}                 // NOLINT

  Kind kind() const { return kind_; }
  const opbuilder::TensorPtr &tensor() const { return tensor_; }
  std::int64_t int_value() const { return int_; }
  double float_value() const { return float_; }
  const std::vector<std::int64_t> &ints() const { return ints_; }
  opbuilder::DataType dtype() const { return dtype_; }

 private:
  Kind kind_;
  opbuilder::TensorPtr tensor_;
  std::int64_t int_ = 0;
  double float_ = 0.0;
  std::vector<std::int64_t> ints_;
  opbuilder::DataType dtype_ = opbuilder::kTypeUnknown;
};

}  // namespace custom
}  // namespace mindspore

#include "mindspore/detail/aclnn_kernels.h"  // needs AclnnArg; CustomLaunchAclnn needs it

namespace mindspore {
namespace custom {

// MindSpore's custom::CustomLaunchAclnn(aclnn_name, inputs, outputs), run on the host: see the top of
// this file. An unknown operator is a std::invalid_argument naming it and the supported ones.
template <typename Outputs = opbuilder::TensorPtrList>
void CustomLaunchAclnn(const std::string &aclnn_name, const std::vector<AclnnArg> &inputs, const Outputs &outputs) {
  namespace h = aclnn_host;
  using U = h::Unary;
  using B = h::Binary;
  static const std::pair<const char *, U> kUnary[] = {
      {"aclnnNeg", U::kNeg}, {"aclnnExp", U::kExp}, {"aclnnLog", U::kLog}, {"aclnnSqrt", U::kSqrt},
      {"aclnnAbs", U::kAbs}, {"aclnnRelu", U::kRelu}, {"aclnnSigmoid", U::kSigmoid}, {"aclnnTanh", U::kTanh}};
  static const std::pair<const char *, B> kBinary[] = {
      {"aclnnAdd", B::kAdd}, {"aclnnSub", B::kSub}, {"aclnnMul", B::kMul}, {"aclnnDiv", B::kDiv}};
  const opbuilder::TensorPtrList outs(outputs.begin(), outputs.end());
  for (const auto &e : kUnary) {
    if (aclnn_name == e.first) return h::RunUnary(aclnn_name, e.second, inputs, outs);
  }
  for (const auto &e : kBinary) {
    if (aclnn_name == e.first) return h::RunBinary(aclnn_name, e.second, false, inputs, outs);
    if (aclnn_name == std::string(e.first) + "s") return h::RunBinary(aclnn_name, e.second, true, inputs, outs);
  }
  if (aclnn_name == "aclnnReduceSum") return h::RunReduceSum(aclnn_name, inputs, outs);
  if (aclnn_name == "aclnnMatmul") return h::RunMatmul(aclnn_name, inputs, outs);
  throw std::invalid_argument("CustomLaunchAclnn: unknown aclnn operator '" + aclnn_name +
                              "'; supported on the host: " + h::kSupported);
}

}  // namespace custom

// MindSpore's MakeValue and ValuePtrList, as far as CustomLaunchAclnn's arguments need them.
using ValuePtr = custom::AclnnArg;
using ValuePtrList = std::vector<custom::AclnnArg>;
template <typename T>
custom::AclnnArg MakeValue(T v) {
  return custom::AclnnArg(std::move(v));
}

}  // namespace mindspore
