// Backend plugins for runtime.jit: a shared library that builds and runs captured graphs.
//
//   #include "opbuilder/backend.h"
//   namespace ob = opbuilder::backend;
//   class MyBackend : public ob::Backend {
//    public:
//     ob::GraphId Build(const ob::Graph &graph, const ob::Config &config) override;  // read the graph
//     void Run(ob::GraphId id, ob::RunContext &ctx) override;  // run nodes, or ctx.RunNode(...) them
//   };
//   OB_REGISTER_BACKEND("my_backend", MyBackend)
//
// Python: runtime.graph.register_custom_backend("my_backend", path_of_the_library), then
// @jit(backend="my_backend"). See docs/jit.md.
//
// A plugin links nothing of ours (no pybind11, no libpython). It talks to the runtime through a
// small C ABI (detail/backend_abi.h): the runtime loads the library (ctypes), calls the exported
// opbuilder_backend_init with a table of host callbacks (ob_host) and gets back one ob_backend per
// registered backend. Graphs and tensors cross as the plain C structs below; the runtime owns all
// their memory. Tensors are contiguous, in host (CPU) memory, and identified by a handle the runtime
// gave out: a plugin's outputs are tensors it got from the runtime (inputs, ctx.Alloc, ctx.RunNode).
// No C++ exception crosses the ABI: the trampolines catch them and hand their message to the runtime,
// which raises RuntimeError.
//
// Header-only, the standard library only, C++17.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "opbuilder/detail/backend_abi.h"  // the C structs (ob_tensor, ob_graph, ob_host, ...)

namespace opbuilder {
namespace backend {

using GraphId = uint64_t;

// Thrown by RunContext when a host call failed; the runtime already holds the reason.
class HostError : public std::runtime_error {
 public:
  HostError() : std::runtime_error("a call into the runtime failed") {}
};

// Hidden: each plugin library keeps its own registry and host, even when two are loaded at once.
namespace __attribute__((visibility("hidden"))) detail {
inline const ob_host *&Host() {
  static const ob_host *host = nullptr;
  return host;
}
inline const ob_host &HostOrThrow() {
  if (Host() == nullptr) throw std::runtime_error("opbuilder backend: the runtime has not initialized this library");
  return *Host();
}
inline void Check(int rc) {
  if (rc != 0) throw HostError();
}
}  // namespace detail

// A tensor handed out by the runtime (or a shape/dtype description, data() == nullptr).
class TensorView {
 public:
  TensorView() : t_{nullptr, "", 0, nullptr, -1} {}
  explicit TensorView(const ob_tensor &t) : t_(t) {}
  const ob_tensor &raw() const { return t_; }
  void *data_ptr() const { return t_.data; }
  template <typename T>
  T *data() const {
    return static_cast<T *>(t_.data);
  }
  std::string dtype() const { return t_.dtype; }
  int ndim() const { return t_.ndim; }
  std::vector<int64_t> shape() const { return std::vector<int64_t>(t_.shape, t_.shape + t_.ndim); }
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < t_.ndim; ++d) n *= t_.shape[d];
    return n;
  }

 private:
  ob_tensor t_;
};

// One node of a graph (a view of the runtime's ob_node).
class Node {
 public:
  explicit Node(const ob_node &n) : n_(&n) {}
  int id() const { return n_->id; }
  std::string op() const { return n_->op; }
  std::string kind() const { return n_->kind; }
  int num_inputs() const { return n_->ninputs; }
  const ob_ref &input(int i) const { return n_->inputs[i]; }
  int num_attrs() const { return n_->nattrs; }
  const ob_attr &attr_at(int i) const { return n_->attrs[i]; }
  // The attribute called `name`, or nullptr.
  const ob_attr *attr(const std::string &name) const {
    for (int i = 0; i < n_->nattrs; ++i)
      if (name == n_->attrs[i].name) return &n_->attrs[i];
    return nullptr;
  }
  int num_outputs() const { return n_->noutputs; }
  TensorView output(int i) const { return TensorView(n_->outputs[i]); }
  const ob_node &raw() const { return *n_; }

 private:
  const ob_node *n_;
};

