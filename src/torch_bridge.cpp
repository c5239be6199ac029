// opbuilder's bridge to PyTorch: a C++ torch::autograd node and zero-copy tensors for to_torch.
//
// Built once per torch build by opbuilder/bridges/torch_bridge.py (C++20 and torch's headers, as torch
// requires) into the Python module `_opbuilder_torch_bridge`; operators never include it. They see
// only the ForeignApi table (detail/foreign_api.h), whose address the module stores in the slot
// runtime._native.bridge_slot_address() names when it is imported.
//
// `Op(fn, fallback, defined, cuda)` is what to_torch calls once the bridge is ready: a call whose
// arguments are plain torch tensors on the CPU (or CUDA devices, if `cuda`) and numbers or strings,
// with no torch function or dispatch mode set,
// in a signature the Python path has checked (its first call, fingerprinted, wrote no argument unseen,
// and the function declares no writes: the keys of `defined`, to_torch's _Op.checked) and,
// for an operator with a shape rule, with shapes, dtypes and scalar values the Python path has checked
// the rule for, calls the operator `fn` directly with this thread's bridge call marked active;
// every other call goes to `fallback`, the Python path (torch.library), unchanged.
#include <Python.h>
#include <structmember.h>

#include <ATen/core/Tensor.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/SavedTensorHooks.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <optional>
#include <vector>

#include "opbuilder/detail/foreign_api.h"

namespace {

using opbuilder::detail::ForeignApi;
using opbuilder::detail::ForeignNode;
using opbuilder::detail::ForeignTensor;

// ---- dtypes: opbuilder::DataType order (dtype.h) ----------------------------------
constexpr c10::ScalarType kTypes[] = {
    c10::ScalarType::Bool,     c10::ScalarType::Char,         c10::ScalarType::Short,
    c10::ScalarType::Int,      c10::ScalarType::Long,         c10::ScalarType::Byte,
    c10::ScalarType::Half,     c10::ScalarType::Float,        c10::ScalarType::Double,
    c10::ScalarType::BFloat16, c10::ScalarType::ComplexFloat, c10::ScalarType::ComplexDouble,
    c10::ScalarType::UInt16,   c10::ScalarType::UInt32,       c10::ScalarType::UInt64};
constexpr int kNumTypes = sizeof(kTypes) / sizeof(kTypes[0]);

// kTypes inverted once: a table lookup per tensor, not a search
struct TypeIndex {
  std::int8_t of[256];
  TypeIndex() {
    for (auto &v : of) v = -1;
    for (int i = 0; i < kNumTypes; ++i) of[static_cast<std::uint8_t>(kTypes[i])] = static_cast<std::int8_t>(i);
  }
};
const TypeIndex kTypeIndex;

int DataTypeOf(c10::ScalarType s) {
  const auto k = static_cast<std::size_t>(s);
  return k < sizeof(kTypeIndex.of) ? kTypeIndex.of[k] : -1;
}

// ---- which bridge call is active: one per thread, tied to the Python frame it came from ----
// The Python frame this thread runs now, as an identity only: the interpreter's own frame record
// where the headers show it (PyEval_GetFrame would make a frame object for it on every call).
const void *CurrentFrame() {
#if defined(Py_LIMITED_API) || PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000
  return PyEval_GetFrame();
#elif PY_VERSION_HEX >= 0x030D0000
  return PyThreadState_GET()->current_frame;
#else
  return PyThreadState_GET()->cframe->current_frame;
#endif
}

struct Frame {
  const void *py;
  Frame *prev;
  PyObject *op = nullptr;  // the called operator's name (a str, borrowed), or null (a Backward)
  PyThreadState *ts = nullptr;  // the thread's state when the call began with the GIL held (Op's calls), or null
};
thread_local Frame *tls_frame = nullptr;

int Active() { return tls_frame != nullptr && tls_frame->py == CurrentFrame() ? 1 : 0; }

// Whether this thread holds the GIL. Inside an Op call, the thread state that holds the GIL being the
// call's own says so in a load (PyGILState_Check looks the thread's state up in thread-specific data).
bool HoldsGil() {
#if !defined(Py_LIMITED_API) && PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
  const Frame *f = tls_frame;
  if (f != nullptr && f->ts != nullptr && _PyThreadState_UncheckedGet() == f->ts) return true;
#endif
  return PyGILState_Check() != 0;
}

// A tensor the fast path takes as it is: strided memory of its own (not a ZeroTensor or a functorch
// wrapper) on the CPU or a CUDA device, no lazy conjugate or negation, a dtype operators take.
bool Plain(const at::Tensor &t) {
  return t.defined() && (t.device().is_cpu() || t.device().is_cuda()) && t.layout() == c10::kStrided &&
         t.has_storage() && !t._is_zerotensor() && !t.is_conj() && !t.is_neg() && DataTypeOf(t.scalar_type()) >= 0;
}

// torch's error text without the C++ backtrace c10::Error::what() appends.
void SetError(PyObject *type, const std::exception &e) {
  const auto *c10e = dynamic_cast<const c10::Error *>(&e);
  PyErr_SetString(type, c10e != nullptr ? c10e->what_without_backtrace() : e.what());
}

c10::Device DeviceOf(std::int32_t device) {
  return device < 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device));
}

struct Gil {
  PyGILState_STATE s = PyGILState_Ensure();
  ~Gil() { PyGILState_Release(s); }
};

