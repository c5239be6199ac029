// The `extra` argument of aot operators (runtime.ops.Custom, func_type="aot").
//
//   #include "opbuilder/aot.h"
//   extern "C" int Scale(int nparam, void **params, int *ndims, int64_t **shapes,
//                        const char **dtypes, void *stream, void *extra) {
//     float s = static_cast<AotExtra *>(extra)->Attr<float>("scale");
//     ...
//   }
//
// The runtime fills the attributes from the op's reg_info (CustomRegOp.attr)
// before the first call. An optional `extern "C" int <Symbol>Init(int *ndims,
// int64_t **shapes, const char **dtypes, AotExtra *extra)` runs once, before
// the first call, with the shapes of that call; it may keep per-op data
// (SetKernelData, freed by the runtime with the op) and ask for scratch
// buffers (SetWorkSpace: passed as uint8 params after the outputs).
//
// Attr<T> never throws (an exception must not cross the C ABI): a missing
// attribute or a wrong type records an error and returns T{}; the runtime then
// raises RuntimeError with that message once the call returns.
//
// dtypes[i] is a DataTypeName ("float32", "bfloat16", "complex64", "uint16" ...):
// DataTypeFromName gives its DataType, for the OB_DISPATCH_* macros (dispatch.h).
//
// Header-only, no dependencies beyond the standard library; C++17.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "opbuilder/dtype.h"  // DataTypeFromName(dtypes[i]), DataTypeOf, bfloat16

namespace opbuilder {
namespace aot {

// The C layout the runtime builds with ctypes (runtime/ops/aot_extra.py).
// Change both together and bump kAbiVersion.
constexpr uint32_t kAbiVersion = 1;
constexpr int kMaxWorkspaces = 16;
constexpr int kErrorSize = 512;

enum AttrKind : int32_t {
  kInt = 0,
  kFloat = 1,
  kBool = 2,
  kStr = 3,
  kListInt = 4,
  kListFloat = 5,
  kListBool = 6,
  kListStr = 7,
  kListListInt = 8,
  kListListFloat = 9,
};

// One attribute. Scalars have count 1; lists count their elements; lists of
// lists count their rows, whose lengths are in row_lens and whose elements
// follow each other in ints / floats.
struct AttrRecord {
  const char *name;
  int32_t kind;
  int32_t count;
  const int64_t *ints;       // kInt, kBool, kListInt, kListBool, kListListInt
  const double *floats;      // kFloat, kListFloat, kListListFloat
  const char *const *strs;   // kStr, kListStr
  const int32_t *row_lens;   // kListListInt, kListListFloat
};

struct ExtraData {
  uint32_t abi_version;
  int32_t nattrs;
  const AttrRecord *attrs;
  void *kernel_data;
  void (*kernel_data_deleter)(void *);
  int32_t nworkspace;
  int32_t reserved;
  uint64_t workspace[kMaxWorkspaces];
  char error[kErrorSize];  // first error recorded by Attr / SetWorkSpace; "" if none
};

inline const char *KindName(int32_t kind) {
  switch (kind) {
    case kInt: return "int";
    case kFloat: return "float";
    case kBool: return "bool";
    case kStr: return "str";
    case kListInt: return "listInt";
    case kListFloat: return "listFloat";
    case kListBool: return "listBool";
    case kListStr: return "listStr";
    case kListListInt: return "listListInt";
    case kListListFloat: return "listListFloat";
    default: return "unknown";
  }
}

// How each C++ type is read from a record: the kinds it accepts and the copy.
template <typename T, typename = void>
struct AttrReader;  // unsupported T: a compile error names it

template <typename T>
struct AttrReader<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static constexpr const char *kName = "an integer";
  static bool Read(const AttrRecord &r, T *out) {
    if (r.kind != kInt) return false;
    *out = static_cast<T>(r.ints[0]);
    return true;
  }
};

template <>
struct AttrReader<bool> {
  static constexpr const char *kName = "bool";
  static bool Read(const AttrRecord &r, bool *out) {
    if (r.kind != kBool) return false;
    *out = r.ints[0] != 0;
    return true;
  }
};

template <typename T>
struct AttrReader<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static constexpr const char *kName = "a floating-point number";
  static bool Read(const AttrRecord &r, T *out) {
    if (r.kind == kFloat) *out = static_cast<T>(r.floats[0]);
    else if (r.kind == kInt) *out = static_cast<T>(r.ints[0]);
    else return false;
    return true;
  }
};

template <>
struct AttrReader<std::string> {
  static constexpr const char *kName = "std::string";
  static bool Read(const AttrRecord &r, std::string *out) {
    if (r.kind != kStr) return false;
    *out = r.strs[0];
    return true;
  }
};

// Elements [begin, begin + n) of a record's numbers, as T.
template <typename T>
bool ReadRun(const AttrRecord &r, int64_t begin, int64_t n, std::vector<T> *out) {
  out->clear();
  out->reserve(static_cast<size_t>(n));
  bool is_float = r.kind == kListFloat || r.kind == kListListFloat;
  if constexpr (std::is_same_v<T, bool>) {
    if (r.kind != kListBool) return false;
  } else if constexpr (std::is_integral_v<T>) {
    if (is_float || r.kind == kListBool) return false;
  } else {
    if (r.kind == kListBool) return false;
  }
  for (int64_t i = begin; i < begin + n; ++i) {
    if constexpr (std::is_same_v<T, bool>) {
      out->push_back(r.ints[i] != 0);
    } else {
      out->push_back(is_float ? static_cast<T>(r.floats[i]) : static_cast<T>(r.ints[i]));
    }
  }
  return true;
}

