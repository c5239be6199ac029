// aot kernels for tests/test_custom_aot_failures.py: an Init that fails, and kernels that throw.
#include <cstdint>
#include <stdexcept>

#include "opbuilder/aot.h"

namespace {
int g_inits = 0;
}  // namespace

extern "C" int InitsRun() { return g_inits; }

// Fails every time, having kept kernel data (deleted by the next Init's SetKernelData, or with the op).
extern "C" int FailingInitInit(int *, int64_t **, const char **, AotExtra *extra) {
  ++g_inits;
  extra->SetKernelData(new AotKernelData);
  return 3;
}

extern "C" int FailingInit(int, void **, int *, int64_t **, const char **, void *, void *) { return 0; }

extern "C" int Throws(int, void **, int *, int64_t **, const char **, void *, void *) {
  throw std::runtime_error("out of range in Throws");
}

extern "C" int ThrowsAnInt(int, void **, int *, int64_t **, const char **, void *, void *) { throw 5; }

// Records an error (a missing attribute), then throws: the recorded error is the one raised.
extern "C" int RecordsThenThrows(int, void **, int *, int64_t **, const char **, void *, void *extra) {
  static_cast<AotExtra *>(extra)->Attr<int64_t>("missing");
  throw std::runtime_error("after the error");
}

extern "C" int ThrowingInitInit(int *, int64_t **, const char **, AotExtra *) {
  throw std::logic_error("bad shapes in Init");
}

extern "C" int ThrowingInit(int, void **, int *, int64_t **, const char **, void *, void *) { return 0; }