// The whole graph: inputs, constants, nodes in topological order, outputs.
class Graph {
 public:
  explicit Graph(const ob_graph *g) : g_(g) {}
  std::string name() const { return g_->name; }
  int num_inputs() const { return g_->ninputs; }
  TensorView input(int i) const { return TensorView(g_->inputs[i]); }
  int num_consts() const { return g_->nconsts; }
  const ob_const &constant(int i) const { return g_->consts[i]; }
  int num_nodes() const { return g_->nnodes; }
  Node node(int i) const { return Node(g_->nodes[i]); }
  int num_outputs() const { return g_->noutputs; }
  const ob_ref &output(int i) const { return g_->outputs[i]; }
  const ob_graph *raw() const { return g_; }

 private:
  const ob_graph *g_;
};

// jit_level and the keyword options given to runtime.jit.
class Config {
 public:
  explicit Config(const ob_config *c) : c_(c) {}
  std::string jit_level() const { return c_->jit_level; }
  // The option `key` (str as given, other values as their repr), or `fallback`.
  std::string Get(const std::string &key, const std::string &fallback = "") const {
    for (int i = 0; i < c_->noptions; ++i)
      if (key == c_->options[i].key) return c_->options[i].value;
    return fallback;
  }
  const ob_config *raw() const { return c_; }

 private:
  const ob_config *c_;
};

// One run: its inputs, where its outputs go, and the runtime's services.
class RunContext {
 public:
  explicit RunContext(ob_run *run) : run_(run) {}
  int num_inputs() const { return run_->ninputs; }
  TensorView input(int i) const { return TensorView(run_->inputs[i]); }
  std::vector<TensorView> inputs() const {
    std::vector<TensorView> v;
    for (int i = 0; i < run_->ninputs; ++i) v.emplace_back(run_->inputs[i]);
    return v;
  }
  // A new contiguous tensor from the runtime.
  TensorView Alloc(const std::string &dtype, const std::vector<int64_t> &shape) const {
    ob_tensor t{};
    detail::Check(detail::HostOrThrow().alloc(run_->ctx, dtype.c_str(), static_cast<int32_t>(shape.size()),
                                              shape.data(), &t));
    return TensorView(t);
  }
  // The current value of tensor constant `index`.
  TensorView Const(int index) const {
    ob_tensor t{};
    detail::Check(detail::HostOrThrow().get_const(run_->ctx, index, &t));
    return TensorView(t);
  }
  // Run `node` with the runtime's kernel (the built-in backend); `args` one per node input
  // (any TensorView for a constant input).
  std::vector<TensorView> RunNode(const Node &node, const std::vector<TensorView> &args) const {
    if (static_cast<int>(args.size()) != node.num_inputs())
      throw std::invalid_argument("RunNode(" + node.op() + "): " + std::to_string(args.size()) +
                                  " arguments for " + std::to_string(node.num_inputs()) + " inputs");
    std::vector<ob_tensor> in;
    for (const auto &a : args) in.push_back(a.raw());
    std::vector<ob_tensor> out(static_cast<size_t>(node.num_outputs()));
    detail::Check(detail::HostOrThrow().run_node(run_->ctx, node.id(), in.data(), out.data()));
    return std::vector<TensorView>(out.begin(), out.end());
  }
  // Set the run's outputs (tensors from the runtime: inputs, Alloc, RunNode).
  void SetOutputs(const std::vector<TensorView> &outs) {
    if (static_cast<int>(outs.size()) > run_->noutputs)
      throw std::invalid_argument("SetOutputs: " + std::to_string(outs.size()) + " outputs for a graph of " +
                                  std::to_string(run_->noutputs));
    for (size_t k = 0; k < outs.size(); ++k) run_->outputs[k] = outs[k].raw();
    run_->noutputs = static_cast<int32_t>(outs.size());
  }
  ob_run *raw() const { return run_; }

 private:
  ob_run *run_;
};

// Build `graph` on the built-in backend "ms_backend" (jit_level from `config`).
inline GraphId BuildBuiltin(const Graph &graph, const Config &config, const std::string &backend = "ms_backend") {
  GraphId id = 0;
  detail::Check(detail::HostOrThrow().build_builtin(graph.raw(), backend.c_str(), config.raw(), &id));
  return id;
}

