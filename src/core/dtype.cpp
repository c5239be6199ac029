// The core library's bodies of the functions opbuilder/dtype.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/dtype.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/dtype.h"

namespace opbuilder {

OB_CORE_FN const char *DataTypeName(DataType t) {
  switch (t) {
    case kBool: return "bool";
    case kInt8: return "int8";
    case kInt16: return "int16";
    case kInt32: return "int32";
    case kInt64: return "int64";
    case kUInt8: return "uint8";
    case kFloat16: return "float16";
    case kFloat32: return "float32";
    case kFloat64: return "float64";
    case kBFloat16: return "bfloat16";
    case kComplex64: return "complex64";
    case kComplex128: return "complex128";
    case kUInt16: return "uint16";
    case kUInt32: return "uint32";
    case kUInt64: return "uint64";
    default: return "unknown";
  }
}

}  // namespace opbuilder
