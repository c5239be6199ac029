// aot operators that pin down the runtime's side of the C ABI (tests/test_custom_aot.py):
// what params, ndims, shapes and dtypes hold, and what a failing status does.
#include <cstdint>
#include <cstring>
#include <vector>

namespace {
const char *const kDtypeNames[] = {"float16", "float32", "float64", "int8", "int16",
                                   "int32",   "int64",   "uint8",   "bool"};

int64_t DtypeCode(const char *name) {
  for (int64_t i = 0; i < 9; ++i) {
    if (std::strcmp(name, kDtypeNames[i]) == 0) return i;
  }
  return -1;
}

int64_t NumElements(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

}  // namespace

// The last param is an int64 output that receives nparam, then for every param
// (itself included): ndim, the dims, the dtype's index in kDtypeNames; -9 after.
extern "C" int Describe(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                        void *extra) {
  (void)stream;
  (void)extra;
  const int last = nparam - 1;
  int64_t *out = static_cast<int64_t *>(params[last]);
  const int64_t cap = NumElements(ndims[last], shapes[last]);
  std::vector<int64_t> v = {nparam};
  for (int i = 0; i < nparam; ++i) {
    v.push_back(ndims[i]);
    for (int d = 0; d < ndims[i]; ++d) v.push_back(shapes[i][d]);
    v.push_back(DtypeCode(dtypes[i]));
  }
  if (static_cast<int64_t>(v.size()) > cap) return 5;
  for (int64_t i = 0; i < cap; ++i) out[i] = i < static_cast<int64_t>(v.size()) ? v[i] : -9;
  return 0;
}

// Copies input 0's bytes to output 0 (same dtype and size): shows what memory the kernel sees.
extern "C" int CopyBytes(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 2 || std::strcmp(dtypes[0], dtypes[1]) != 0) return 1;
  const int64_t n = NumElements(ndims[0], shapes[0]);
  if (n != NumElements(ndims[1], shapes[1])) return 2;
  static const int64_t kSizes[] = {2, 4, 8, 1, 2, 4, 8, 1, 1};
  const int64_t code = DtypeCode(dtypes[0]);
  if (code < 0) return 3;
  if (n > 0) std::memcpy(params[1], params[0], static_cast<size_t>(n * kSizes[code]));
  return 0;
}

// Always fails with status 42.
extern "C" int FailWith42(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *stream, void *extra) {
  (void)nparam, (void)params, (void)ndims, (void)shapes, (void)dtypes, (void)stream, (void)extra;
  return 42;
}

