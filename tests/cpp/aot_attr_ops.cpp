// aot operators that use AotExtra (tests/test_custom_attrs.py): attributes of
// every kind, Init, kernel data and workspaces.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "opbuilder/aot.h"

namespace {
int64_t NumElements(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

int g_init_calls = 0;

struct Counter : public AotKernelData {
  int64_t calls = 0;
  static int64_t live;
  Counter() { ++live; }
  ~Counter() override { --live; }
};
int64_t Counter::live = 0;
}  // namespace

// Writes every attribute kind into a float64 output, in this order:
// i, f, b, len(s), sum(li), sum(lf), count(lb), total length of ls, rows of ll,
// sum of ll, then int64 `i` read as int, and f read as float.
extern "C" int ReadAttrs(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  (void)ndims, (void)shapes, (void)dtypes, (void)stream;
  if (nparam != 1) return 1;
  const AotExtra *ex = static_cast<AotExtra *>(extra);
  double *out = static_cast<double *>(params[0]);
  out[0] = static_cast<double>(ex->Attr<int64_t>("i"));
  out[1] = ex->Attr<double>("f");
  out[2] = ex->Attr<bool>("b") ? 1.0 : 0.0;
  out[3] = static_cast<double>(ex->Attr<std::string>("s").size());
  double acc = 0;
  for (int64_t v : ex->Attr<std::vector<int64_t>>("li")) acc += static_cast<double>(v);
  out[4] = acc;
  acc = 0;
  for (float v : ex->Attr<std::vector<float>>("lf")) acc += v;
  out[5] = acc;
  acc = 0;
  for (bool v : ex->Attr<std::vector<bool>>("lb")) acc += v ? 1 : 0;
  out[6] = acc;
  acc = 0;
  for (const std::string &v : ex->Attr<std::vector<std::string>>("ls")) acc += static_cast<double>(v.size());
  out[7] = acc;
  const auto ll = ex->Attr<std::vector<std::vector<int64_t>>>("ll");
  out[8] = static_cast<double>(ll.size());
  acc = 0;
  for (const auto &row : ll) {
    for (int64_t v : row) acc += static_cast<double>(v);
  }
  out[9] = acc;
  out[10] = static_cast<double>(ex->Attr<int>("i"));
  out[11] = static_cast<double>(ex->Attr<float>("f"));
  return 0;
}

// Reads attribute "scale" as a string: a type mismatch when scale is a float.
extern "C" int ScaleAsString(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *stream, void *extra) {
  (void)nparam, (void)params, (void)ndims, (void)shapes, (void)dtypes, (void)stream;
  (void)static_cast<AotExtra *>(extra)->Attr<std::string>("scale");
  return 0;
}

// Init runs once: counts its runs, keeps a Counter, asks for one workspace of
// input 0's byte size. The kernel copies x into the workspace, then writes
// [Init runs, kernel calls so far, live Counters, workspace bytes, sum of workspace as float32]
// into a float64 output of 5.
extern "C" int CountCallsInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  if (std::strcmp(dtypes[0], "float32") != 0) return 2;
  ++g_init_calls;
  extra->SetKernelData(new Counter);
  extra->SetWorkSpace({static_cast<size_t>(NumElements(ndims[0], shapes[0])) * sizeof(float)});
  return 0;
}

extern "C" int CountCalls(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *stream, void *extra) {
  (void)stream;
  if (nparam != 3 || std::strcmp(dtypes[2], "uint8") != 0) return 1;
  auto *counter = static_cast<Counter *>(static_cast<AotExtra *>(extra)->KernelData());
  counter->calls += 1;
  const int64_t n = NumElements(ndims[0], shapes[0]);
  const int64_t ws_bytes = NumElements(ndims[2], shapes[2]);
  if (ws_bytes != n * static_cast<int64_t>(sizeof(float))) return 3;
  float *ws = static_cast<float *>(params[2]);
  std::memcpy(ws, params[0], static_cast<size_t>(ws_bytes));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += ws[i];
  double *out = static_cast<double *>(params[1]);
  if (NumElements(ndims[1], shapes[1]) != 5 || std::strcmp(dtypes[1], "float64") != 0) return 4;
  out[0] = g_init_calls;
  out[1] = static_cast<double>(counter->calls);
  out[2] = static_cast<double>(Counter::live);
  out[3] = static_cast<double>(ws_bytes);
  out[4] = sum;
  return 0;
}

// Live Counters (kept by CountCallsInit) in a 1-element int64 output: shows the runtime frees them.
extern "C" int LiveCounters(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  (void)ndims, (void)shapes, (void)dtypes, (void)stream, (void)extra;
  if (nparam != 1) return 1;
  *static_cast<int64_t *>(params[0]) = Counter::live;
  return 0;
}

// An Init that fails with status 9.
extern "C" int BadInitInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  (void)ndims, (void)shapes, (void)dtypes, (void)extra;
  return 9;
}

extern "C" int BadInit(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                       void *extra) {
  (void)nparam, (void)params, (void)ndims, (void)shapes, (void)dtypes, (void)stream, (void)extra;
  return 0;
}