// A handle (ForeignTensor::handle) is one of two references, told apart by its low bit: a reference to
// the tensor's TensorImpl, as an at::Tensor holds one (without an at::Tensor on the heap to allocate and
// free), or, bit set, a reference to the tensor's Python object (an argument unpacked from Python). A
// second C++ reference to a TensorImpl that has a Python object costs torch an incref of that object
// under a GIL guard, and a decref likewise when it goes (~500 instructions per argument); a Python
// reference costs a few. Both keep the same tensor, and so its memory, alive.
using ImplPtr = c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
constexpr std::uintptr_t kPyHandle = 1;
void *HandleOf(const at::Tensor &t) { return ImplPtr(t.getIntrusivePtr()).release(); }
void *PyHandleOf(PyObject *o) {
  Py_INCREF(o);
  return reinterpret_cast<void *>(reinterpret_cast<std::uintptr_t>(o) | kPyHandle);
}
bool IsPyHandle(void *handle) { return (reinterpret_cast<std::uintptr_t>(handle) & kPyHandle) != 0; }
PyObject *PyOf(void *handle) { return reinterpret_cast<PyObject *>(reinterpret_cast<std::uintptr_t>(handle) & ~kPyHandle); }
at::Tensor TensorOf(void *handle) {
  if (IsPyHandle(handle)) return THPVariable_Unpack(PyOf(handle));
  return at::Tensor(ImplPtr::reclaim_copy(static_cast<c10::TensorImpl *>(handle)));
}

// `t`'s memory, shape, strides, dtype and device into `out`; its handle null (the caller's to set).
void Fields(const at::Tensor &t, ForeignTensor *out) {
  out->data = t.data_ptr();
  out->shape = t.sizes().data();
  out->strides = t.is_contiguous() ? nullptr : t.strides().data();
  out->ndim = static_cast<std::int32_t>(t.dim());
  out->dtype = DataTypeOf(t.scalar_type());
  out->requires_grad = t.requires_grad() ? 1 : 0;
  out->handle = nullptr;
  out->device = t.is_cuda() ? t.get_device() : -1;
}

void Describe(const at::Tensor &t, ForeignTensor *out) {
  Fields(t, out);
  out->handle = HandleOf(t);
}

int Unpack(PyObject *o, ForeignTensor *out) {
  if (!THPVariable_CheckExact(o)) return 0;
  const at::Tensor &t = THPVariable_Unpack(o);
  if (!Plain(t)) return 0;
  Fields(t, out);
  out->handle = PyHandleOf(o);  // `o` keeps its tensor
  return 1;
}

int Peek(PyObject *o, ForeignTensor *out) {
  if (!THPVariable_CheckExact(o)) return 0;
  try {
    const at::Tensor &t = THPVariable_Unpack(o);
    if (!Plain(t) || !t.device().is_cpu()) return 0;
    Fields(t, out);  // no handle: `o` keeps the memory
    return 1;
  } catch (const std::exception &) {  // the Python path says what is wrong
    return 0;
  }
}

void Release(void *handle) {
  if (!IsPyHandle(handle)) {
    ImplPtr dropped = ImplPtr::reclaim(static_cast<c10::TensorImpl *>(handle));
    return;
  }
  if (!Py_IsInitialized()) return;  // at exit: the interpreter is gone, and its objects with it
  if (HoldsGil()) {
    Py_DECREF(PyOf(handle));
    return;
  }
  Gil gil;  // a runtime Tensor freed on a thread without the GIL (torch's autograd workers)
  Py_DECREF(PyOf(handle));
}

void Kept(void *) {}  // the context deleter while the tensor is made: a failure leaves `keep` to the caller

// A torch tensor over `t`'s memory; `drop(keep)` runs when torch frees it. `drop` is torch's context
// deleter itself (no std::function to allocate and call), set once the tensor exists, so a failure
// leaves `keep` to the caller. A C-contiguous tensor gets torch's own strides (no vector). Host memory
// skips for_blob's option handling (a third of the tensor's cost); device memory takes for_blob.
at::Tensor FromForeign(const ForeignTensor &t, void *keep, void (*drop)(void *)) {
  c10::IntArrayRef sizes(t.shape, static_cast<std::size_t>(t.ndim));
  if (t.device < 0) {  // host memory: its storage and TensorImpl made as for_blob makes them, minus its options
    const caffe2::TypeMeta meta = caffe2::TypeMeta::fromScalarType(kTypes[t.dtype]);
    const std::size_t nbytes =
        t.strides == nullptr
            ? at::detail::computeStorageNbytesContiguous(sizes, meta.itemsize())
            : at::detail::computeStorageNbytes(sizes, c10::IntArrayRef(t.strides, sizes.size()), meta.itemsize());
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(t.data, keep, &Kept, c10::kCPU),
                         nullptr, false);
    at::Tensor made =
        at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), meta);
    if (t.strides == nullptr) {
      made.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
    } else {
      made.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, c10::IntArrayRef(t.strides, sizes.size()));
    }
    if (!made.storage().mutable_data_ptr().compare_exchange_deleter(&Kept, drop)) {
      throw std::logic_error("opbuilder's torch bridge: torch replaced the deleter of a tensor it was making");
    }
    return made;
  }
  auto maker = at::for_blob(t.data, sizes);
  if (t.strides != nullptr) maker.strides(c10::IntArrayRef(t.strides, static_cast<std::size_t>(t.ndim)));
  at::Tensor made = maker.context(keep, &Kept)
                        .options(at::TensorOptions().dtype(kTypes[t.dtype]).device(DeviceOf(t.device)))
                        .make_tensor();
  if (!made.storage().mutable_data_ptr().compare_exchange_deleter(&Kept, drop)) {
    throw std::logic_error("opbuilder's torch bridge: torch replaced the deleter of a tensor it was making");
  }
  return made;
}

