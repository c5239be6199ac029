// A backend plugin on the native API (opbuilder/backend.h): it reads the whole graph in Build, runs
// elementwise nodes on float32/float64 tensors of the node's own shape with its own loops, and hands
// every other node (broadcasts, reductions, matmul, ...) back to the runtime's kernel.
// Options (jit(..., option=...)): log="1" prints the graph in Build and what ran where in Run;
// fail="build" / fail="run" throws there; fail="foreign_output" returns a tensor the runtime never gave.
// "native_grad" is the same backend declared differentiable (it also gets backward graphs).
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "opbuilder/backend.h"

namespace ob = opbuilder::backend;

namespace {

std::string Shape(const ob::TensorView &t) {
  std::string s = t.dtype() + "[";
  for (int d = 0; d < t.ndim(); ++d) s += (d ? ", " : "") + std::to_string(t.shape()[static_cast<size_t>(d)]);
  return s + "]";
}

std::string Attr(const ob_attr &a) {
  std::string s = std::string(a.name) + "=";
  switch (a.kind) {
    case OB_ATTR_INTS: {
      s += "ints(";
      for (int k = 0; k < a.count; ++k) s += (k ? "," : "") + std::to_string(a.ints[k]);
      return s + ")";
    }
    case OB_ATTR_BOOL:
      return s + (a.i ? "true" : "false");
    case OB_ATTR_INT:
      return s + "int(" + std::to_string(a.i) + ")";
    default:
      return s + a.text;
  }
}

template <typename T>
bool Apply(const std::string &op, const std::vector<const T *> &in, const std::vector<double> &num,
           const std::vector<bool> &is_num, T *out, int64_t n) {
  auto arg = [&](size_t k, int64_t i) { return is_num[k] ? static_cast<T>(num[k]) : in[k][i]; };
  if (op == "add" || op == "sub" || op == "mul" || op == "div") {
    if (in.size() != 2) return false;
    for (int64_t i = 0; i < n; ++i) {
      T a = arg(0, i), b = arg(1, i);
      out[i] = op == "add" ? a + b : op == "sub" ? a - b : op == "mul" ? a * b : a / b;
    }
    return true;
  }
  if (in.size() != 1 || is_num[0]) return false;
  if (op == "neg") {
    for (int64_t i = 0; i < n; ++i) out[i] = -in[0][i];
  } else if (op == "sin") {
    for (int64_t i = 0; i < n; ++i) out[i] = std::sin(in[0][i]);
  } else if (op == "cos") {
    for (int64_t i = 0; i < n; ++i) out[i] = std::cos(in[0][i]);
  } else if (op == "exp") {
    for (int64_t i = 0; i < n; ++i) out[i] = std::exp(in[0][i]);
  } else if (op == "tanh") {
    for (int64_t i = 0; i < n; ++i) out[i] = std::tanh(in[0][i]);
  } else {
    return false;
  }
  return true;
}

class NativeBackend : public ob::Backend {
 public:
  ob::GraphId Build(const ob::Graph &graph, const ob::Config &config) override {
    if (config.Get("fail") == "build") throw std::runtime_error("this graph is refused on purpose");
    bool log = config.Get("log") == "1";
    if (log) {
      std::fprintf(stderr, "native: build %s level=%s nodes=%d\n", graph.name().c_str(), config.jit_level().c_str(),
                   graph.num_nodes());
      for (int i = 0; i < graph.num_nodes(); ++i) {
        ob::Node n = graph.node(i);
        std::string line = "native: %" + std::to_string(n.id()) + " " + n.op() + " (" + n.kind() + ")";
        for (int k = 0; k < n.num_inputs(); ++k) {
          const ob_ref &r = n.input(k);
          line += r.kind == OB_REF_INPUT    ? " in" + std::to_string(r.index)
                  : r.kind == OB_REF_OUTPUT ? " %" + std::to_string(r.node)
                                            : " const:" + std::string(graph.constant(r.index).text);
        }
        for (int k = 0; k < n.num_attrs(); ++k) line += " " + Attr(n.attr_at(k));
        line += " -> " + Shape(n.output(0));
        std::fprintf(stderr, "%s\n", line.c_str());
      }
    }
    graphs_.push_back({graph, config.Get("fail"), log});
    return graphs_.size() - 1;
  }

