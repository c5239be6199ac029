// aot kernels for tests/test_custom_aot_threads.py: one op called from several threads.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "opbuilder/aot.h"

namespace {
std::atomic<int> g_inits{0};
std::atomic<int> g_arrived{0};
std::atomic<bool> g_error_recorded{false};

struct InitData : AotKernelData {
  int serial = 0;
};

// Waits (at most 10 s) until `done` holds.
template <typename F>
void WaitFor(F done) {
  for (int i = 0; i < 10000 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
}  // namespace

extern "C" void ResetThreadOps() {
  g_inits = 0;
  g_arrived = 0;
  g_error_recorded = false;
}

// Slow on purpose: the other threads' first calls arrive while it runs.
extern "C" int CountedInit(int *, int64_t **, const char **, AotExtra *extra) {
  auto *d = new InitData;
  d->serial = ++g_inits;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  extra->SetKernelData(d);
  return 0;
}

// out[0]: the serial number of the Init whose data this call sees; out[1]: Inits run so far.
extern "C" int Counted(int, void **params, int *, int64_t **, const char **, void *, void *extra) {
  const auto *d = static_cast<const InitData *>(static_cast<AotExtra *>(extra)->KernelData());
  auto *out = static_cast<float *>(params[1]);
  out[0] = d != nullptr ? static_cast<float>(d->serial) : -1.0f;
  out[1] = static_cast<float>(g_inits.load());
  return 0;
}

// Two calls at once: the one on a negative input reads an attribute the op lacks (an error it
// records) and then lets the other, which waited for that, return.
extern "C" int ErrorsInOneCall(int, void **params, int *, int64_t **, const char **, void *, void *extra) {
  const float x = static_cast<const float *>(params[0])[0];
  ++g_arrived;
  WaitFor([] { return g_arrived.load() >= 2; });
  if (x < 0) {
    static_cast<AotExtra *>(extra)->Attr<int64_t>("missing");
    g_error_recorded = true;
  } else {
    WaitFor([] { return g_error_recorded.load(); });
  }
  static_cast<float *>(params[1])[0] = x;
  return 0;
}

// x < 0: reads an attribute the op lacks (an error recorded, status 0); x == 0: status 7, no error recorded;
// x > 0: out[0] = x.
extern "C" int BySign(int, void **params, int *, int64_t **, const char **, void *, void *extra) {
  const float x = static_cast<const float *>(params[0])[0];
  if (x == 0) return 7;
  if (x < 0) static_cast<AotExtra *>(extra)->Attr<int64_t>("missing");
  static_cast<float *>(params[1])[0] = x;
  return 0;
}

extern "C" int KeepsInWorkspaceInit(int *, int64_t **, const char **, AotExtra *extra) {
  extra->SetWorkSpace({sizeof(float)});
  return 0;
}

// Two calls at once: each keeps its input in its workspace until both have done so, then copies it out.
extern "C" int KeepsInWorkspace(int, void **params, int *, int64_t **, const char **, void *, void *) {
  auto *kept = static_cast<float *>(params[2]);
  kept[0] = static_cast<const float *>(params[0])[0];
  ++g_arrived;
  WaitFor([] { return g_arrived.load() >= 2; });
  static_cast<float *>(params[1])[0] = kept[0];
  return 0;
}