PyObject *Wrap(const ForeignTensor *t, void *keep, void (*drop)(void *)) {
  try {
    return THPVariable_Wrap(FromForeign(*t, keep, drop));
  } catch (const std::exception &e) {
    SetError(PyExc_RuntimeError, e);
    return nullptr;
  }
}

int GradEnabled() { return at::GradMode::is_enabled() ? 1 : 0; }

int SetGradEnabled(int on) {
  const bool prev = at::GradMode::is_enabled();
  at::GradMode::set_enabled(on != 0);
  return prev ? 1 : 0;
}

void BumpVersion(void *handle) { torch::autograd::impl::bump_version(TensorOf(handle)); }

PyObject *ObjectOf(void *handle) {
  if (IsPyHandle(handle)) {
    Py_INCREF(PyOf(handle));
    return PyOf(handle);
  }
  return THPVariable_Wrap(TensorOf(handle));
}

PyObject *Alias(void *handle) {
  try {
    const at::Tensor t = TensorOf(handle);
    at::AutoGradMode off(false);  // a plain view; the node becomes its history
    return THPVariable_Wrap(t.view_as(t));
  } catch (const std::exception &e) {
    SetError(PyExc_RuntimeError, e);
    return nullptr;
  }
}

PyObject *View(PyObject *base, const ForeignTensor *like) {
  try {
    const at::Tensor &t = THPVariable_Unpack(base);
    const std::int64_t item = static_cast<std::int64_t>(t.element_size());
    const std::int64_t off = static_cast<const char *>(like->data) - static_cast<const char *>(t.data_ptr());
    std::vector<std::int64_t> strides(like->ndim);
    if (like->strides != nullptr) {
      strides.assign(like->strides, like->strides + like->ndim);
    } else {  // C-contiguous
      std::int64_t s = 1;
      for (std::int32_t d = like->ndim; d-- > 0;) {
        strides[d] = s;
        s *= like->shape[d];
      }
    }
    const std::int64_t offset = item != 0 && off % item == 0 ? t.storage_offset() + off / item : -1;
    bool torch_has_it = offset >= 0;  // torch has no negative strides, nor views off its element grid
    for (std::int64_t s : strides) torch_has_it = torch_has_it && s >= 0;
    if (!torch_has_it) return nullptr;  // (no error: the caller makes a tensor of its own)
    // a base that records no history gets a view made in the caller's grad mode (as torch's own x[:2]: a
    // later write into it with grad on is allowed); else a plain view, whose history the node becomes
    std::optional<at::AutoGradMode> off_grad;
    if (t.requires_grad()) off_grad.emplace(false);
    return THPVariable_Wrap(t.as_strided(at::IntArrayRef(like->shape, like->ndim), strides, offset));
  } catch (const c10::Error &) {  // outside the base's storage: no view of it
    return nullptr;
  } catch (const std::exception &e) {
    SetError(PyExc_RuntimeError, e);
    return nullptr;
  }
}

void *Watch(PyObject *o) {
  try {
    return new c10::VariableVersion(THPVariable_Unpack(o).unsafeGetTensorImpl()->version_counter());
  } catch (const std::exception &e) {
    SetError(PyExc_RuntimeError, e);
    return nullptr;
  }
}

std::int64_t Watched(void *w) { return static_cast<c10::VariableVersion *>(w)->current_version(); }

void Unwatch(void *w) { delete static_cast<c10::VariableVersion *>(w); }

// ---- saved tensors through torch's saved_tensors_hooks: torch's own SavedVariable ----------------
int HooksActive() { return at::SavedTensorDefaultHooks::get_tls_state().stack.empty() ? 0 : 1; }

void *Pack(PyObject *o) {
  try {
    // detached: the pack hook sees the saved memory, and what it keeps holds no graph (no cycle
    // through this node); torch checks no versions of what hooks pack, so neither does the operator
    return new torch::autograd::SavedVariable(THPVariable_Unpack(o).detach(), false);
  } catch (python_error &e) {
    e.restore();
    return nullptr;
  } catch (const std::exception &e) {
    SetError(PyExc_RuntimeError, e);
    return nullptr;
  }
}

int UnpackSaved(void *packed, ForeignTensor *out) {
  try {
    at::Tensor t = static_cast<torch::autograd::SavedVariable *>(packed)->unpack();
    if (t.defined() && !Plain(t)) t = t.resolve_conj().resolve_neg().contiguous();
    if (!Plain(t)) {
      PyErr_Format(PyExc_TypeError,
                   "a saved_tensors_hooks unpack hook returned a tensor that opbuilder's operators do not take "
                   "(%s on %s); return a strided CPU or CUDA tensor of the saved tensor's dtype",
                   t.defined() ? c10::toString(t.scalar_type()) : "undefined",
                   t.defined() ? t.device().str().c_str() : "-");
      return -1;
    }
    Describe(t, out);
    return 0;
  } catch (python_error &e) {
    e.restore();
    return -1;
  } catch (const std::exception &e) {
    SetError(PyExc_RuntimeError, e);
    return -1;
  }
}

void DropSaved(void *packed) {
  Gil gil;  // the hooks' Python objects go with it
  delete static_cast<torch::autograd::SavedVariable *>(packed);
}

const char *WriteRefusal(void *handle) {
  thread_local std::string why;
  try {
    torch::autograd::check_inplace(TensorOf(handle), true);
    return nullptr;
  } catch (const c10::Error &e) {
    why = e.what_without_backtrace();
    return why.c_str();
  }
}

void *Allocate(std::int64_t nbytes, std::int32_t device, int zero, void **handle) {
  *handle = nullptr;
  try {
    const auto options = at::TensorOptions().dtype(at::kByte).device(DeviceOf(device));
    at::Tensor t = zero ? at::zeros({nbytes}, options) : at::empty({nbytes}, options);
    *handle = HandleOf(t);
    return t.data_ptr();
  } catch (const std::exception &e) {
    SetError(PyExc_MemoryError, e);
    return nullptr;
  }
}

