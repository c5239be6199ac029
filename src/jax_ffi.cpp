// to_jax's generic XLA FFI handlers: one forward and one backward custom-call target that run any C++
// module function of tensors (OB_MODULE's m.def) whole, through the FfiBoundEntry its module already has
// (detail/ffi_bound.h), named by the call's `entry` attribute; each Function<T>::Apply it makes runs
// through the handlers' runner (xla_ffi_handlers.h BoundHandlers). Built once per JAX version by
// opbuilder/bridges/interop_jax_ffi.py (XLA's headers from jax.ffi.include_dir()), through the builder
// like any operator, so no operator needs XLA's headers or an OB_XLA_FFI line. Attributes: `needs`
// (which inputs JAX differentiates), and on the forward `record` (1: a tape for the backward, named by
// a token result). The module holds the capsules `bound_forward` and `bound_backward` (what
// jax.ffi.register_ffi_target takes), and `host`: the target of a call the C++ route cannot take (a
// Python function, static arguments), whose body is to_jax's callback code in Python.
#include "opbuilder/extension.h"
#include "opbuilder/detail/xla_ffi_handlers.h"

namespace {

namespace ffi = ::xla::ffi;
using opbuilder::detail::xla_ffi::BoundEntryAt;
using opbuilder::detail::xla_ffi::BoundHandlers;

// A bound function run whole (xla_ffi_handlers.h BoundHandlers): `record` 1 adds the token result.
ffi::Error BoundForward(std::int64_t entry, std::int64_t needs, std::int64_t record, ffi::RemainingArgs args,
                        ffi::RemainingRets rets) {
  try {
    return BoundHandlers(BoundEntryAt(entry)).Forward(args, rets, static_cast<std::uint64_t>(needs), record != 0);
  } catch (const std::exception &e) {
    return ffi::Error::Internal(std::string("to_jax (XLA FFI forward): ") + e.what());
  }
}

ffi::Error BoundBackward(std::int64_t entry, std::int64_t needs, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  try {
    return BoundHandlers(BoundEntryAt(entry)).Backward(args, rets, static_cast<std::uint64_t>(needs));
  } catch (const std::exception &e) {
    return ffi::Error::Internal(std::string("to_jax (XLA FFI backward): ") + e.what());
  }
}

XLA_FFI_Error *BoundForwardTarget(XLA_FFI_CallFrame *frame) {
  static auto *h = ffi::Ffi::Bind()
                       .Attr<std::int64_t>("entry")
                       .Attr<std::int64_t>("needs")
                       .Attr<std::int64_t>("record")
                       .RemainingArgs()
                       .RemainingRets()
                       .To(BoundForward)
                       .release();
  return h->Call(frame);
}

XLA_FFI_Error *BoundBackwardTarget(XLA_FFI_CallFrame *frame) {
  static auto *h = ffi::Ffi::Bind()
                       .Attr<std::int64_t>("entry")
                       .Attr<std::int64_t>("needs")
                       .RemainingArgs()
                       .RemainingRets()
                       .To(BoundBackward)
                       .release();
  return h->Call(frame);
}

// The pending Python error as "<type name>: <message>", cleared.
std::string PythonErrorText() {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  std::string text = "a Python error";
  PyObject *name = type != nullptr ? PyObject_GetAttrString(type, "__name__") : nullptr;
  PyObject *msg = value != nullptr ? PyObject_Str(value) : nullptr;
  const char *n = name != nullptr ? PyUnicode_AsUTF8(name) : nullptr;
  const char *s = msg != nullptr ? PyUnicode_AsUTF8(msg) : nullptr;
  if (n != nullptr) text = std::string(n) + (s != nullptr && *s != 0 ? std::string(": ") + s : std::string());
  PyErr_Clear();
  Py_XDECREF(name);
  Py_XDECREF(msg);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return text;
}

// fn(inputs, results) with the GIL: `fn` is a Python callable to_jax keeps alive (its address), the
// inputs read-only and the results writable memoryviews over XLA's buffers.
ffi::Error Host(std::int64_t fn, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  static char empty = 0;
  PyGILState_STATE gil = PyGILState_Ensure();
  std::string err;
  PyObject *ins = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
  PyObject *outs = PyTuple_New(static_cast<Py_ssize_t>(rets.size()));
  bool ok = ins != nullptr && outs != nullptr;
  for (std::size_t i = 0; ok && i < args.size(); ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) {
      err = "argument " + std::to_string(i) + ": " + b.error().message();
      ok = false;
      break;
    }
    char *p = b->size_bytes() != 0 ? static_cast<char *>(b->untyped_data()) : &empty;
    PyObject *mv = PyMemoryView_FromMemory(p, static_cast<Py_ssize_t>(b->size_bytes()), PyBUF_READ);
    ok = mv != nullptr && PyTuple_SetItem(ins, static_cast<Py_ssize_t>(i), mv) == 0;
  }
  for (std::size_t j = 0; ok && j < rets.size(); ++j) {
    auto r = rets.get<ffi::AnyBuffer>(j);
    if (!r.has_value()) {
      err = "result " + std::to_string(j) + ": " + r.error().message();
      ok = false;
      break;
    }
    char *p = (**r).size_bytes() != 0 ? static_cast<char *>((**r).untyped_data()) : &empty;
    PyObject *mv = PyMemoryView_FromMemory(p, static_cast<Py_ssize_t>((**r).size_bytes()), PyBUF_WRITE);
    ok = mv != nullptr && PyTuple_SetItem(outs, static_cast<Py_ssize_t>(j), mv) == 0;
  }
  if (ok) {
    PyObject *res = PyObject_CallFunctionObjArgs(reinterpret_cast<PyObject *>(static_cast<std::intptr_t>(fn)), ins,
                                                 outs, nullptr);
    ok = res != nullptr;
    Py_XDECREF(res);
  }
  if (!ok && err.empty()) err = PythonErrorText();
  Py_XDECREF(ins);
  Py_XDECREF(outs);
  PyGILState_Release(gil);
  return err.empty() ? ffi::Error::Success() : ffi::Error::Internal(err);
}

XLA_FFI_Error *HostTarget(XLA_FFI_CallFrame *frame) {
  static auto *h = ffi::Ffi::Bind().Attr<std::int64_t>("fn").RemainingArgs().RemainingRets().To(Host).release();
  return h->Call(frame);
}

}  // namespace

OB_MODULE(m) {
  opbuilder::detail::xla_ffi::AddCapsule(m.ptr(), "host", &HostTarget);
  opbuilder::detail::xla_ffi::AddCapsule(m.ptr(), "bound_forward", &BoundForwardTarget);
  opbuilder::detail::xla_ffi::AddCapsule(m.ptr(), "bound_backward", &BoundBackwardTarget);
  // how many tapes wait for their backward (tests: the table is bounded and emptied by backward calls)
  m.def("pending_tapes", []() { return opbuilder::detail::xla_ffi::TapeTable::Get().size(); });
}
