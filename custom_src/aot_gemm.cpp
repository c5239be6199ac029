// An aot operator that calls a third-party library: OpenBLAS's cblas_sgemm /
// cblas_dgemm, from the scipy-openblas32 package (its symbols carry a scipy_
// prefix). Built with the package's headers and library:
//
//   import scipy_openblas32 as blas
//   lib = opbuilder.build_library(
//       "aot_gemm", ["custom_src/aot_gemm.cpp"], include_paths=[blas.get_include_dir()],
//       ldflags=[f"-L{blas.get_lib_dir()}", f"-l{blas.get_library()}", f"-Wl,-rpath,{blas.get_lib_dir()}"])
//   matmul = ops.Custom(f"{lib}:MatMul", out_shape=lambda a, b: [a[0], b[1]], out_dtype=lambda a, b: a)
//
// MatMul(a, b) -> a @ b for 2-D float32 or float64 matrices; the optional bool
// attributes "transpose_a" / "transpose_b" use a^T / b^T instead (the shapes
// passed are then those of a and b as stored).
//
// Status codes: 1 wrong parameter count or rank, 2 unsupported or mixed
// dtypes, 3 shapes that do not multiply.
#include <cstdint>
#include <cstring>

#include <cblas.h>

#include "opbuilder/aot.h"

namespace {
bool Flag(const AotExtra *extra, const char *name) { return extra->HasAttr(name) && extra->Attr<bool>(name); }
}  // namespace

extern "C" int MatMul(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                      void *extra) {
  (void)stream;
  if (nparam != 3 || ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 2) return 1;
  if (std::strcmp(dtypes[0], dtypes[1]) != 0 || std::strcmp(dtypes[0], dtypes[2]) != 0) return 2;
  const AotExtra *ex = static_cast<AotExtra *>(extra);
  const bool ta = Flag(ex, "transpose_a"), tb = Flag(ex, "transpose_b");
  const int64_t m = ta ? shapes[0][1] : shapes[0][0], k = ta ? shapes[0][0] : shapes[0][1];
  const int64_t kb = tb ? shapes[1][1] : shapes[1][0], n = tb ? shapes[1][0] : shapes[1][1];
  if (k != kb || shapes[2][0] != m || shapes[2][1] != n) return 3;
  if (m == 0 || n == 0) return 0;
  const bool f32 = std::strcmp(dtypes[0], "float32") == 0;
  if (!f32 && std::strcmp(dtypes[0], "float64") != 0) return 2;
  if (k == 0) {  // an empty sum: zeros
    std::memset(params[2], 0, static_cast<size_t>(m * n) * (f32 ? sizeof(float) : sizeof(double)));
    return 0;
  }
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  // leading dimensions: the stored row lengths (at least 1, as BLAS requires)
  const blasint lda = static_cast<blasint>(shapes[0][1] > 0 ? shapes[0][1] : 1);
  const blasint ldb = static_cast<blasint>(shapes[1][1] > 0 ? shapes[1][1] : 1);
  const blasint M = static_cast<blasint>(m), N = static_cast<blasint>(n), K = static_cast<blasint>(k);
  if (f32) {
    scipy_cblas_sgemm(CblasRowMajor, opa, opb, M, N, K, 1.0f, static_cast<const float *>(params[0]), lda,
                      static_cast<const float *>(params[1]), ldb, 0.0f, static_cast<float *>(params[2]), N);
    return 0;
  }
  scipy_cblas_dgemm(CblasRowMajor, opa, opb, M, N, K, 1.0, static_cast<const double *>(params[0]), lda,
                    static_cast<const double *>(params[1]), ldb, 0.0, static_cast<double *>(params[2]), N);
  return 0;
}