template <typename T>
struct AttrReader<std::vector<T>, std::enable_if_t<std::is_arithmetic_v<T>>> {
  static constexpr const char *kName = "std::vector of numbers";
  static bool Read(const AttrRecord &r, std::vector<T> *out) {
    if (r.kind != kListInt && r.kind != kListFloat && r.kind != kListBool) return false;
    return ReadRun(r, 0, r.count, out);
  }
};

template <>
struct AttrReader<std::vector<std::string>> {
  static constexpr const char *kName = "std::vector<std::string>";
  static bool Read(const AttrRecord &r, std::vector<std::string> *out) {
    if (r.kind != kListStr) return false;
    out->assign(r.strs, r.strs + r.count);
    return true;
  }
};

template <typename T>
struct AttrReader<std::vector<std::vector<T>>, std::enable_if_t<std::is_arithmetic_v<T>>> {
  static constexpr const char *kName = "std::vector of std::vector of numbers";
  static bool Read(const AttrRecord &r, std::vector<std::vector<T>> *out) {
    if (r.kind != kListListInt && r.kind != kListListFloat) return false;
    out->assign(static_cast<size_t>(r.count), {});
    int64_t begin = 0;
    for (int32_t row = 0; row < r.count; ++row) {
      if (!ReadRun(r, begin, r.row_lens[row], &(*out)[static_cast<size_t>(row)])) return false;
      begin += r.row_lens[row];
    }
    return true;
  }
};

}  // namespace aot

// Base class of what an Init function keeps with SetKernelData; the runtime
// deletes it (through this virtual destructor) when the op goes away.
class AotKernelData {
 public:
  virtual ~AotKernelData() = default;
};

// A typed view of the `extra` pointer. Standard layout: exactly the runtime's
// aot::ExtraData, so `static_cast<AotExtra *>(extra)` is all a kernel does.
class AotExtra {
 public:
  AotExtra() = delete;  // only ever a view of the runtime's data

  // The attribute `name` as T: integers, float/double, bool, std::string,
  // std::vector of those, std::vector<std::vector<number>>.
  template <typename T>
  T Attr(const std::string &name) const {
    T value{};
    const aot::AttrRecord *r = Find(name);
    if (r == nullptr) {
      SetError("attribute '" + name + "' is not set on this op; " + Names());
    } else if (!aot::AttrReader<T>::Read(*r, &value)) {
      SetError("attribute '" + name + "' is " + aot::KindName(r->kind) + ", which cannot be read as " +
               aot::AttrReader<T>::kName);
      value = T{};
    }
    return value;
  }

  bool HasAttr(const std::string &name) const { return Find(name) != nullptr; }

  // Keep per-op data made in Init; the runtime deletes it with the op.
  void SetKernelData(AotKernelData *data) {
    if (data_.kernel_data != nullptr) DeleteKernelData(data_.kernel_data);
    data_.kernel_data = data;
    data_.kernel_data_deleter = data != nullptr ? &DeleteKernelData : nullptr;
  }
  AotKernelData *KernelData() const { return static_cast<AotKernelData *>(data_.kernel_data); }

  // Scratch buffers (bytes each) for every call; only meaningful in Init.
  void SetWorkSpace(const std::vector<size_t> &sizes) {
    if (sizes.size() > static_cast<size_t>(aot::kMaxWorkspaces)) {
      SetError("SetWorkSpace: " + std::to_string(sizes.size()) + " buffers asked for, at most " +
               std::to_string(aot::kMaxWorkspaces));
      return;
    }
    data_.nworkspace = static_cast<int32_t>(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) data_.workspace[i] = sizes[i];
  }
  std::vector<size_t> WorkSpace() const {
    return std::vector<size_t>(data_.workspace, data_.workspace + data_.nworkspace);
  }

  // The first error recorded ("" if none). The runtime raises it after the call.
  const char *Error() const { return data_.error; }

 private:
  const aot::AttrRecord *Find(const std::string &name) const {
    for (int32_t i = 0; i < data_.nattrs; ++i) {
      if (name == data_.attrs[i].name) return &data_.attrs[i];
    }
    return nullptr;
  }

  std::string Names() const {
    if (data_.nattrs == 0) return "it has no attributes (give them with CustomRegOp.attr)";
    std::string s = "its attributes: ";
    for (int32_t i = 0; i < data_.nattrs; ++i) s += (i ? ", " : "") + std::string(data_.attrs[i].name);
    return s;
  }

  void SetError(const std::string &msg) const {
    char *err = data_.error;
    if (err[0] != '\0') return;  // keep the first one
    std::snprintf(err, aot::kErrorSize, "%s", msg.c_str());
  }

  static void DeleteKernelData(void *p) { delete static_cast<AotKernelData *>(p); }

  mutable aot::ExtraData data_;
};

static_assert(std::is_standard_layout_v<AotExtra>, "AotExtra must stay a view of aot::ExtraData");
static_assert(sizeof(AotExtra) == sizeof(aot::ExtraData), "AotExtra must stay a view of aot::ExtraData");

}  // namespace opbuilder

// MindSpore's spellings, at global scope as in its custom_aot_extra.h.
using opbuilder::AotExtra;
using opbuilder::AotKernelData;
