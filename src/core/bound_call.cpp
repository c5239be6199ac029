// The core library's bodies of the functions opbuilder/detail/bound_call.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/detail/bound_call.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/detail/bound_call.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

namespace {
// runtime._native.bound_hook (runtime/jit/tracing.py), looked up once, kept for the process (GIL held).
PyObject *BoundHook() {
  static PyObject *hook = nullptr;
  if (hook == nullptr) hook = ImportAttr("runtime._native", "bound_hook");
  return hook;
}
}  // namespace

OB_CORE_FN const Tensor *StorageArgument(const Tensor &r, const ReturnedArgs &args) {
  auto same = [&r](const Tensor *a) {
    return a != nullptr && a != &r && !r.storage().owner_before(a->storage()) && !a->storage().owner_before(r.storage());
  };
  for (std::size_t i = 0; i < args.n; ++i) {
    if (same(args.tensors[i])) return args.tensors[i];
    if (args.lists[i] == nullptr) continue;
    for (const TensorPtr &t : *args.lists[i]) {
      if (same(t.get())) return t.get();
    }
  }
  return nullptr;
}

OB_CORE_FN const BoundSite *NewBoundSite(PyObject *module, const char *name, bool keyword_only,
                                         const FfiBoundEntry *ffi) {
  // the target cells, one per (module, name): modules live for the process, so their addresses stay theirs
  static std::vector<std::pair<std::pair<PyObject *, std::string>, std::shared_ptr<PyObject *>>> cells;
  std::shared_ptr<PyObject *> target;
  for (auto &[key, cell] : cells) {
    if (key.first == module && key.second == name) target = cell;
  }
  if (!target) {
    target = std::make_shared<PyObject *>(nullptr);
    cells.push_back({{module, name}, target});
  }
  PyObject *capsule = Py_None;
  if (ffi != nullptr) {
    capsule = Check(PyCapsule_New(const_cast<FfiBoundEntry *>(ffi), "opbuilder.ffi_bound", nullptr));
  } else {
    Py_INCREF(capsule);
  }
  PyObject *stop = keyword_only
                       ? Check(PyUnicode_FromString("takes keyword-only arguments, which a replay cannot pass"))
                       : nullptr;
  return new BoundSite{Check(PyUnicode_FromString(name)), std::move(target), stop, capsule};
}

OB_CORE_FN void BoundSiteDefined(const BoundSite &site, PyObject *module, const char *name) {
  PyObject *now = Check(PyObject_GetAttrString(module, name));  // kept for the process, as the module's
  Py_XDECREF(*site.target);
  *site.target = now;
}

OB_CORE_FN void StopBoundTrace(const BoundSite &site) {
  PyObject *why = site.stop != nullptr ? site.stop : Py_None;
  PyRef r = PyRef::Steal(Check(PyObject_CallFunctionObjArgs(BoundHook(), site.name, Py_None, why, nullptr)));
}

OB_CORE_FN PyObject *RecordBoundCall(const BoundSite &site, PyObject *args) {
  return Check(PyObject_CallFunctionObjArgs(BoundHook(), site.name, *site.target, args, site.ffi, nullptr));
}

}  // namespace detail

}  // namespace opbuilder