void *Stream(std::int32_t device) {
  try {
    const c10::impl::DeviceGuardImplInterface *impl = c10::impl::getDeviceGuardImpl(c10::kCUDA);
    return impl->getStream(device < 0 ? impl->getDevice() : DeviceOf(device)).native_handle();
  } catch (const std::exception &e) {
    SetError(PyExc_RuntimeError, e);
    return nullptr;
  }
}

// ---- the autograd node ------------------------------------------------------------

// The index of the incoming gradient `t` is exactly (memory, shape, strides, dtype), else grads.size().
std::size_t Incoming(const torch::autograd::variable_list &grads, const ForeignTensor &t) {
  for (std::size_t j = 0; j < grads.size(); ++j) {
    const at::Tensor &g = grads[j];
    if (!g.defined() || g.data_ptr() != t.data || g.dim() != t.ndim || DataTypeOf(g.scalar_type()) != t.dtype) continue;
    bool same = true;
    for (std::int32_t d = 0; d < t.ndim && same; ++d) same = g.size(d) == t.shape[d];
    if (same && t.strides != nullptr) {
      for (std::int32_t d = 0; d < t.ndim && same; ++d) same = g.size(d) <= 1 || g.stride(d) == t.strides[d];
    } else if (same) {
      same = g.is_contiguous();
    }
    if (same) return j;
  }
  return grads.size();
}

// torch::autograd's node pointer: std::shared_ptr<Node> up to torch 2.12, c10::intrusive_ptr<Node> after.
using NodePtr = decltype(torch::autograd::Edge::function);
template <typename P>
struct IsShared : std::false_type {};
template <typename P>
struct IsShared<std::shared_ptr<P>> : std::true_type {};

// A new node of type N (constructed from `args`) as torch holds nodes; *raw: the node itself.
template <typename N, typename... A>
NodePtr MakeNode(N **raw, A &&...args) {
  if constexpr (IsShared<NodePtr>::value) {
    auto p = std::make_shared<N>(std::forward<A>(args)...);
    *raw = p.get();
    return p;
  } else {
    auto p = c10::make_intrusive<N>(std::forward<A>(args)...);
    *raw = p.get();
    return p;
  }
}

// torch's rule for a Function whose backward records no graph (once_differentiable): with
// create_graph=True the gradients it returns get a node that raises if they are differentiated in
// turn, naming the operator, instead of "does not require grad" or silent zeros. Its edges are the
// forward node's, so a gradient of the gradient with respect to the forward's inputs reaches it.
void OnceDifferentiable(const std::string &name, const torch::autograd::edge_list &edges,
                        torch::autograd::variable_list &res) {
  bool any = false;
  for (const auto &r : res) any = any || r.defined();
  if (!any) return;
  torch::autograd::Error *raw = nullptr;
  NodePtr err = MakeNode(&raw, name + ": double backward through an opbuilder operator is not supported: its Backward "
                                      "is once-differentiable (create_graph=True, then a gradient of the gradient)",
                         torch::autograd::edge_list(edges));
  for (auto &r : res) {
    if (!r.defined()) {
      raw->add_input_metadata(torch::autograd::Node::undefined_input());
      continue;
    }
    r = r.detach();  // a tensor of its own: an incoming gradient handed back keeps its history
    const auto nr = raw->add_input_metadata(r);
    torch::autograd::impl::set_gradient_edge(r, torch::autograd::Edge(err, nr));
  }
}

struct OpNode : torch::autograd::Node {
  ForeignNode n;
  std::string label;
  std::vector<bool> attached;  // per output: differentiable (has input metadata here)

  std::string op;              // the operator called, for messages: its to_torch name (the Function's otherwise)
  // the argument each next edge is for, when not in order: a view written in place has its edge first,
  // as torch's CopySlices takes the node's first input for the view (empty: in order)
  std::vector<std::size_t> order;

  explicit OpNode(const ForeignNode &node) : n(node), label(std::string(node.name) + "Backward"), op(node.name) {}

  ~OpNode() override {
    if (n.state == nullptr || !Py_IsInitialized()) return;
    Gil gil;
    n.destroy(n.state);
  }

  std::string name() const override { return label; }

  void release_variables() override {
    Gil gil;
    n.release(n.state);
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list &&grads) override {
    Gil gil;
    std::vector<ForeignTensor> in(grads.size());
    for (std::size_t j = 0; j < grads.size(); ++j) {
      at::Tensor &g = grads[j];
      if (!g.defined() && n.materialize && j < attached.size() && attached[j]) g = input_metadata(j).zeros_like();
      if (!g.defined()) {
        in[j] = ForeignTensor{nullptr, nullptr, nullptr, -1, 0, 0, nullptr, -1};
        continue;
      }
      if (g._is_zerotensor()) g = at::zeros(g.sizes(), g.options().dtype(g.scalar_type()));
      if (!Plain(g)) g = g.resolve_conj().resolve_neg().to_dense().contiguous();
      if (!Plain(g)) {
        throw std::runtime_error(label + ": a gradient of dtype " + std::string(c10::toString(g.scalar_type())) +
                                 " on " + g.device().str() + " arrived, which opbuilder's operators do not take");
      }
      Describe(g, &in[j]);
    }
    std::vector<ForeignTensor> out(n.nargs);
    std::vector<void *> keep(n.nargs, nullptr);
    // Backward's device memory and stream are torch's, as in Forward (torch's engine set the stream)
    Frame f{CurrentFrame(), tls_frame};
    tls_frame = &f;
    const int rc = n.backward(n.state, in.data(), in.size(), out.data(), keep.data(), n.nargs);
    tls_frame = f.prev;
    if (rc != 0) {
      python_error err;
      err.persist();
      throw std::move(err);
    }
    torch::autograd::variable_list res(n.nargs);
    for (std::size_t i = 0; i < n.nargs; ++i) {
      if (out[i].ndim < 0) continue;
      // an incoming gradient handed back as it is: torch's own tensor, so AccumulateGrad sees that it
      // is shared (a new TensorImpl over its memory would be taken as .grad, aliasing it)
      const std::size_t j = Incoming(grads, out[i]);
      if (j < grads.size()) {
        res[i] = grads[j];
        n.drop(keep[i]);
        continue;
      }
      res[i] = FromForeign(out[i], keep[i], n.drop);
    }
    if (!order.empty()) {
      torch::autograd::variable_list by_edge(res.size());
      for (std::size_t e = 0; e < order.size(); ++e) by_edge[e] = std::move(res[order[e]]);
      res = std::move(by_edge);
    }
    if (at::GradMode::is_enabled()) OnceDifferentiable(op, next_edges(), res);  // create_graph=True
    return res;
  }
};