  void Run(ob::GraphId id, ob::RunContext &ctx) override {
    const Built &b = graphs_.at(id);
    if (b.fail == "run") throw std::runtime_error("run refused on purpose");
    std::string own, delegated;
    ob::Interpret(b.graph, ctx, [&](const ob::Node &node, const std::vector<ob::Value> &args,
                                    std::vector<ob::TensorView> &outs) {
      bool handled = RunItself(node, args, ctx, outs);
      (handled ? own : delegated) += " " + node.op();
      return handled;
    });
    if (b.fail == "foreign_output") {
      ob_tensor t = ctx.raw()->outputs[0];
      t.handle = 9999;
      ctx.raw()->outputs[0] = t;
    }
    if (b.log) std::fprintf(stderr, "native: run own:%s | delegated:%s\n", own.c_str(), delegated.c_str());
  }

 private:
  struct Built {
    ob::Graph graph;
    std::string fail;
    bool log;
  };

  static bool RunItself(const ob::Node &node, const std::vector<ob::Value> &args, ob::RunContext &ctx,
                        std::vector<ob::TensorView> &outs) {
    if (node.kind() != "primitive" || node.num_outputs() != 1 || node.num_attrs() != 0) return false;
    ob::TensorView meta = node.output(0);
    const std::string dtype = meta.dtype();
    if (dtype != "float32" && dtype != "float64") return false;
    std::vector<const void *> in;
    std::vector<double> num;
    std::vector<bool> is_num;
    for (const auto &a : args) {
      if (!a.is_number && (a.tensor.data_ptr() == nullptr || a.tensor.dtype() != dtype ||
                           a.tensor.shape() != meta.shape()))
        return false;  // a broadcast or another dtype: the runtime's kernel does it
      in.push_back(a.is_number ? nullptr : a.tensor.data_ptr());
      num.push_back(a.number);
      is_num.push_back(a.is_number);
    }
    ob::TensorView out = ctx.Alloc(dtype, meta.shape());
    bool ok;
    if (dtype == "float32") {
      std::vector<const float *> p;
      for (auto v : in) p.push_back(static_cast<const float *>(v));
      ok = Apply<float>(node.op(), p, num, is_num, out.data<float>(), out.numel());
    } else {
      std::vector<const double *> p;
      for (auto v : in) p.push_back(static_cast<const double *>(v));
      ok = Apply<double>(node.op(), p, num, is_num, out.data<double>(), out.numel());
    }
    if (ok) outs = {out};
    return ok;
  }

  std::vector<Built> graphs_;
};

// The same backend declared differentiable: a call that records a gradient runs its forward graph
// here and, when the gradient is asked for, the backward graph too.
class NativeGradBackend : public NativeBackend {
 public:
  bool Differentiable() const override { return true; }
};

}  // namespace

OB_REGISTER_BACKEND("native_backend", NativeBackend)
OB_REGISTER_BACKEND("native_grad", NativeGradBackend)
// More names for the same class: the runtime sets no limit on how many backends are registered.
OB_REGISTER_BACKEND("native_1", NativeBackend)
OB_REGISTER_BACKEND("native_2", NativeBackend)
OB_REGISTER_BACKEND("native_3", NativeBackend)
OB_REGISTER_BACKEND("native_4", NativeBackend)
OB_REGISTER_BACKEND("native_5", NativeBackend)
OB_REGISTER_BACKEND("native_6", NativeBackend)
OB_REGISTER_BACKEND("native_7", NativeBackend)
OB_REGISTER_BACKEND("native_8", NativeBackend)
OB_REGISTER_BACKEND("native_9", NativeBackend)
OB_REGISTER_BACKEND("native_10", NativeBackend)
OB_REGISTER_BACKEND("native_11", NativeBackend)
