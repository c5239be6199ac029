// An aot operator over the extended dtypes (tests/test_dtypes_cpp.py): out = x * y for
// bfloat16, complex64/128, float32/64 and the unsigned integers, dispatched on the ABI's
// dtype names with the OB_DISPATCH_* macros. Status 1: wrong parameter count or mixed dtypes.
// A dtype outside the list throws (the runtime reports the exception's message).
#include <complex>
#include <cstdint>

#include "opbuilder/aot.h"
#include "opbuilder/dispatch.h"

using opbuilder::DataType;

extern "C" int MulAny(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                      void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 3) return 1;
  const DataType t = opbuilder::DataTypeFromName(dtypes[0]);
  if (t != opbuilder::DataTypeFromName(dtypes[1]) || t != opbuilder::DataTypeFromName(dtypes[2])) return 1;
  int64_t n = 1;
  for (int d = 0; d < ndims[2]; ++d) n *= shapes[2][d];
  auto run = [&](auto *o) {
    using T = std::remove_pointer_t<decltype(o)>;
    const T *x = static_cast<const T *>(params[0]);
    const T *y = static_cast<const T *>(params[1]);
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(x[i] * y[i]);
  };
#define OB_RUN [&] { run(static_cast<scalar_t *>(params[2])); }
  OB_DISPATCH_SWITCH(t, "MulAny", "float32, float64, complex64, complex128, bfloat16, uint16, uint32, uint64",
                     OB_DISPATCH_CASES_FLOATING(OB_RUN) OB_DISPATCH_CASES_COMPLEX(OB_RUN)
                     OB_DISPATCH_CASE(kBFloat16, opbuilder::bfloat16, OB_RUN)
                     OB_DISPATCH_CASE(kUInt16, std::uint16_t, OB_RUN) OB_DISPATCH_CASE(kUInt32, std::uint32_t, OB_RUN)
                     OB_DISPATCH_CASE(kUInt64, std::uint64_t, OB_RUN));
#undef OB_RUN
  return 0;
}