// torch's marks on a custom Function's outputs that are views (custom_function.cpp): one not written
// in place was made inside the Function (IN_CUSTOM_FUNCTION), and with more than one differentiable
// output each view is one of several (MULTI_OUTPUT_NODE). torch's own in-place check then refuses a
// write into such an output, or a use of it after its base was written, in its custom-Function words.
void MarkViewOutputs(const ForeignNode *node) {
  std::size_t differentiable = 0;
  for (std::size_t j = 0; j < node->nout; ++j) {
    if (node->outputs[j] == nullptr) continue;
    ++differentiable;
    const at::Tensor &o = THPVariable_Unpack(node->outputs[j]);
    if (node->dirty[j] || !o.is_view()) continue;
    torch::autograd::impl::get_view_autograd_meta(o)->set_creation_meta(torch::autograd::CreationMeta::IN_CUSTOM_FUNCTION);
  }
  if (differentiable < 2) return;
  for (std::size_t j = 0; j < node->nout; ++j) {
    if (node->outputs[j] == nullptr) continue;
    auto *view = torch::autograd::impl::get_view_autograd_meta(THPVariable_Unpack(node->outputs[j]));
    if (view != nullptr && view->has_bw_view()) view->set_creation_meta(torch::autograd::CreationMeta::MULTI_OUTPUT_NODE);
  }
}

// The base whose version counter `t` shares, as torch's views do (the tensor itself if it is no view).
const c10::TensorImpl *CounterBase(const at::Tensor &t) {
  auto *view = torch::autograd::impl::get_view_autograd_meta(t);
  return view != nullptr && view->has_bw_view() ? view->get_backward_view().base_.unsafeGetTensorImpl()
                                                 : t.unsafeGetTensorImpl();
}

// An argument that is a view of memory the node wrote through another tensor (two view objects of one
// base, a view beside its base): taking its edge above rebuilt its grad_fn from the base's history
// before the write (the write had moved the version) and marked it current. torch rebuilds it after,
// from the write's node: do so now.
void RefreshViewsOfWritten(const ForeignNode *node) {
  std::vector<const c10::TensorImpl *> written, outs;  // their bases; the written tensors (rebased already)
  for (std::size_t j = 0; j < node->nout; ++j) {
    if (node->outputs[j] == nullptr || !node->dirty[j]) continue;
    const at::Tensor &o = THPVariable_Unpack(node->outputs[j]);
    written.push_back(CounterBase(o));
    outs.push_back(o.unsafeGetTensorImpl());
  }
  if (written.empty()) return;
  for (std::size_t i = 0; i < node->nargs; ++i) {
    if (node->inputs[i] == nullptr) continue;
    const at::Tensor &t = TensorOf(node->inputs[i]);
    if (std::find(outs.begin(), outs.end(), t.unsafeGetTensorImpl()) != outs.end()) continue;
    auto *view = torch::autograd::impl::get_view_autograd_meta(t);
    if (view == nullptr || !view->has_bw_view() || !view->get_backward_view().base_.requires_grad()) continue;
    if (std::find(written.begin(), written.end(), CounterBase(t)) == written.end()) continue;
    view->set_attr_version(static_cast<std::uint32_t>(t._version()) + 1);
    (void)t.grad_fn();  // rebuilt from the base's grad_fn now, and current again
  }
}

