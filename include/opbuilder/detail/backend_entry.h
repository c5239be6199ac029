// How a backend plugin's classes (backend.h) meet the C ABI (detail/backend_abi.h): the registry
// OB_REGISTER_BACKEND adds to, the trampolines that catch every C++ exception, and the library's
// entry point the runtime calls. Not for plugin authors. Included by backend.h, at its end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "opbuilder/backend.h"
#include "opbuilder/detail/backend_abi.h"

namespace opbuilder {
namespace backend {

namespace __attribute__((visibility("hidden"))) detail {
struct Entry {
  std::string name;
  std::function<std::unique_ptr<Backend>()> factory;
  std::unique_ptr<Backend> instance;
};

inline std::vector<Entry> &Registry() {
  static std::vector<Entry> entries;
  return entries;
}

inline void Message(char *err, int64_t errlen, const char *what) {
  if (err == nullptr || errlen <= 0) return;
  std::snprintf(err, static_cast<size_t>(errlen), "%s", what);
}

inline int BuildTrampoline(void *self, const ob_graph *graph, const ob_config *config, uint64_t *id, char *err,
                           int64_t errlen) {
  try {
    *id = static_cast<Backend *>(self)->Build(Graph(graph), Config(config));
    return 0;
  } catch (const HostError &) {
    return 2;
  } catch (const std::exception &e) {
    Message(err, errlen, e.what());
  } catch (...) {
    Message(err, errlen, "unknown C++ exception");
  }
  return 1;
}

inline int RunTrampoline(void *self, uint64_t id, ob_run *run, char *err, int64_t errlen) {
  try {
    RunContext ctx(run);
    static_cast<Backend *>(self)->Run(id, ctx);
    return 0;
  } catch (const HostError &) {
    return 2;
  } catch (const std::exception &e) {
    Message(err, errlen, e.what());
  } catch (...) {
    Message(err, errlen, "unknown C++ exception");
  }
  return 1;
}

inline std::vector<ob_backend> &Table() {
  static std::vector<ob_backend> table;
  return table;
}

struct Registrar {
  Registrar(const char *name, std::function<std::unique_ptr<Backend>()> factory) {
    Registry().push_back(Entry{name, std::move(factory), nullptr});
  }
};
}  // namespace detail

}  // namespace backend
}  // namespace opbuilder

// The library's entry point: the runtime calls it once per load with its callbacks; it creates each
// registered backend once and returns their table. Weak, so any number of sources may include this.
// Returns 0, or -1 when the ABI versions differ (the library must be rebuilt).
extern "C" __attribute__((weak, visibility("default"))) int opbuilder_backend_init(uint32_t abi, const ob_host *host,
                                                                                   const ob_backend **table,
                                                                                   int32_t *count) {
  if (abi != OB_BACKEND_ABI || host == nullptr || host->abi != OB_BACKEND_ABI) return -1;
  namespace d = ::opbuilder::backend::detail;
  d::Host() = host;
  auto &backends = d::Table();
  auto &entries = d::Registry();
  if (backends.size() != entries.size()) {
    backends.clear();
    for (auto &e : entries) {
      if (!e.instance) e.instance = e.factory();
      backends.push_back(ob_backend{e.name.c_str(), e.instance.get(), e.instance->Differentiable() ? 1 : 0,
                                    &d::BuildTrampoline, &d::RunTrampoline});
    }
  }
  *table = backends.data();
  *count = static_cast<int32_t>(backends.size());
  return 0;
}