// Run a graph built by BuildBuiltin.
inline std::vector<TensorView> RunBuiltin(const RunContext &ctx, GraphId id, const std::vector<TensorView> &inputs) {
  std::vector<ob_tensor> in;
  for (const auto &a : inputs) in.push_back(a.raw());
  std::vector<ob_tensor> out(8);
  int32_t n = 0;
  const ob_host &host = detail::HostOrThrow();
  int rc = host.run_builtin(ctx.raw()->ctx, id, static_cast<int32_t>(in.size()), in.data(),
                            static_cast<int32_t>(out.size()), &n, out.data());
  if (rc != 0 && n > static_cast<int32_t>(out.size())) {  // more outputs than room: again with room
    out.resize(static_cast<size_t>(n));
    rc = host.run_builtin(ctx.raw()->ctx, id, static_cast<int32_t>(in.size()), in.data(), n, &n, out.data());
  }
  detail::Check(rc);
  return std::vector<TensorView>(out.begin(), out.begin() + n);
}

// A graph value during Interpret: a tensor, or a constant number.
struct Value {
  TensorView tensor;
  bool is_number = false;
  double number = 0;
};

// Run `graph` node by node: `handler(node, args, outs)` runs a node itself and returns true, or
// returns false to hand it to the runtime's kernel. Sets the run's outputs.
inline void Interpret(const Graph &graph, RunContext &ctx,
                      const std::function<bool(const Node &, const std::vector<Value> &,
                                               std::vector<TensorView> &)> &handler) {
  std::vector<std::vector<TensorView>> values(static_cast<size_t>(graph.num_nodes()));
  auto get = [&](const ob_ref &r) {
    Value v;
    if (r.kind == OB_REF_INPUT) {
      v.tensor = ctx.input(r.index);
    } else if (r.kind == OB_REF_OUTPUT) {
      v.tensor = values[static_cast<size_t>(r.node)][static_cast<size_t>(r.index)];
    } else if (graph.constant(r.index).kind == OB_CONST_TENSOR) {
      v.tensor = ctx.Const(r.index);
    } else {
      v.is_number = graph.constant(r.index).kind == OB_CONST_NUMBER;
      v.number = graph.constant(r.index).number;
    }
    return v;
  };
  for (int i = 0; i < graph.num_nodes(); ++i) {
    Node node = graph.node(i);
    std::vector<Value> args;
    for (int k = 0; k < node.num_inputs(); ++k) args.push_back(get(node.input(k)));
    std::vector<TensorView> outs;
    if (!handler(node, args, outs)) {
      std::vector<TensorView> plain;
      for (const auto &a : args) plain.push_back(a.tensor);
      outs = ctx.RunNode(node, plain);
    }
    if (static_cast<int>(outs.size()) != node.num_outputs())
      throw std::runtime_error("node %" + std::to_string(node.id()) + " (" + node.op() + ") gave " +
                               std::to_string(outs.size()) + " outputs, expected " +
                               std::to_string(node.num_outputs()));
    values[static_cast<size_t>(i)] = std::move(outs);
  }
  std::vector<TensorView> outs;
  for (int k = 0; k < graph.num_outputs(); ++k) outs.push_back(get(graph.output(k)).tensor);
  ctx.SetOutputs(outs);
}

// What a plugin implements. Build is called once per graph (one per input signature of a jitted
// function); Run once per call. Throw to fail (the message reaches Python as a RuntimeError).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual GraphId Build(const Graph &graph, const Config &config) = 0;
  virtual void Run(GraphId id, RunContext &ctx) = 0;
  // false: calls that record gradients run on ms_backend (the forward run gives no backward).
  virtual bool Differentiable() const { return false; }
};

}  // namespace backend
}  // namespace opbuilder

#define OB_BACKEND_CAT2(a, b) a##b
#define OB_BACKEND_CAT(a, b) OB_BACKEND_CAT2(a, b)
// Register backend `name` (a string) implemented by `Class` (default-constructible, a Backend).
#define OB_REGISTER_BACKEND(name, Class)                                                                   \
  static const ::opbuilder::backend::detail::Registrar OB_BACKEND_CAT(ob_backend_registrar_, __LINE__)( \
      name, [] { return std::unique_ptr<::opbuilder::backend::Backend>(new Class()); });

#include "opbuilder/detail/backend_entry.h"  // the registry, the trampolines, opbuilder_backend_init