int Record(const ForeignNode *node) {
  NodePtr fn;
  OpNode *raw = nullptr;
  try {
    fn = MakeNode(&raw, *node);
    if (tls_frame != nullptr && tls_frame->op != nullptr) {  // the to_torch function, as its Python path names it
      if (const char *name = PyUnicode_AsUTF8(tls_frame->op)) {
        raw->op = name;
      } else {
        PyErr_Clear();
      }
    }
  } catch (const std::exception &e) {
    node->destroy(node->state);
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return -1;
  }
  try {
    for (std::size_t j = 0; j < node->nout; ++j) {  // torch's rules for in-place changes (leaves, views)
      if (node->outputs[j] == nullptr || !node->dirty[j]) continue;
      const at::Tensor &o = THPVariable_Unpack(node->outputs[j]);
      try {
        torch::autograd::check_inplace(o, true);
      } catch (const c10::Error &e) {
        PyErr_Format(PyExc_RuntimeError, "%s: %s", node->name, e.what_without_backtrace());
        return -1;
      }
      if (o.is_view() && node->nout > 1) {  // torch's rule for a custom Function (its history is rebased)
        PyErr_Format(PyExc_RuntimeError,
                     "%s: If your Function modifies inplace an input that is a view of another Tensor, your Function "
                     "cannot return more than one Tensor. This is not supported by the current autograd engine. You "
                     "should either make sure the input is not a view (using .clone() for example) or make your "
                     "Function only return one Tensor",
                     node->name);
        return -1;
      }
    }
    torch::autograd::edge_list edges(node->nargs);
    for (std::size_t i = 0; i < node->nargs; ++i) {
      if (node->inputs[i] != nullptr) {
        edges[i] = torch::autograd::impl::gradient_edge(TensorOf(node->inputs[i]));
      }
    }
    for (std::size_t j = 0; j < node->nout; ++j) {
      // a view written in place: torch's CopySlices calls the node for the view's gradient and takes its
      // first one as the view's, its first edge as the base's; an argument after the first goes first
      if (node->outputs[j] == nullptr || node->dirty[j] <= 1) continue;
      const auto k = static_cast<std::size_t>(node->dirty[j] - 1);
      auto *view = torch::autograd::impl::get_view_autograd_meta(THPVariable_Unpack(node->outputs[j]));
      if (view == nullptr || !view->has_bw_view() || k >= node->nargs) continue;
      raw->order.push_back(k);
      for (std::size_t i = 0; i < node->nargs; ++i) {
        if (i != k) raw->order.push_back(i);
      }
      torch::autograd::edge_list by_edge(node->nargs);
      for (std::size_t e = 0; e < node->nargs; ++e) by_edge[e] = std::move(edges[raw->order[e]]);
      edges = std::move(by_edge);
      break;  // (a node writing a view returns nothing else: checked above)
    }
    fn->set_next_edges(std::move(edges));
    raw->attached.assign(node->nout, false);
    for (std::size_t j = 0; j < node->nout; ++j) {
      if (node->outputs[j] == nullptr) {
        fn->add_input_metadata(torch::autograd::Node::undefined_input());
        continue;
      }
      const at::Tensor &o = THPVariable_Unpack(node->outputs[j]);
      const auto nr = fn->add_input_metadata(o);
      raw->attached[j] = true;
      if (node->dirty[j]) {
        // a view written in place: torch rebases its base's history (CopySlices) and then rebuilds the
        // view's grad_fn from it, which it does once the view's version moved since the grad_fn was
        // made. The edges above made it after the write's version bump, so mark it stale again.
        if (auto *view = torch::autograd::impl::get_view_autograd_meta(o); view != nullptr && view->has_bw_view()) {
          view->set_attr_version(static_cast<std::uint32_t>(o._version()) + 1);
        }
        torch::autograd::impl::rebase_history(o, torch::autograd::Edge(fn, nr));
      } else {
        torch::autograd::impl::set_gradient_edge(o, torch::autograd::Edge(fn, nr));
      }
    }
    RefreshViewsOfWritten(node);
    MarkViewOutputs(node);
    return 0;
  } catch (python_error &e) {
    e.restore();
    return -1;
  } catch (const std::exception &e) {
    SetError(PyExc_RuntimeError, e);
    return -1;
  }
}

const ForeignApi kApi = {opbuilder::detail::kForeignAbi,
                         &Active,
                         &Unpack,
                         &Release,
                         &Wrap,
                         &GradEnabled,
                         &SetGradEnabled,
                         &BumpVersion,
                         &ObjectOf,
                         &Record,
                         &Allocate,
                         &Stream,
                         &Alias,
                         &Watch,
                         &Watched,
                         &Unwatch,
                         &HooksActive,
                         &Pack,
                         &UnpackSaved,
                         &DropSaved,
                         &WriteRefusal,
                         &Peek,
                         &View};

// ---- Op: the namespace's callable ------------------------------------------------------
struct OpObject {
  PyObject_HEAD
  PyObject *fn;
  PyObject *fallback;
  PyObject *defined;  // a dict whose keys are the call signatures the Python path has checked (_Op.checked)
  PyObject *name;     // fn.__name__ (a str), or null
  int cuda;           // CUDA tensors may take the fast path (a GPU operator)
  vectorcallfunc vectorcall;
  Py_ssize_t fast_calls;  // calls the fast path took (tests check that it is taken)
  char last[16];          // the signature last found in `defined`
  // with a shape rule: the exact argument keys (shapes, dtypes, scalar values) whose outputs the Python
  // path has compared with the rule; any other call goes there first (a wrong rule is a named error there)
  std::unordered_set<std::string> *checked;
  PyObject *dict;  // attributes the namespace's function had (__name__, __doc__, torch_op, bridged)
};

// The call's key for the shape rule: each tensor's dtype and shape, each scalar's exact value (the
// signature gives the kinds), or false for an int too wide for 64 bits (that call is never cached).
bool RuleKey(PyObject *const *args, Py_ssize_t n, const char *sig, std::string *key) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *a = args[i];
    switch (sig[i]) {
      case 't': {
        const at::Tensor &t = THPVariable_Unpack(a);
        const std::int64_t head[2] = {static_cast<std::int64_t>(t.scalar_type()), t.dim()};
        key->append(reinterpret_cast<const char *>(head), sizeof(head));
        const auto sizes = t.sizes();
        key->append(reinterpret_cast<const char *>(sizes.data()), sizes.size() * sizeof(std::int64_t));
        break;
      }
      case 'b':
        key->push_back(a == Py_True ? '1' : '0');
        break;
      case 'i': {
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
        if (overflow != 0) return false;
        key->append(reinterpret_cast<const char *>(&v), sizeof(v));
        break;
      }
      case 'f': {
        const double v = PyFloat_AS_DOUBLE(a);  // by its bits: 0.0 and -0.0 may get different answers
        key->append(reinterpret_cast<const char *>(&v), sizeof(v));
        break;
      }
      default: {  // 's'
        Py_ssize_t len = 0;
        const char *text = PyUnicode_AsUTF8AndSize(a, &len);
        if (text == nullptr) {
          PyErr_Clear();
          return false;
        }
        const std::int64_t size = len;
        key->append(reinterpret_cast<const char *>(&size), sizeof(size));
        key->append(text, static_cast<std::size_t>(len));
      }
    }
  }
  return true;
}

