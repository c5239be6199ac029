// The C table a framework bridge hands to operators (not for operator authors).
//
// opbuilder.to_torch builds one bridge per torch build (src/torch_bridge.cpp, compiled
// against libtorch by opbuilder/bridges/torch_bridge.py) and stores a pointer to its ForeignApi in the slot
// runtime._native.bridge_slot_address() names. Operators read the slot (runtime_bridge.h): while a
// bridge call is active on this thread (the bridge's callable called the operator from the current
// Python frame), torch tensors go in as Tensors over their memory, results come out as torch tensors
// over the memory the kernel wrote, and Function<T>::Apply records its node in torch's autograd graph.
// Plain C types only: the bridge is built by another compiler mode (C++20, torch's headers) than the
// operators, and they share nothing but this table.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace opbuilder {
namespace detail OB_HIDDEN {

// Bumped whenever a field below changes; an operator ignores a bridge with another number.
constexpr std::uint32_t kForeignAbi = 8;

// A framework tensor's memory as the operator sees it (strides in elements); ndim == -1: no tensor.
struct ForeignTensor {
  void *data;
  const std::int64_t *shape;
  const std::int64_t *strides;  // nullptr: C-contiguous
  std::int32_t ndim;
  std::int32_t dtype;          // an opbuilder::DataType
  std::int32_t requires_grad;  // 1: needs a gradient (grad mode aside)
  void *handle;                // the framework's reference that keeps `data` alive: ForeignApi::release
  std::int32_t device;         // -1: host memory; else the CUDA device index
};

// A node to record: the bridge owns `state` from the call on (destroy(state) when the node goes).
struct ForeignNode {
  void *state;
  const char *name;
  std::size_t nargs;
  void *const *inputs;        // per Forward argument: the handle of a tensor that needs a gradient, or null
  std::size_t nout;
  PyObject *const *outputs;   // per output: the framework tensor to attach, or null (no gradient)
  const int *dirty;           // per output: 1 + its argument's index if it is an input modified in place, else 0
  int materialize;            // 1: gradients the framework leaves undefined arrive as zeros
  // One gradient per Forward argument into out[0..nargs) (out[i].ndim == -1: none), each with a `keep`
  // for drop(); grads[j].ndim == -1 for a gradient that did not arrive (the callee releases the
  // handles of the others). 0 on success; else -1 with a Python error set.
  int (*backward)(void *state, const ForeignTensor *grads, std::size_t ngrads, ForeignTensor *out,
                  void **keep, std::size_t nargs);
  void (*drop)(void *keep);      // frees a `keep` that backward handed out with a gradient
  void (*release)(void *state);  // after a backward without retain_graph: drop what was saved
  void (*destroy)(void *state);
};

struct ForeignApi {
  std::uint32_t abi;
  // 1 while this thread runs a bridge call from the current Python frame.
  int (*active)(void);
  // 1: `o` filled `*out` (a tensor of a dtype operators take, on the host or, with a CUDA bridge, a device);
  // 0: not one; -1: a Python error is set.
  int (*unpack)(PyObject *o, ForeignTensor *out);
  void (*release)(void *handle);
  // A new framework tensor over `t`'s memory; `drop(keep)` runs when the framework frees it. `t` (its
  // shape and strides) is read during the call only.
  PyObject *(*wrap)(const ForeignTensor *t, void *keep, void (*drop)(void *));
  int (*grad_enabled)(void);
  int (*set_grad_enabled)(int on);  // returns the previous mode
  void (*bump_version)(void *handle);  // an in-place write through the operator
  PyObject *(*object_of)(void *handle);  // the framework's own tensor object for an unpacked handle (new reference)
  // 0, or -1 with a Python error set (an in-place change the framework refuses).
  int (*record)(const ForeignNode *node);
  // `nbytes` of CUDA memory on `device` from the framework's allocator (zeroed if `zero`), ordered on
  // its current stream; *handle keeps it (release). nullptr with *handle null: a Python error is set.
  void *(*allocate)(std::int64_t nbytes, std::int32_t device, int zero, void **handle);
  // The framework's current CUDA stream on `device` (-1: the current device); nullptr is the default
  // stream, or an error if a Python error is set.
  void *(*stream)(std::int32_t device);
  // A new framework tensor that is a view of the unpacked tensor `handle` (an argument Forward
  // returned unchanged): it shares the argument's version counter. New reference.
  PyObject *(*alias)(void *handle);
  // The version counter of framework tensor `o`, kept without `o` itself (unwatch frees it); nullptr
  // with a Python error set if it has none.
  void *(*watch)(PyObject *o);
  std::int64_t (*watched)(void *watch);
  void (*unwatch)(void *watch);
  // 1 while the framework's saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks) apply to a
  // tensor saved for backward now, else 0.
  int (*hooks_active)(void);
  // Framework tensor `o` saved for backward through those hooks (the pack hook runs now; torch's
  // SavedVariable), freed by drop_saved; nullptr with a Python error set.
  void *(*pack)(PyObject *o);
  // The tensor the unpack hook gives back for `packed` into *out (out->handle: release): 0, or -1
  // with a Python error set.
  int (*unpack_saved)(void *packed, ForeignTensor *out);
  void (*drop_saved)(void *packed);
  // Why the framework refuses an in-place write into the unpacked tensor `handle` while grad mode is
  // on (torch's check_inplace: a leaf that requires grad, a view of one, ...), in its words (valid
  // until the next call on this thread); nullptr if it allows it.
  const char *(*write_refusal)(void *handle);
  // For an operator called straight on framework tensors (no bridge call needed): 1 when `o` is a plain
  // host tensor of a dtype operators take, with no lazy conjugate or negative bit, and `*out` describes
  // it (its handle null: `o` keeps the memory; shape and strides are `o`'s own, valid while it lives and
  // is not resized); 0 for any other object. Runs no Python code and sets no error.
  int (*peek)(PyObject *o, ForeignTensor *out);
  // A new framework tensor that is a view of framework tensor `base` over the elements `like` describes
  // (memory inside `base`'s, its dtype): an output Forward built on an argument's or another output's
  // storage. It shares `base`'s version counter. New reference; nullptr with no error where the framework
  // has no such view (negative strides, off its element grid, outside its storage); nullptr with a Python
  // error set on failure.
  PyObject *(*view)(PyObject *base, const ForeignTensor *like);
};

// `api` if it is a bridge of this ABI whose call is active on this thread from the current Python
// frame, else nullptr.
inline const ForeignApi *IfActive(const ForeignApi *api) {
  return api != nullptr && api->abi == kForeignAbi && api->active() ? api : nullptr;
}

// The slot runtime._native.bridge_slot_address() names, looked up once (null: no runtime). Callers hold the GIL.
inline const ForeignApi *const volatile *ForeignSlot() {
  static std::atomic<const ForeignApi *const volatile *> stored{nullptr};
  const ForeignApi *const volatile *slot = stored.load(std::memory_order_acquire);
  if (slot == nullptr) {
    PyObject *m = PyImport_ImportModule("runtime._native");
    PyObject *address = m != nullptr ? PyObject_CallMethod(m, "bridge_slot_address", nullptr) : nullptr;
    Py_XDECREF(m);
    if (address == nullptr) {  // no runtime: no bridge either
      PyErr_Clear();
      return nullptr;
    }
    slot = static_cast<const ForeignApi *const volatile *>(PyLong_AsVoidPtr(address));
    Py_DECREF(address);
    if (slot == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
    stored.store(slot, std::memory_order_release);
  }
  return slot;
}

// The active bridge, for code that has no Runtime at hand (device memory, the current stream).
inline const ForeignApi *ActiveForeign() {
  const ForeignApi *const volatile *slot = ForeignSlot();
  return slot != nullptr ? IfActive(*slot) : nullptr;
}

// The bridge of this ABI if one is loaded, active or not (ForeignApi::peek), else nullptr.
inline const ForeignApi *LoadedForeign() {
  const ForeignApi *const volatile *slot = ForeignSlot();
  const ForeignApi *api = slot != nullptr ? *slot : nullptr;
  return api != nullptr && api->abi == kForeignAbi ? api : nullptr;
}

// The storage deleter of a Tensor over a framework tensor's memory: drops the bridge's reference.
struct ForeignOwner {
  const ForeignApi *api;
  void *handle;
  bool argument = false;  // the caller's argument, unpacked (TensorFromObject): returned, it is itself
  void operator()(void *) const { api->release(handle); }
};

}  // namespace detail
}  // namespace opbuilder
