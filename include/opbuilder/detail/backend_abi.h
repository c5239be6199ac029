// The C ABI between a backend plugin (backend.h) and the runtime: the plain structs graphs, tensors,
// options and the host's callbacks cross as (runtime/graph/plugin_abi.py is the same structs, as
// ctypes sees them: change both together). Not for plugin authors, who use backend.h's classes.
// Included by backend.h.
#pragma once

#include <cstdint>

#define OB_BACKEND_ABI 1u

extern "C" {
// A tensor: `handle` names it to the runtime (-1: a shape/dtype description only, data NULL).
typedef struct ob_tensor {
  void *data;
  const char *dtype;  // numpy's names: "float32", "float64", "int64", "bool", ...
  int32_t ndim;
  const int64_t *shape;
  int64_t handle;
} ob_tensor;

enum { OB_REF_INPUT = 0, OB_REF_CONST = 1, OB_REF_OUTPUT = 2 };
// A value in the graph: graph input `index`, constant `index`, or output `index` of node `node`.
typedef struct ob_ref {
  int32_t kind;
  int32_t index;
  int32_t node;
} ob_ref;

enum { OB_ATTR_NONE = 0, OB_ATTR_INT, OB_ATTR_FLOAT, OB_ATTR_BOOL, OB_ATTR_STR, OB_ATTR_INTS, OB_ATTR_FLOATS,
       OB_ATTR_OTHER };
// A node attribute (a keyword argument of the op). `text`: the string of a STR, else the Python repr.
typedef struct ob_attr {
  const char *name;
  int32_t kind;
  int32_t count;  // elements of ints / floats
  int64_t i;      // INT, BOOL
  double f;       // FLOAT
  const int64_t *ints;
  const double *floats;
  const char *text;
} ob_attr;

enum { OB_CONST_TENSOR = 0, OB_CONST_NUMBER = 1, OB_CONST_OTHER = 2 };
// A constant: a captured tensor (its data through host->get_const at run time), a number, or another
// Python value (only its repr).
typedef struct ob_const {
  int32_t kind;
  double number;
  ob_tensor meta;
  const char *text;
} ob_const;

typedef struct ob_node {
  int32_t id;
  const char *op;    // "sin", "mul", "sum", "Custom(CustomAdd)", "fused[...]", ...
  const char *kind;  // "primitive", "function", "cpp", "custom", "cell"
  int32_t ninputs;
  const ob_ref *inputs;
  int32_t nattrs;
  const ob_attr *attrs;
  int32_t noutputs;
  const ob_tensor *outputs;  // shapes and dtypes (handle -1)
} ob_node;

// Nodes in topological order. Valid for as long as the runtime keeps the built graph.
typedef struct ob_graph {
  const char *name;
  int64_t handle;
  int32_t ninputs;
  const ob_tensor *inputs;  // shapes and dtypes
  int32_t nconsts;
  const ob_const *consts;
  int32_t nnodes;
  const ob_node *nodes;
  int32_t noutputs;
  const ob_ref *outputs;
} ob_graph;

typedef struct ob_option {
  const char *key;
  const char *value;  // str options as they are, others as their repr
} ob_option;

typedef struct ob_config {
  const char *jit_level;
  int32_t noptions;
  const ob_option *options;
} ob_config;

// One run of a built graph. `ctx` is the runtime's; the plugin sets noutputs/outputs (capacity: the
// graph's output count).
typedef struct ob_run {
  void *ctx;
  int32_t ninputs;
  const ob_tensor *inputs;
  int32_t noutputs;
  ob_tensor *outputs;
} ob_run;

// What the runtime offers a plugin. Each returns 0 on success; on failure the runtime keeps the error
// and raises it once the plugin returns.
typedef struct ob_host {
  uint32_t abi;
  int32_t verbose;  // OPBUILDER_VERBOSE is set
  // Build `graph` on a built-in backend ("ms_backend"); its id for run_builtin.
  int (*build_builtin)(const ob_graph *graph, const char *backend, const ob_config *config, uint64_t *id);
  // Run a graph built by build_builtin on `inputs`; at most `cap` outputs, their count in *nout.
  int (*run_builtin)(void *ctx, uint64_t id, int32_t nin, const ob_tensor *inputs, int32_t cap, int32_t *nout,
                     ob_tensor *outputs);
  // Run node `node` of this run's graph with the runtime's kernel. `args` has one entry per node input
  // (entries for constants are ignored); `outs` gets the node's outputs.
  int (*run_node)(void *ctx, int32_t node, const ob_tensor *args, ob_tensor *outs);
  // A new tensor owned by the runtime until the run ends (or longer, when it is an output).
  int (*alloc)(void *ctx, const char *dtype, int32_t ndim, const int64_t *shape, ob_tensor *out);
  // The current data of tensor constant `index` (a Parameter, say).
  int (*get_const)(void *ctx, int32_t index, ob_tensor *out);
} ob_host;

// One backend of a library, as the runtime sees it.
typedef struct ob_backend {
  const char *name;
  void *self;
  int32_t differentiable;  // 0: calls that record gradients run on ms_backend instead
  int (*build)(void *self, const ob_graph *graph, const ob_config *config, uint64_t *id, char *err, int64_t errlen);
  int (*run)(void *self, uint64_t id, ob_run *run, char *err, int64_t errlen);
} ob_backend;
}
