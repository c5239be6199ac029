// What a Function<T>'s context keeps while Apply runs and for Backward (autograd.h's AutogradContext
// holds one ContextState): the saved slots with the versions they check, the arguments while
// Forward runs, what Forward marked. Not for operator authors.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "opbuilder/detail/call_rules.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/tensor.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

// A version a saved slot checks: the runtime.Tensor (or a weak reference to it) and its version then.
struct VersionWatch {
  PyRef source;
  bool weak = false;
  std::int64_t version = 0;
  PyRef counter;  // with `weak`, where nothing else keeps its memory's counter: read once it is gone
};

// A tensor kept for Backward and the version it had when kept. An argument Forward returns
// unchanged is handed out as a new runtime.Tensor over its memory: a write through either
// changes what was saved, so the slot watches the argument and (weakly) each such output.
struct SavedSlot {
  TensorPtr tensor;
  PyRef version_source;  // the runtime.Tensor (for outputs: a weak reference to it)
  bool weak = false;
  std::int64_t version = 0;
  PyRef counter;  // with `weak`: the output's version counter, read once the output itself is gone
  std::vector<VersionWatch> aliases;  // outputs over a saved argument's memory
  std::shared_ptr<void> watch;  // the framework tensor's version counter (a bridge call's), else null
  std::shared_ptr<void> packed;  // kept by the framework's saved-tensor hooks instead (a bridge call's), else null
  PyRef hooked;  // (unpack, packed): kept by the runtime's saved_tensors_hooks instead, else null
};

// What Apply and the recorded node keep in a context (not for operator authors).
struct ContextState {
  const std::string *name = nullptr;
  // The Forward arguments while Apply runs (nullptr for non-tensors); nullptr after.
  Tensor *const *args = nullptr;
  // Per argument, while Apply runs: the caller's tensor where Forward was given a
  // private contiguous copy of it (nullptr where Forward got the caller's own).
  Tensor *const *originals = nullptr;
  std::size_t nargs = 0;
  std::vector<bool> needs;  // per argument; empty when nothing needs a gradient
  TensorPtrList saved_raw;
  std::vector<SavedSlot> saved;
  bool saved_final = false;
  bool released = false;
  bool materialize_grads = true;
  TensorPtrList non_differentiable;
  TensorPtrList dirty;
  WriteState *writes = nullptr;  // the Function type's: what its calls showed of writes (call_rules.h)

  int ArgIndex(const Tensor *t) const {
    for (std::size_t i = 0; i < nargs; ++i) {
      if (t != nullptr && args[i] == t) return static_cast<int>(i);
    }
    return -1;
  }
  bool IsDirty(const Tensor *t) const {
    for (const auto &d : dirty) {
      if (d.get() == t) return true;
    }
    return false;
  }
  bool IsNonDifferentiable(const Tensor *t) const {
    for (const auto &d : non_differentiable) {
      if (d.get() == t) return true;
    }
    return false;
  }
};

}  // namespace detail

}  // namespace opbuilder
