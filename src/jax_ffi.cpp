// to_jax's generic XLA FFI handlers: one forward and one backward custom-call target that run any
// Function<T> through the FfiEntry its module already has (detail/ffi_entry.h), named by the call's
// `entry` attribute. Built once per JAX version by opbuilder/bridges/interop_jax_ffi.py (XLA's headers
// from jax.ffi.include_dir()), through the builder like any operator, so no operator needs XLA's
// headers or an OB_XLA_FFI line. The module holds the capsules `forward` and `backward`
// (what jax.ffi.register_ffi_target takes).
#include "opbuilder/extension.h"
#include "opbuilder/detail/xla_ffi_handlers.h"

namespace {

namespace ffi = ::xla::ffi;
using opbuilder::detail::xla_ffi::EntryAt;
using opbuilder::detail::xla_ffi::Handlers;

ffi::Error Forward(std::int64_t entry, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  try {
    return Handlers(EntryAt(entry)).Forward(args, rets);
  } catch (const std::exception &e) {
    return ffi::Error::Internal(std::string("to_jax (XLA FFI forward): ") + e.what());
  }
}

ffi::Error Backward(std::int64_t entry, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  try {
    return Handlers(EntryAt(entry)).Backward(args, rets);
  } catch (const std::exception &e) {
    return ffi::Error::Internal(std::string("to_jax (XLA FFI backward): ") + e.what());
  }
}

XLA_FFI_Error *ForwardTarget(XLA_FFI_CallFrame *frame) {
  static auto *h =
      ffi::Ffi::Bind().Attr<std::int64_t>("entry").RemainingArgs().RemainingRets().To(Forward).release();
  return h->Call(frame);
}

XLA_FFI_Error *BackwardTarget(XLA_FFI_CallFrame *frame) {
  static auto *h =
      ffi::Ffi::Bind().Attr<std::int64_t>("entry").RemainingArgs().RemainingRets().To(Backward).release();
  return h->Call(frame);
}

}  // namespace

OB_MODULE(m) {
  opbuilder::detail::xla_ffi::AddCapsule(m.ptr(), "forward", &ForwardTarget);
  opbuilder::detail::xla_ffi::AddCapsule(m.ptr(), "backward", &BackwardTarget);
}
