// MindSpore's custom backend API (mindspore.graph.register_custom_backend) for runtime.jit.
//
// The names a MindSpore backend plugin uses, on top of opbuilder/backend.h's C ABI: BackendBase
// (Build/Run), BackendManager (the built-in "ms_backend"), RunningStatus, BackendType,
// MS_REGISTER_BACKEND and MS_LOG. A plugin written for MindSpore compiles against this header as
// it is and links nothing of ours. What differs: a FuncGraph is opbuilder::backend::Graph (nodes,
// op names, attributes, shapes, dtypes: see that header), and a VectorRef holds tensors only.
//
// Header-only, the standard library only, C++17.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "opbuilder/backend.h"

namespace mindspore {

// The graph a backend builds: the captured jit graph (see opbuilder::backend::Graph).
class FuncGraph : public ::opbuilder::backend::Graph {
 public:
  using ::opbuilder::backend::Graph::Graph;
};
using FuncGraphPtr = std::shared_ptr<FuncGraph>;

// A value passed to or returned by a graph: a tensor.
class BaseRef : public ::opbuilder::backend::TensorView {
 public:
  using ::opbuilder::backend::TensorView::TensorView;
  BaseRef() = default;
  BaseRef(const ::opbuilder::backend::TensorView &t) : TensorView(t) {}  // NOLINT: implicit on purpose
};

// A graph's inputs or outputs.
class VectorRef {
 public:
  using value_type = BaseRef;
  VectorRef() = default;
  explicit VectorRef(std::vector<BaseRef> elements) : elements_(std::move(elements)) {}
  size_t size() const { return elements_.size(); }
  bool empty() const { return elements_.empty(); }
  const BaseRef &operator[](size_t i) const { return elements_[i]; }
  BaseRef &operator[](size_t i) { return elements_[i]; }
  void push_back(const BaseRef &v) { elements_.push_back(v); }
  void clear() { elements_.clear(); }
  std::vector<BaseRef>::const_iterator begin() const { return elements_.begin(); }
  std::vector<BaseRef>::const_iterator end() const { return elements_.end(); }
  const std::vector<BaseRef> &elements() const { return elements_; }

 private:
  std::vector<BaseRef> elements_;
};

namespace detail {
enum LogLevel { kDEBUG = 0, kINFO, kWARNING, kERROR, kEXCEPTION };

inline bool Verbose() {
  const ob_host *host = ::opbuilder::backend::detail::Host();
  if (host != nullptr) return host->verbose != 0;
  const char *v = std::getenv("OPBUILDER_VERBOSE");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

// One MS_LOG line: printed to stderr when it ends (DEBUG and INFO only when verbose);
// EXCEPTION throws std::runtime_error with the message instead.
class LogLine {
 public:
  LogLine(LogLevel level, const char *file, int line, const char *func)
      : level_(level), file_(file), line_(line), func_(func) {}
  LogLine(const LogLine &) = delete;
  LogLine &operator=(const LogLine &) = delete;
  template <typename T>
  LogLine &operator<<(const T &v) {
    out_ << v;
    return *this;
  }
  ~LogLine() noexcept(false) {
    if (level_ == kEXCEPTION) throw std::runtime_error(out_.str());
    if (level_ < kWARNING && !Verbose()) return;
    static const char *const names[] = {"DEBUG", "INFO", "WARNING", "ERROR", "EXCEPTION"};
    const char *base = std::strrchr(file_, '/');
    std::fprintf(stderr, "[%s] %s:%d %s] %s\n", names[level_], base ? base + 1 : file_, line_, func_,
                 out_.str().c_str());
    std::fflush(stderr);
  }

 private:
  LogLevel level_;
  const char *file_;
  int line_;
  const char *func_;
  std::ostringstream out_;
};
}  // namespace detail

#define MS_LOG(level) ::mindspore::detail::LogLine(::mindspore::detail::k##level, __FILE__, __LINE__, __func__)

namespace backend {

using BackendGraphId = uint32_t;

enum RunningStatus { kRunningSuccess = 0, kRunningFailure };

// kMsBackend: the spelling MindSpore's tutorials use (seed 000), the same value as kMSBackend.
enum BackendType { kMSBackend = 0, kMsBackend = kMSBackend, kGEBackend, kCustomBackend, kInvalidBackend };

// The jit_level and the options given to runtime.jit.
class BackendJitConfig : public ::opbuilder::backend::Config {
 public:
  using ::opbuilder::backend::Config::Config;
};

// What a custom backend implements.
class BackendBase {
 public:
  virtual ~BackendBase() = default;
  virtual BackendGraphId Build(const FuncGraphPtr &func_graph, const BackendJitConfig &backend_jit_config) = 0;
  virtual RunningStatus Run(BackendGraphId graph_id, const VectorRef &inputs, VectorRef *outputs) = 0;
};

namespace detail {
inline ob_run *&CurrentRun() {
  static thread_local ob_run *run = nullptr;
  return run;
}
}  // namespace detail

// The built-in backends, for a custom backend to build and run graphs on ("ms_backend").
class BackendManager {
 public:
  static BackendManager &GetInstance() {
    static BackendManager manager;
    return manager;
  }