// The call's signature as to_torch's Python path spells it (one letter per argument) into `sig`,
// or false when the fast path does not take it: plain CPU torch tensors, Python numbers and strings.
bool FastArgs(PyObject *const *args, Py_ssize_t n, char *sig, Py_ssize_t cap, bool cuda) {
  if (n >= cap) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *a = args[i];
    if (THPVariable_CheckExact(a)) {
      const at::Tensor &t = THPVariable_Unpack(a);
      if (!Plain(t) || (t.is_cuda() && !cuda)) return false;  // another device: the Python path says why
      if (t._fw_grad(0).defined()) return false;                // forward-mode AD: the Python path says no
      if (t.is_inference()) return false;                       // torch's own rules, on the Python path
      sig[i] = 't';
    } else if (PyBool_Check(a)) {
      sig[i] = 'b';
    } else if (PyLong_CheckExact(a)) {
      sig[i] = 'i';
    } else if (PyFloat_CheckExact(a)) {
      sig[i] = 'f';
    } else if (PyUnicode_CheckExact(a)) {
      sig[i] = 's';
    } else {
      return false;
    }
  }
  sig[n] = '\0';
  return true;
}

// The Python path has checked this signature: its calls write no argument unseen (to_torch's _Op.checked;
// a signature watched for such writes, or with declared writes, is never a key).
bool Defined(OpObject *op, const char *sig) {
  if (std::strcmp(sig, op->last) == 0) return true;
  PyObject *key = PyUnicode_FromString(sig);
  if (key == nullptr) {
    PyErr_Clear();
    return false;
  }
  const int has = PyDict_Contains(op->defined, key);
  Py_DECREF(key);
  if (has != 1) {
    PyErr_Clear();
    return false;
  }
  std::strcpy(op->last, sig);
  return true;
}

PyObject *OpCall(PyObject *self, PyObject *const *args, std::size_t nargsf, PyObject *kwnames) {
  auto *op = reinterpret_cast<OpObject *>(self);
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  char sig[sizeof(op->last)];
  bool fast = kwnames == nullptr || PyTuple_GET_SIZE(kwnames) == 0;
  try {
    // saved-tensor hooks (save_on_cpu, ...) are honoured here: what Function<T> saves goes through them (Pack)
    fast = fast && !at::impl::torch_function_mode_enabled() && !c10::impl::TorchDispatchModeTLS::any_modes_set() &&
           FastArgs(args, n, sig, sizeof(sig), op->cuda != 0) && Defined(op, sig);
  } catch (python_error &e) {
    e.restore();
    return nullptr;
  }
  if (!fast) return PyObject_Vectorcall(op->fallback, args, nargsf, kwnames);
  if (op->checked != nullptr) {  // a shape rule: this exact key checked once by the Python path
    static thread_local std::string key;  // reused: a call whose key is known allocates nothing
    key.clear();
    if (!RuleKey(args, n, sig, &key)) return PyObject_Vectorcall(op->fallback, args, nargsf, kwnames);
    if (op->checked->count(key) == 0) {
      std::string seen = key;  // the fallback may call this thread's bridge again, reusing `key`
      PyObject *r = PyObject_Vectorcall(op->fallback, args, nargsf, kwnames);
      if (r != nullptr) {
        if (op->checked->size() >= 4096) op->checked->clear();  // many shapes (dynamic): keep the newest
        op->checked->insert(std::move(seen));
      }
      return r;
    }
  }
  ++op->fast_calls;
  Frame f{CurrentFrame(), tls_frame, op->name, PyThreadState_GET()};
  tls_frame = &f;
  PyObject *r = PyObject_Vectorcall(op->fn, args, n, nullptr);
  tls_frame = f.prev;
  if (r != nullptr && PyList_CheckExact(r)) {  // several outputs: a tuple, torch's convention (as the Python path)
    PyObject *t = PyList_AsTuple(r);
    Py_DECREF(r);
    return t;
  }
  return r;
}

PyObject *OpNew(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  PyObject *fn = nullptr, *fallback = nullptr, *defined = nullptr;
  int cuda = 0, rule = 0;
  static const char *names[] = {"fn", "fallback", "defined", "cuda", "rule", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!|pp:Op", const_cast<char **>(names), &fn, &fallback,
                                   &PyDict_Type, &defined, &cuda, &rule)) {
    return nullptr;
  }
  auto *self = reinterpret_cast<OpObject *>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  Py_INCREF(fn);
  Py_INCREF(fallback);
  Py_INCREF(defined);
  self->fn = fn;
  self->fallback = fallback;
  self->defined = defined;
  self->cuda = cuda;
  self->name = PyObject_GetAttrString(fn, "__name__");
  if (self->name != nullptr && !PyUnicode_Check(self->name)) Py_CLEAR(self->name);
  if (self->name == nullptr) PyErr_Clear();
  self->fast_calls = 0;
  self->last[0] = '\x01';  // no signature
  self->checked = rule ? new std::unordered_set<std::string>() : nullptr;
  self->dict = nullptr;
  self->vectorcall = &OpCall;
  return reinterpret_cast<PyObject *>(self);
}

