// The host kernels behind custom::CustomLaunchAclnn (aclnn_host.h): elementwise unary and binary
// operators with broadcasting, ReduceSum and Matmul, on any host dtype, with their checks. Every
// function is a template or inline: a source that never calls CustomLaunchAclnn generates no code
// for them. Included by aclnn_host.h only, after AclnnArg.
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

namespace aclnn_host {

using opbuilder::DataType;
using opbuilder::ShapeVector;
using opbuilder::TensorPtr;

// The operators CustomLaunchAclnn knows, as the error for an unknown one lists them.
inline constexpr const char *kSupported =
    "aclnnAbs, aclnnAdd, aclnnAdds, aclnnDiv, aclnnDivs, aclnnExp, aclnnLog, aclnnMatmul, aclnnMul, aclnnMuls, "
    "aclnnNeg, aclnnReduceSum, aclnnRelu, aclnnSigmoid, aclnnSqrt, aclnnSub, aclnnSubs, aclnnTanh";

[[noreturn]] inline void Fail(const std::string &op, const std::string &what) {
  throw std::invalid_argument(op + ": " + what);
}

inline std::string ShapeStr(const ShapeVector &s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// One operand as the kernels see it: its first byte, dtype, and per-dimension byte strides over the
// iteration shape (0 where it broadcasts).
struct View {
  const char *base;
  DataType dtype;
  std::vector<std::int64_t> strides;
};

template <typename V = void>
double LoadF(const char *p, DataType t) {
  switch (t) {
    case opbuilder::kBool: return *reinterpret_cast<const bool *>(p) ? 1.0 : 0.0;
    case opbuilder::kInt8: return *reinterpret_cast<const std::int8_t *>(p);
    case opbuilder::kInt16: return *reinterpret_cast<const std::int16_t *>(p);
    case opbuilder::kInt32: return *reinterpret_cast<const std::int32_t *>(p);
    case opbuilder::kInt64: return static_cast<double>(*reinterpret_cast<const std::int64_t *>(p));
    case opbuilder::kUInt8: return *reinterpret_cast<const std::uint8_t *>(p);
    case opbuilder::kUInt16: return *reinterpret_cast<const std::uint16_t *>(p);
    case opbuilder::kUInt32: return *reinterpret_cast<const std::uint32_t *>(p);
    case opbuilder::kUInt64: return static_cast<double>(*reinterpret_cast<const std::uint64_t *>(p));
    case opbuilder::kFloat16: return opbuilder::Half::ToFloat(*reinterpret_cast<const std::uint16_t *>(p));
    case opbuilder::kBFloat16: return opbuilder::bfloat16::ToFloat(*reinterpret_cast<const std::uint16_t *>(p));
    case opbuilder::kFloat32: return *reinterpret_cast<const float *>(p);
    default: return *reinterpret_cast<const double *>(p);
  }
}

template <typename V = void>
std::int64_t LoadI(const char *p, DataType t) {  // integer and bool dtypes only
  switch (t) {
    case opbuilder::kBool: return *reinterpret_cast<const bool *>(p) ? 1 : 0;
    case opbuilder::kInt8: return *reinterpret_cast<const std::int8_t *>(p);
    case opbuilder::kInt16: return *reinterpret_cast<const std::int16_t *>(p);
    case opbuilder::kInt32: return *reinterpret_cast<const std::int32_t *>(p);
    case opbuilder::kUInt8: return *reinterpret_cast<const std::uint8_t *>(p);
    case opbuilder::kUInt16: return *reinterpret_cast<const std::uint16_t *>(p);
    case opbuilder::kUInt32: return *reinterpret_cast<const std::uint32_t *>(p);
    default: return *reinterpret_cast<const std::int64_t *>(p);  // int64, and uint64 wrapped
  }
}

template <typename V = void>
void StoreF(char *p, DataType t, double v) {  // floating dtypes only
  switch (t) {
    case opbuilder::kFloat16: *reinterpret_cast<std::uint16_t *>(p) = opbuilder::Half::FromFloat(static_cast<float>(v)); break;
    case opbuilder::kBFloat16:
      *reinterpret_cast<std::uint16_t *>(p) = opbuilder::bfloat16::FromFloat(static_cast<float>(v));
      break;
    case opbuilder::kFloat32: *reinterpret_cast<float *>(p) = static_cast<float>(v); break;
    default: *reinterpret_cast<double *>(p) = v;
  }
}

template <typename V = void>
void StoreI(char *p, DataType t, std::int64_t v) {  // integer dtypes only: wraps as a C++ cast does
  switch (t) {
    case opbuilder::kInt8: *reinterpret_cast<std::int8_t *>(p) = static_cast<std::int8_t>(v); break;
    case opbuilder::kInt16: *reinterpret_cast<std::int16_t *>(p) = static_cast<std::int16_t>(v); break;
    case opbuilder::kInt32: *reinterpret_cast<std::int32_t *>(p) = static_cast<std::int32_t>(v); break;
    case opbuilder::kUInt8: *reinterpret_cast<std::uint8_t *>(p) = static_cast<std::uint8_t>(v); break;
    case opbuilder::kUInt16: *reinterpret_cast<std::uint16_t *>(p) = static_cast<std::uint16_t>(v); break;
    case opbuilder::kUInt32: *reinterpret_cast<std::uint32_t *>(p) = static_cast<std::uint32_t>(v); break;
    default: *reinterpret_cast<std::int64_t *>(p) = v;  // int64, and uint64 wrapped
  }
}

// Wrapping int64 arithmetic (signed overflow is undefined in C++; aclnn wraps).
inline std::int64_t WAdd(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}
inline std::int64_t WMul(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
}
inline std::int64_t WNeg(std::int64_t a) { return static_cast<std::int64_t>(0u - static_cast<std::uint64_t>(a)); }

// A tensor checked for the host: present, in host memory.
template <typename V = void>
const TensorPtr &CheckHost(const std::string &op, const TensorPtr &t, const char *role) {
  if (!t) Fail(op, std::string(role) + " is a null tensor");
  if (opbuilder::IsComplex(t->dtype())) {
    Fail(op, std::string(role) + " has dtype " + opbuilder::DataTypeName(t->dtype()) + "; complex is not supported");
  }
  if (t->is_cuda()) {
    Fail(op, std::string(role) + " is on " + t->device() + "; CustomLaunchAclnn runs on the host (cpu)");
  }
  return t;
}

template <typename V = void>
const TensorPtr &HostTensor(const std::string &op, const AclnnArg &a, const char *role) {
  if (a.kind() != AclnnArg::Kind::kTensor) Fail(op, std::string(role) + " must be a tensor");
  return CheckHost(op, a.tensor(), role);
}

// The output checked: a writable host tensor of a numeric dtype; floating-only ops need a float out.
template <typename V = void>
const TensorPtr &OutTensor(const std::string &op, const opbuilder::TensorPtrList &outputs, bool float_only) {
  if (outputs.size() != 1) Fail(op, "expected 1 output tensor, got " + std::to_string(outputs.size()));
  const TensorPtr &out = CheckHost(op, outputs[0], "out");
  if (!out->is_writable()) Fail(op, "out is read-only");
  if (out->dtype() == opbuilder::kBool) Fail(op, "out of dtype bool is not supported");
  if (float_only && !opbuilder::IsFloating(out->dtype())) {
    Fail(op, std::string("out has dtype ") + opbuilder::DataTypeName(out->dtype()) +
                 "; it must be float16, float32 or float64");
  }
  return out;
}

// An integer out takes only integer and bool inputs (aclnn does not cast floating results down).
template <typename V = void>
void CheckIntegerInputs(const std::string &op, const TensorPtr &out, const std::vector<TensorPtr> &ins) {
  if (opbuilder::IsFloating(out->dtype())) return;
  for (const auto &t : ins) {
    if (opbuilder::IsFloating(t->dtype())) {
      Fail(op, std::string("a ") + opbuilder::DataTypeName(t->dtype()) + " input cannot be written to an " +
                   opbuilder::DataTypeName(out->dtype()) + " out");
    }
  }
}

// Byte strides of `t` over `shape` (t's shape aligned right; 0 where t has extent 1 or no dimension).
template <typename V = void>
std::vector<std::int64_t> BroadcastByteStrides(const TensorPtr &t, const ShapeVector &shape) {
  std::vector<std::int64_t> s(shape.size(), 0);
  const ShapeVector st = t->strides();
  const std::size_t lead = shape.size() - t->shape().size();
  for (std::size_t i = 0; i < st.size(); ++i) {
    if (t->shape()[i] != 1) s[lead + i] = st[i] * static_cast<std::int64_t>(t->element_size());
  }
  return s;
}

// Calls f(offsets) for each index of `shape` in C order; offsets[k] is views[k]'s byte offset.
template <typename F>
void ForEachIndex(const ShapeVector &shape, const std::vector<View> &views, F &&f) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  if (n == 0) return;
  const std::size_t nd = shape.size(), nv = views.size();
  std::vector<std::int64_t> idx(nd, 0), off(nv, 0);
  for (std::int64_t i = 0; i < n; ++i) {
    f(off);
    for (std::size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        for (std::size_t k = 0; k < nv; ++k) off[k] += views[k].strides[d];
        break;
      }
      for (std::size_t k = 0; k < nv; ++k) off[k] -= views[k].strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

enum class Unary { kNeg, kExp, kLog, kSqrt, kAbs, kRelu, kSigmoid, kTanh };
enum class Binary { kAdd, kSub, kMul, kDiv };

inline double ApplyF(Unary u, double x) {
  switch (u) {
    case Unary::kNeg: return -x;
    case Unary::kExp: return std::exp(x);
    case Unary::kLog: return std::log(x);
    case Unary::kSqrt: return std::sqrt(x);
    case Unary::kAbs: return std::fabs(x);
    case Unary::kRelu: return x > 0.0 ? x : (x == x ? 0.0 : x);  // NaN stays NaN
    case Unary::kSigmoid: return 1.0 / (1.0 + std::exp(-x));
    default: return std::tanh(x);
  }
}

inline std::int64_t ApplyI(Unary u, std::int64_t x) {  // Neg, Abs, Relu only
  switch (u) {
    case Unary::kNeg: return WNeg(x);
    case Unary::kAbs: return x < 0 ? WNeg(x) : x;
    default: return x > 0 ? x : 0;
  }
}

template <typename V = void>
void RunUnary(const std::string &op, Unary u, const std::vector<AclnnArg> &in, const opbuilder::TensorPtrList &outputs) {
  const bool float_only = u != Unary::kNeg && u != Unary::kAbs && u != Unary::kRelu;
  if (in.size() != 1) Fail(op, "expected 1 input (self), got " + std::to_string(in.size()));
  const TensorPtr &x = HostTensor(op, in[0], "self");
  const TensorPtr &out = OutTensor(op, outputs, float_only);
  if (x->shape() != out->shape()) {
    Fail(op, "out has shape " + ShapeStr(out->shape()) + ", self has shape " + ShapeStr(x->shape()));
  }
  CheckIntegerInputs(op, out, {x});
  const std::vector<View> v = {{static_cast<const char *>(out->data_ptr()), out->dtype(), BroadcastByteStrides(out, out->shape())},
                               {static_cast<const char *>(x->data_ptr()), x->dtype(), BroadcastByteStrides(x, out->shape())}};
  char *po = static_cast<char *>(out->data_ptr());
  const char *px = v[1].base;
  const DataType to = out->dtype(), tx = x->dtype();
  if (opbuilder::IsFloating(to)) {
    ForEachIndex(out->shape(), v, [&](const std::vector<std::int64_t> &o) { StoreF(po + o[0], to, ApplyF(u, LoadF(px + o[1], tx))); });
  } else {
    ForEachIndex(out->shape(), v, [&](const std::vector<std::int64_t> &o) { StoreI(po + o[0], to, ApplyI(u, LoadI(px + o[1], tx))); });
  }
}

inline ShapeVector BroadcastShapes(const std::string &op, const ShapeVector &a, const ShapeVector &b) {
  ShapeVector r(std::max(a.size(), b.size()), 1);
  for (std::size_t i = 0; i < r.size(); ++i) {
    const std::int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const std::int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) {
      Fail(op, "shapes " + ShapeStr(a) + " and " + ShapeStr(b) + " cannot be broadcast together");
    }
    r[r.size() - 1 - i] = da == 1 ? db : da;
  }
  return r;
}

// A scalar argument (other of aclnnAdds..., alpha): its value, and whether it is an integer (or bool).
inline bool IsScalar(const AclnnArg &a) {
  return a.kind() == AclnnArg::Kind::kFloat || a.kind() == AclnnArg::Kind::kInt || a.kind() == AclnnArg::Kind::kBool;
}

// aclnnAdd/Sub(self, other, [alpha]), aclnnMul/Div(self, other); the "s" forms take a scalar other.
template <typename V = void>
void RunBinary(const std::string &op, Binary b, bool scalar_other, const std::vector<AclnnArg> &in,
               const opbuilder::TensorPtrList &outputs) {
  const bool has_alpha = b == Binary::kAdd || b == Binary::kSub;
  const std::string form = std::string("self, ") + (scalar_other ? "other scalar" : "other") + (has_alpha ? ", alpha" : "");
  if (in.size() < 2 || in.size() > (has_alpha ? 3u : 2u)) {
    Fail(op, "expected inputs (" + form + "), got " + std::to_string(in.size()) + " inputs");
  }
  const TensorPtr &x = HostTensor(op, in[0], "self");
  const TensorPtr &out = OutTensor(op, outputs, b == Binary::kDiv);
  TensorPtr y;
  if (scalar_other) {
    if (!IsScalar(in[1])) Fail(op, "other must be a scalar");
  } else {
    y = HostTensor(op, in[1], "other");
  }
  AclnnArg alpha(std::int64_t{1});
  if (in.size() == 3) {
    if (!IsScalar(in[2])) Fail(op, "alpha must be a scalar");
    alpha = in[2];
  }
  const bool fl = opbuilder::IsFloating(out->dtype());
  CheckIntegerInputs(op, out, y ? std::vector<TensorPtr>{x, y} : std::vector<TensorPtr>{x});
  if (!fl) {
    if (scalar_other && in[1].kind() == AclnnArg::Kind::kFloat) Fail(op, "a float other cannot be used with an integer out");
    if (alpha.kind() == AclnnArg::Kind::kFloat) Fail(op, "a float alpha cannot be used with an integer out");
  }
  const ShapeVector shape = y ? BroadcastShapes(op, x->shape(), y->shape()) : x->shape();
  if (shape != out->shape()) {
    Fail(op, "out has shape " + ShapeStr(out->shape()) + ", the inputs broadcast to " + ShapeStr(shape));
  }
  std::vector<View> v = {{static_cast<const char *>(out->data_ptr()), out->dtype(), BroadcastByteStrides(out, shape)},
                         {static_cast<const char *>(x->data_ptr()), x->dtype(), BroadcastByteStrides(x, shape)}};
  if (y) v.push_back({static_cast<const char *>(y->data_ptr()), y->dtype(), BroadcastByteStrides(y, shape)});
  char *po = static_cast<char *>(out->data_ptr());
  const DataType to = out->dtype();
  if (fl) {
    const double a = alpha.float_value(), s = in[1].float_value();
    auto other = [&](const std::vector<std::int64_t> &o) { return y ? LoadF(v[2].base + o[2], v[2].dtype) : s; };
    ForEachIndex(shape, v, [&](const std::vector<std::int64_t> &o) {
      const double p = LoadF(v[1].base + o[1], v[1].dtype), q = other(o);
      double r;
      switch (b) {
        case Binary::kAdd: r = p + a * q; break;
        case Binary::kSub: r = p - a * q; break;
        case Binary::kMul: r = p * q; break;
        default: r = p / q;
      }
      StoreF(po + o[0], to, r);
    });
  } else {
    const std::int64_t a = alpha.int_value(), s = in[1].int_value();
    auto other = [&](const std::vector<std::int64_t> &o) { return y ? LoadI(v[2].base + o[2], v[2].dtype) : s; };
    ForEachIndex(shape, v, [&](const std::vector<std::int64_t> &o) {
      const std::int64_t p = LoadI(v[1].base + o[1], v[1].dtype), q = other(o);
      std::int64_t r;
      switch (b) {
        case Binary::kAdd: r = WAdd(p, WMul(a, q)); break;
        case Binary::kSub: r = WAdd(p, WNeg(WMul(a, q))); break;
        default: r = WMul(p, q);
      }
      StoreI(po + o[0], to, r);
    });
  }
}

// aclnnReduceSum(self, dim, keepDim, dtype): dim may be empty (every dimension); keepDim and dtype may
// be left out (false; out's dtype), and dtype must be out's dtype when given.
template <typename V = void>
void RunReduceSum(const std::string &op, const std::vector<AclnnArg> &in, const opbuilder::TensorPtrList &outputs) {
  if (in.empty() || in.size() > 4) {
    Fail(op, "expected inputs (self, dim, keepDim, dtype), got " + std::to_string(in.size()) + " inputs");
  }
  const TensorPtr &x = HostTensor(op, in[0], "self");
  const TensorPtr &out = OutTensor(op, outputs, false);
  const std::int64_t nd = x->ndim();
  std::vector<bool> reduced(static_cast<std::size_t>(nd), in.size() < 2);
  if (in.size() >= 2) {
    if (in[1].kind() != AclnnArg::Kind::kInts) Fail(op, "dim must be a list of integers (std::vector<int64_t>)");
    if (in[1].ints().empty()) reduced.assign(reduced.size(), true);
    for (std::int64_t d : in[1].ints()) {
      const std::int64_t w = d < 0 ? d + nd : d;
      if (w < 0 || w >= std::max<std::int64_t>(nd, 1)) {
        Fail(op, "dim " + std::to_string(d) + " is out of range for a tensor of " + std::to_string(nd) + " dimensions");
      }
      if (nd == 0) continue;
      if (reduced[static_cast<std::size_t>(w)]) Fail(op, "dim " + std::to_string(d) + " appears twice");
      reduced[static_cast<std::size_t>(w)] = true;
    }
  }
  bool keep = false;
  if (in.size() >= 3) {
    if (in[2].kind() != AclnnArg::Kind::kBool) Fail(op, "keepDim must be a bool");
    keep = in[2].int_value() != 0;
  }
  if (in.size() == 4) {
    if (in[3].kind() != AclnnArg::Kind::kDtype) Fail(op, "dtype must be a TypeId (e.g. kNumberTypeFloat32)");
    if (in[3].dtype() != out->dtype()) {
      Fail(op, std::string("dtype ") + opbuilder::DataTypeName(in[3].dtype()) + " differs from out's dtype " +
                   opbuilder::DataTypeName(out->dtype()));
    }
  }
  CheckIntegerInputs(op, out, {x});
  ShapeVector want, kept;  // out's shape; x's shape with the reduced dimensions set to 1
  for (std::int64_t d = 0; d < nd; ++d) {
    const bool r = reduced[static_cast<std::size_t>(d)];
    kept.push_back(r ? 1 : x->shape()[static_cast<std::size_t>(d)]);
    if (!r || keep) want.push_back(kept.back());
  }
  if (want != out->shape()) {
    Fail(op, "out has shape " + ShapeStr(out->shape()) + ", the sum has shape " + ShapeStr(want));
  }
  // Accumulate over x's index space into a kept-shape buffer, then write it to out.
  std::int64_t m = 1;
  for (auto d : kept) m *= d;
  std::vector<std::int64_t> kstride(static_cast<std::size_t>(nd), 0);
  for (std::int64_t d = nd, acc = 1; d-- > 0;) {
    if (!reduced[static_cast<std::size_t>(d)]) kstride[static_cast<std::size_t>(d)] = acc;
    acc *= kept[static_cast<std::size_t>(d)];
  }
  const std::vector<View> v = {{static_cast<const char *>(x->data_ptr()), x->dtype(), BroadcastByteStrides(x, x->shape())},
                               {nullptr, out->dtype(), kstride}};
  const bool fl = opbuilder::IsFloating(out->dtype());
  std::vector<double> accf(fl ? static_cast<std::size_t>(m) : 0, 0.0);
  std::vector<std::int64_t> acci(fl ? 0 : static_cast<std::size_t>(m), 0);
  ForEachIndex(x->shape(), v, [&](const std::vector<std::int64_t> &o) {
    const std::size_t k = static_cast<std::size_t>(o[1]);
    if (fl) accf[k] += LoadF(v[0].base + o[0], x->dtype());
    else acci[k] = WAdd(acci[k], LoadI(v[0].base + o[0], x->dtype()));
  });
  const std::vector<View> w = {{static_cast<const char *>(out->data_ptr()), out->dtype(), BroadcastByteStrides(out, out->shape())}};
  char *po = static_cast<char *>(out->data_ptr());
  std::size_t k = 0;
  ForEachIndex(out->shape(), w, [&](const std::vector<std::int64_t> &o) {
    if (fl) StoreF(po + o[0], out->dtype(), accf[k++]);
    else StoreI(po + o[0], out->dtype(), acci[k++]);
  });
}

// aclnnMatmul(self, mat2, [cubeMathType]) with torch.matmul's rules: 1-D operands are promoted (and
// the added dimension removed), batch dimensions broadcast. cubeMathType only picks Ascend's precision.
template <typename V = void>
void RunMatmul(const std::string &op, const std::vector<AclnnArg> &in, const opbuilder::TensorPtrList &outputs) {
  if (in.size() < 2 || in.size() > 3) {
    Fail(op, "expected inputs (self, mat2, [cubeMathType]), got " + std::to_string(in.size()) + " inputs");
  }
  const TensorPtr &a = HostTensor(op, in[0], "self");
  const TensorPtr &b = HostTensor(op, in[1], "mat2");
  if (in.size() == 3 && in[2].kind() != AclnnArg::Kind::kInt) Fail(op, "cubeMathType must be an integer");
  const TensorPtr &out = OutTensor(op, outputs, false);
  if (a->ndim() == 0 || b->ndim() == 0) Fail(op, "self and mat2 must have at least 1 dimension");
  CheckIntegerInputs(op, out, {a, b});
  ShapeVector sa = a->shape(), sb = b->shape();
  std::vector<std::int64_t> ta = a->strides(), tb = b->strides();
  const bool a1 = sa.size() == 1, b1 = sb.size() == 1;
  if (a1) { sa.insert(sa.begin(), 1); ta.insert(ta.begin(), 0); }
  if (b1) { sb.push_back(1); tb.push_back(0); }
  const std::int64_t n = sa[sa.size() - 2], k = sa.back(), m = sb.back();
  if (sb[sb.size() - 2] != k) {
    Fail(op, "self " + ShapeStr(a->shape()) + " and mat2 " + ShapeStr(b->shape()) + " cannot be multiplied");
  }
  const ShapeVector batch = BroadcastShapes(op, ShapeVector(sa.begin(), sa.end() - 2), ShapeVector(sb.begin(), sb.end() - 2));
  ShapeVector want = batch;
  if (!a1) want.push_back(n);
  if (!b1) want.push_back(m);
  if (want != out->shape()) {
    Fail(op, "out has shape " + ShapeStr(out->shape()) + ", the product has shape " + ShapeStr(want));
  }
  // Element strides of a and b over batch + [n, k] / [k, m] (0 on broadcast batch dimensions).
  auto strides_over = [&](const ShapeVector &s, const std::vector<std::int64_t> &t) {
    std::vector<std::int64_t> r(batch.size() + 2, 0);
    const std::size_t lead = batch.size() + 2 - s.size();
    for (std::size_t i = 0; i < s.size(); ++i) r[lead + i] = s[i] == 1 ? 0 : t[i];
    return r;
  };
  const auto xa = strides_over(sa, ta), xb = strides_over(sb, tb);
  const std::size_t nb = batch.size();
  const std::size_t ea = a->element_size(), eb = b->element_size();
  const bool fl = opbuilder::IsFloating(out->dtype());
  std::vector<View> bv = {{nullptr, a->dtype(), {}}, {nullptr, b->dtype(), {}}};
  for (std::size_t d = 0; d < nb; ++d) {
    bv[0].strides.push_back(xa[d] * static_cast<std::int64_t>(ea));
    bv[1].strides.push_back(xb[d] * static_cast<std::int64_t>(eb));
  }
  std::vector<double> rf;
  std::vector<std::int64_t> ri;
  const char *pa = static_cast<const char *>(a->data_ptr());
  const char *pb = static_cast<const char *>(b->data_ptr());
  const std::int64_t an = xa[nb] * static_cast<std::int64_t>(ea), ak = xa[nb + 1] * static_cast<std::int64_t>(ea);
  const std::int64_t bk = xb[nb] * static_cast<std::int64_t>(eb), bm = xb[nb + 1] * static_cast<std::int64_t>(eb);
  ForEachIndex(batch, bv, [&](const std::vector<std::int64_t> &o) {
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < m; ++j) {
        const char *ra = pa + o[0] + i * an, *rb = pb + o[1] + j * bm;
        if (fl) {
          double s = 0.0;
          for (std::int64_t t = 0; t < k; ++t) s += LoadF(ra + t * ak, a->dtype()) * LoadF(rb + t * bk, b->dtype());
          rf.push_back(s);
        } else {
          std::int64_t s = 0;
          for (std::int64_t t = 0; t < k; ++t) s = WAdd(s, WMul(LoadI(ra + t * ak, a->dtype()), LoadI(rb + t * bk, b->dtype())));
          ri.push_back(s);
        }
      }
    }
  });
  // The results are in C order of out's shape; written after all reads, so out may alias an input.
  const std::vector<View> w = {{static_cast<const char *>(out->data_ptr()), out->dtype(), BroadcastByteStrides(out, out->shape())}};
  char *po = static_cast<char *>(out->data_ptr());
  std::size_t q = 0;
  ForEachIndex(out->shape(), w, [&](const std::vector<std::int64_t> &o) {
    if (fl) StoreF(po + o[0], out->dtype(), rf[q++]);
    else StoreI(po + o[0], out->dtype(), ri[q++]);
  });
}

}  // namespace aclnn_host

}  // namespace custom
}  // namespace mindspore
