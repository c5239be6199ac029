// XLA FFI handlers compiled into an operator module. Not needed: to_jax runs every C++ module
// function of tensors as an XLA custom call by default, whole, through generic handlers built once per
// JAX version (src/jax_ffi.cpp, detail/ffi_bound.h), so no operator needs XLA's headers. This header is
// the older opt-in form, kept for modules that use it: its handlers run one Function through its
// entry (detail/ffi_entry.h), compiled per module. Include it only in sources that use it, and build
// them with extra_include_paths=[jax.ffi.include_dir()] (XLA's headers).
//
//   OB_MODULE(m) {
//     m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return Mul::Apply(x, y); });
//     m.def("mul_infer_shape", Mul::InferShapeFunction());  // to_jax takes the result shapes from it
//     OB_XLA_FFI(m, "mul", Mul);  // adds the PyCapsules mul_xla_fwd and mul_xla_bwd
//   }
//
// The rules below are this form's (docs/reference/interop.md has the generic handlers').
// JAX arrays are immutable, so XLA's input buffers are never written. A Function gets them as
// private writable copies (so an in-place op, MarkDirty or not, runs on a copy, its result is copied
// to the output, and the caller's array is unchanged: under JAX an in-place op is functional, as on
// to_jax's callback path). A Function that declares `static constexpr bool kAcceptsViews = true;`
// gets the same writable copies until its type is known to write nothing (Function<T>::Writes(),
// call_rules.h: a call, here or in the runtime, completed without a write); after that, XLA's memory
// itself as read-only Tensors (no copy: it must honour is_writable() and never write them; MarkDirty
// on one is then an error naming to_jax's `mutates`). A type seen to write keeps the copies. The
// output cotangents given to Backward follow their own rule, learnt apart (what Backward does to
// them): read-only private copies until known untouched, then XLA's memory. An input declared written
// (to_jax(module, mutates={name: [i]})) is aliased to the output of its shape and dtype
// (input_output_aliases): XLA copies it into that result buffer, or donates it, and Forward gets
// that buffer writable, with no copy of its own.
// While Forward runs, XLA's result buffers are offered to new host Tensors of their size (detail/tensor_details.h's
// OfferedBuffers), so outputs are usually built in place; any other output is copied in. The
// backward handler gets the inputs and the output cotangents, runs Forward again (inside a jitted
// function there is no forward context to keep; as when the runtime records, a write to an input
// without MarkDirty is an error), then T::Backward (the gradient buffers offered; only the inputs JAX
// differentiates get one, the call's `needs` attribute, and NeedsInputGrad(i) is false for the rest),
// and writes the gradients out (a null gradient becomes zeros; one in a shape its input broadcasts to
// is summed down to the input's shape, as the runtime's engine does). Gradients are in the runtime's
// (torch's) convention here; to_jax conjugates complex cotangents and gradients around the call
// (JAX's convention), as on its callback path. Both run on XLA's thread without the GIL and
// without the runtime: Forward and Backward must not need Python (host Tensors, SaveForBackward and
// GetSavedTensors do not; ctx->saved_data does: using it here is an error naming the Function), and
// must not keep a tensor they allocate past the call (it may be XLA's memory). Forward's arguments
// after ctx must all be tensors (TensorPtr).
#pragma once

#if defined(__has_include)
#if !__has_include("xla/ffi/api/ffi.h")
#error "opbuilder/xla_ffi.h needs XLA's FFI headers: build with extra_include_paths=[jax.ffi.include_dir()]"
#endif
#endif

#include "opbuilder/autograd.h"
#include "opbuilder/detail/xla_ffi_handlers.h"

// Inside OB_MODULE(m): binds T's XLA FFI handlers as the capsules <name>_xla_fwd and <name>_xla_bwd.
#define OB_XLA_FFI(m, name, T) ::opbuilder::detail::xla_ffi::Export<T>((m).ptr(), (name))