  std::pair<BackendType, BackendGraphId> Build(const FuncGraphPtr &func_graph,
                                               const BackendJitConfig &backend_jit_config,
                                               const std::string &backend_name = "ms_backend") {
    if (backend_name != "ms_backend")
      throw std::invalid_argument("BackendManager::Build: backend '" + backend_name +
                                  "' is not a built-in backend; the built-in one is 'ms_backend'");
    auto id = ::opbuilder::backend::BuildBuiltin(*func_graph, backend_jit_config, backend_name);
    return {kMSBackend, static_cast<BackendGraphId>(id)};
  }

  RunningStatus Run(BackendType backend_type, BackendGraphId graph_id, const VectorRef &inputs,
                    VectorRef *outputs) {
    ob_run *run = detail::CurrentRun();
    if (backend_type != kMSBackend || run == nullptr || outputs == nullptr) return kRunningFailure;
    std::vector<::opbuilder::backend::TensorView> in(inputs.begin(), inputs.end());
    try {
      auto out = ::opbuilder::backend::RunBuiltin(::opbuilder::backend::RunContext(run), graph_id, in);
      for (const auto &t : out) outputs->push_back(t);
    } catch (const std::exception &) {  // the runtime holds the reason and raises it
      return kRunningFailure;
    }
    return kRunningSuccess;
  }
};

namespace detail {
// Makes `run` the one BackendManager::Run uses on this thread, until the scope ends.
class CurrentRunScope {
 public:
  explicit CurrentRunScope(ob_run *run) : prev_(CurrentRun()) { CurrentRun() = run; }
  ~CurrentRunScope() { CurrentRun() = prev_; }
  CurrentRunScope(const CurrentRunScope &) = delete;
  CurrentRunScope &operator=(const CurrentRunScope &) = delete;

 private:
  ob_run *prev_;
};

// A BackendBase as an opbuilder backend.
template <typename Impl>
class Adapter : public ::opbuilder::backend::Backend {
 public:
  ::opbuilder::backend::GraphId Build(const ::opbuilder::backend::Graph &graph,
                                      const ::opbuilder::backend::Config &config) override {
    return impl_.Build(std::make_shared<FuncGraph>(graph.raw()), BackendJitConfig(config.raw()));
  }
  void Run(::opbuilder::backend::GraphId id, ::opbuilder::backend::RunContext &ctx) override {
    VectorRef inputs;
    for (int i = 0; i < ctx.num_inputs(); ++i) inputs.push_back(ctx.input(i));
    VectorRef outputs;
    RunningStatus status;
    {
      CurrentRunScope scope(ctx.raw());
      status = impl_.Run(static_cast<BackendGraphId>(id), inputs, &outputs);
    }
    if (status != kRunningSuccess) throw std::runtime_error("Run returned kRunningFailure");
    ctx.SetOutputs(std::vector<::opbuilder::backend::TensorView>(outputs.begin(), outputs.end()));
  }

 private:
  Impl impl_;
};
}  // namespace detail

}  // namespace backend
}  // namespace mindspore

// Register `Class` (a BackendBase) as backend `name`.
#define MS_REGISTER_BACKEND(name, Class) \
  OB_REGISTER_BACKEND(name, ::mindspore::backend::detail::Adapter<Class>)