int OpTraverse(PyObject *o, visitproc visit, void *arg) {
  auto *self = reinterpret_cast<OpObject *>(o);
  Py_VISIT(self->fn);
  Py_VISIT(self->fallback);
  Py_VISIT(self->defined);
  Py_VISIT(self->name);
  Py_VISIT(self->dict);
  return 0;
}

int OpClear(PyObject *o) {
  auto *self = reinterpret_cast<OpObject *>(o);
  Py_CLEAR(self->fn);
  Py_CLEAR(self->fallback);
  Py_CLEAR(self->defined);
  Py_CLEAR(self->name);
  Py_CLEAR(self->dict);
  return 0;
}

void OpDealloc(PyObject *o) {
  PyObject_GC_UnTrack(o);
  OpClear(o);
  delete reinterpret_cast<OpObject *>(o)->checked;
  Py_TYPE(o)->tp_free(o);
}

PyObject *OpRepr(PyObject *o) {
  return PyUnicode_FromFormat("<opbuilder torch operator %R>", reinterpret_cast<OpObject *>(o)->fn);
}

PyMemberDef kOpMembers[] = {
    {"fn", T_OBJECT, offsetof(OpObject, fn), READONLY, "the operator the fast path calls"},
    {"fallback", T_OBJECT, offsetof(OpObject, fallback), READONLY, "what every other call goes to"},
    {"fast_calls", T_PYSSIZET, offsetof(OpObject, fast_calls), READONLY, "calls the fast path took"},
    {"defined", T_OBJECT, offsetof(OpObject, defined), READONLY, "the signatures the fallback has checked"},
    {nullptr, 0, 0, 0, nullptr}};

// copy.copy and copy.deepcopy give the Op itself, as they give the function it replaces: it holds no
// state of a model's (a deepcopy of a model holding the namespace's function works as before).
PyObject *OpSelf(PyObject *self, PyObject *) {
  Py_INCREF(self);
  return self;
}

PyMethodDef kOpMethods[] = {{"__copy__", &OpSelf, METH_NOARGS, "the Op itself"},
                            {"__deepcopy__", &OpSelf, METH_O, "the Op itself"},
                            {nullptr, nullptr, 0, nullptr}};

PyGetSetDef kOpGetSet[] = {{"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
                           {nullptr, nullptr, nullptr, nullptr, nullptr}};

// The fields after the header are set in PyInit (CPython's own idiom for a static type); the
// header macro leaves them zero, as -Wmissing-field-initializers would otherwise point out.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
PyTypeObject OpType = {PyVarObject_HEAD_INIT(nullptr, 0)};
#pragma GCC diagnostic pop

// `traced_call(fn)`: fn becomes Op's `__call__` as Python sees it in the type's dict, while calls keep
// the C call (OpCall: the type's slots stay). torch.compile's dynamo cannot trace a C call; it traces
// the `__call__` it finds in the type instead (to_torch's Python path), so an Op can be the
// namespace's function itself: an eager call then runs no Python before the operator.
PyObject *TracedCall(PyObject *, PyObject *fn) {
  if (!PyFunction_Check(fn)) {
    PyErr_SetString(PyExc_TypeError, "traced_call: expected a Python function");
    return nullptr;
  }
  if (PyDict_SetItemString(OpType.tp_dict, "__call__", fn) < 0) return nullptr;
  PyType_Modified(&OpType);
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"traced_call", &TracedCall, METH_O, "traced_call(fn): Op.__call__ as torch.compile traces it (calls stay C)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_opbuilder_torch_bridge",
                       "opbuilder's C++ bridge to PyTorch (src/torch_bridge.cpp)", -1, kMethods,
                       nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__opbuilder_torch_bridge() {
  OpType.tp_name = "_opbuilder_torch_bridge.Op";
  OpType.tp_basicsize = sizeof(OpObject);
  OpType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  OpType.tp_vectorcall_offset = offsetof(OpObject, vectorcall);
  OpType.tp_call = PyVectorcall_Call;
  OpType.tp_new = OpNew;
  OpType.tp_dealloc = OpDealloc;
  OpType.tp_traverse = OpTraverse;
  OpType.tp_clear = OpClear;
  OpType.tp_repr = OpRepr;
  OpType.tp_members = kOpMembers;
  OpType.tp_dictoffset = offsetof(OpObject, dict);
  OpType.tp_getset = kOpGetSet;
  OpType.tp_methods = kOpMethods;
  OpType.tp_doc = "Op(fn, fallback, defined, cuda=False, rule=False): fn for plain torch tensors (CPU; CUDA too "
                  "if cuda) in a signature `defined` has, fallback for every other call; with rule (a shape rule), "
                  "fallback also for each new shape, dtype and scalar value, which it checks";
  if (PyType_Ready(&OpType) < 0) return nullptr;
  PyObject *m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  Py_INCREF(&OpType);
  if (PyModule_AddObject(m, "Op", reinterpret_cast<PyObject *>(&OpType)) < 0) {
    Py_DECREF(&OpType);
    Py_DECREF(m);
    return nullptr;
  }
  // publish the table in the runtime's slot
  PyObject *native = PyImport_ImportModule("runtime._native");
  PyObject *addr = native != nullptr ? PyObject_CallMethod(native, "bridge_slot_address", nullptr) : nullptr;
  Py_XDECREF(native);
  if (addr == nullptr) {
    Py_DECREF(m);
    return nullptr;
  }
  void *slot = PyLong_AsVoidPtr(addr);
  Py_DECREF(addr);
  if (PyErr_Occurred()) {
    Py_DECREF(m);
    return nullptr;
  }
  *static_cast<const ForeignApi **>(slot) = &kApi;
  return m;
}
