// The XLA FFI handlers of any Function, through its FfiEntry (detail/ffi_entry.h): XLA's buffers as
// Tensors, the scratch copies, the forward and backward handlers. One copy is compiled once per JAX
// version into to_jax's generic handlers (src/jax_ffi.cpp), which every Function reaches with no change
// of its source; xla_ffi.h's OB_XLA_FFI compiles it into a module instead. What they do, and the rules
// they keep, is said at the top of xla_ffi.h. Not for operator authors.
#pragma once

#include <Python.h>

#include <array>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "opbuilder/autograd.h"
#include "opbuilder/detail/ffi_entry.h"  // OB_XLA_FFI's handlers run a Function through its FfiEntry
#include "xla/ffi/api/ffi.h"

namespace opbuilder {
namespace detail OB_HIDDEN {
namespace xla_ffi {

namespace ffi = ::xla::ffi;

// XLA's element type as opbuilder's (kTypeUnknown for one opbuilder has no tensor of).
inline DataType FromXla(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return kBool;
    case ffi::DataType::S8: return kInt8;
    case ffi::DataType::S16: return kInt16;
    case ffi::DataType::S32: return kInt32;
    case ffi::DataType::S64: return kInt64;
    case ffi::DataType::U8: return kUInt8;
    case ffi::DataType::U16: return kUInt16;
    case ffi::DataType::U32: return kUInt32;
    case ffi::DataType::U64: return kUInt64;
    case ffi::DataType::F16: return kFloat16;
    case ffi::DataType::F32: return kFloat32;
    case ffi::DataType::F64: return kFloat64;
    case ffi::DataType::BF16: return kBFloat16;
    case ffi::DataType::C64: return kComplex64;
    case ffi::DataType::C128: return kComplex128;
    default: return kTypeUnknown;
  }
}

// In a shape buffer the core kept from a Tensor this thread dropped (TakeShape), when there is one.
inline ShapeVector ShapeOf(ffi::Span<const std::int64_t> dims) {
  ShapeVector shape = TakeShape();
  shape.assign(dims.begin(), dims.end());
  return shape;
}

// An XLA buffer as a contiguous Tensor over its memory (XLA owns the memory and outlives the call).
inline TensorPtr Wrap(const ffi::AnyBuffer &b, bool writable, const char *what, std::size_t k) {
  const DataType dt = FromXla(b.element_type());
  if (dt == kTypeUnknown) {
    throw detail::TypeError(std::string(what) + " " + std::to_string(k) + " has an XLA element type opbuilder has no "
                            "tensor of (code " + std::to_string(static_cast<int>(b.element_type())) + ")");
  }
  return NewTensor(dt, ShapeOf(b.dimensions()), ShapeVector{}, b.untyped_data(), std::shared_ptr<void>(), writable);
}

// A block of at least `n` bytes this thread reuses from call to call: a fresh block each call faults in
// its pages every time (measured: 1M float64 mul 4.4 ms -> 2.2 ms, against 1.0 ms with no copy). A block
// is reused once nothing holds it (a handler's tensors die with the call); at most kScratchBlocks of up
// to kScratchBytes are kept per thread, and a larger one is a fresh allocation.
inline std::shared_ptr<void> ScratchBlock(std::size_t n) {
  constexpr std::size_t kScratchBlocks = 8;
  constexpr std::size_t kScratchBytes = std::size_t{64} << 20;
  if (n > kScratchBytes) return AllocateStorage(n);
  struct Block {
    std::shared_ptr<void> data;
    std::size_t nbytes;
  };
  thread_local std::vector<Block> blocks;
  Block *use = nullptr;
  for (auto &b : blocks) {
    if (b.data.use_count() == 1 && b.nbytes >= n && (use == nullptr || b.nbytes < use->nbytes)) use = &b;
  }
  if (use != nullptr) return use->data;
  if (blocks.size() >= kScratchBlocks) {  // drop the smallest free block, if any
    auto drop = blocks.end();
    for (auto it = blocks.begin(); it != blocks.end(); ++it) {
      if (it->data.use_count() == 1 && (drop == blocks.end() || it->nbytes < drop->nbytes)) drop = it;
    }
    if (drop != blocks.end()) blocks.erase(drop);
  }
  std::shared_ptr<void> data = AllocateStorage(n == 0 ? 1 : n);
  if (blocks.size() < kScratchBlocks) blocks.push_back(Block{data, n});
  return data;
}

// A private copy of `src` (contiguous) in a scratch block; with `writable` false it is marked read-only
// (it stands for XLA's read-only buffer).
inline TensorPtr ScratchCopy(const Tensor &src, bool writable = true) {
  const std::size_t n = src.nbytes();
  std::shared_ptr<void> data = ScratchBlock(n);
  ShapeVector shape = TakeShape();
  shape = src.shape();
  auto t = NewTensor(src.dtype(), std::move(shape), ShapeVector{}, data.get(), data, writable);
  if (n != 0) std::memcpy(t->data_ptr(), TensorAccess::Read(src), n);
  return t;
}

// How Forward (or Backward) gets XLA's buffer: a private writable copy (Forward's inputs, unless a
// kAcceptsViews type is known to write nothing), a read-only Tensor over XLA's memory (kAcceptsViews, a
// type known to write nothing), a private copy marked read-only (the cotangents Backward takes as
// views, while it may write them: the write lands in the copy), or XLA's memory lent to a bound
// function (tensor_details.h LentScope: its body's first access makes it a private copy).
enum class InputMode { kCopy, kView, kReadOnlyCopy, kLend };

// What Forward (or Backward) gets for XLA's input buffer `b`, as `mode` says. Never XLA's memory writable.
inline TensorPtr Input(const ffi::AnyBuffer &b, InputMode mode, const char *what, std::size_t k) {
  TensorPtr t = Wrap(b, false, what, k);
  if (mode == InputMode::kView) return t;
  if (mode == InputMode::kLend) {
    TensorAccess::Lend(*t);
    return t;
  }
  return ScratchCopy(*t, mode == InputMode::kCopy);
}

// A list lent to one handler call from this thread's spares, cleared, its room kept: a 1-element
// gradient step otherwise allocates and frees about a dozen small lists (~200 instructions each in
// malloc and free). Nested calls take other spares; at most kKeep are kept per type and thread, each of
// at most kRoom elements (a call with a long list does not pin its room on the thread). A Lease lives
// on a handler's stack: none outlives the thread's spares.
template <typename V>
class Lease {
 public:
  Lease() {
    std::vector<V> &s = Spares();
    if (!s.empty()) {
      v_ = std::move(s.back());
      s.pop_back();
    }
  }
  ~Lease() {
    v_.clear();
    std::vector<V> &s = Spares();
    if (s.size() < kKeep && v_.capacity() != 0 && v_.capacity() <= kRoom) s.push_back(std::move(v_));
  }
  Lease(const Lease &) = delete;
  Lease &operator=(const Lease &) = delete;
  V &operator*() { return v_; }
  V *operator->() { return &v_; }
  const V &operator*() const { return v_; }
  const V *operator->() const { return &v_; }

 private:
  static constexpr std::size_t kKeep = 8;
  static constexpr std::size_t kRoom = 64;
  static std::vector<V> &Spares() {
    thread_local std::vector<V> spares = [] {
      std::vector<V> s;
      s.reserve(kKeep);  // (a push_back in the destructor never allocates)
      return s;
    }();
    return spares;
  }
  V v_;
};

// XLA's result buffers as Tensors, in order, into `out` (emptied first).
inline void ResultTensors(ffi::RemainingRets &rets, TensorPtrList &out) {
  out.clear();
  out.reserve(rets.size());
  for (std::size_t j = 0; j < rets.size(); ++j) {
    auto r = rets.get<ffi::AnyBuffer>(j);
    if (!r.has_value()) throw std::runtime_error("result " + std::to_string(j) + ": " + r.error().message());
    out.push_back(Wrap(**r, true, "result", j));
  }
}
inline TensorPtrList ResultTensors(ffi::RemainingRets &rets) {
  TensorPtrList out;
  ResultTensors(rets, out);
  return out;
}

// XLA's result buffers, offered to new host Tensors of their size while Forward (or Backward) runs
// (detail/tensor_details.h's OfferedBuffers, installed by the Function's own code: ffi_entry.h's
// FfiCallScope), so outputs usually land in place. 64-byte aligned buffers only, as malloc'd tensors are.
class OfferResults {
 public:
  explicit OfferResults(const TensorPtrList &dst) {
    // up to kInline buffers in the object itself: no allocation per call (a handler makes two or three)
    if (dst.size() > kInline) {
      big_data_.resize(dst.size());
      big_nbytes_.resize(dst.size());
      big_taken_.reset(new bool[dst.size()]());
    }
    void **data = dst.size() > kInline ? big_data_.data() : data_;
    std::size_t *nbytes = dst.size() > kInline ? big_nbytes_.data() : nbytes_;
    std::size_t n = 0;
    for (const auto &t : dst) {
      const auto addr = reinterpret_cast<std::uintptr_t>(t->data_ptr());
      if (t->nbytes() == 0 || addr % 64 != 0) continue;
      data[n] = t->data_ptr();
      nbytes[n++] = t->nbytes();
    }
    buffers_ = OfferedBuffers{data, nbytes, dst.size() > kInline ? big_taken_.get() : taken_, n};
  }
  OfferResults(const OfferResults &) = delete;
  OfferResults &operator=(const OfferResults &) = delete;
  const OfferedBuffers &buffers() const { return buffers_; }

 private:
  static constexpr std::size_t kInline = 8;
  void *data_[kInline] = {};
  std::size_t nbytes_[kInline] = {};
  bool taken_[kInline] = {};
  std::vector<void *> big_data_;
  std::vector<std::size_t> big_nbytes_;
  std::unique_ptr<bool[]> big_taken_;
  OfferedBuffers buffers_;
};

inline bool Within(const Tensor &t, const Tensor &buffer) {
  const char *p = static_cast<const char *>(TensorAccess::Read(t));
  const char *b = static_cast<const char *>(TensorAccess::Read(buffer));
  return p >= b && p < b + buffer.nbytes();
}

// Whether `shape` broadcasts to `target` (numpy's rule), as the runtime's engine asks of a gradient.
inline bool BroadcastsTo(const ShapeVector &shape, const ShapeVector &target) {
  if (shape.size() > target.size()) return false;
  for (std::size_t k = 1; k <= shape.size(); ++k) {
    const std::int64_t s = shape[shape.size() - k], t = target[target.size() - k];
    if (s != t && s != 1) return false;
  }
  return true;
}

// `g` (any strides) summed down to `dst`'s shape, which broadcasts to g's, into `dst` (contiguous):
// what the runtime's engine does with a gradient Backward returns in the shape its input broadcast to.
template <typename Acc, typename Elem>
void SumDown(const Tensor &g, Tensor &dst) {
  const ShapeVector gs = g.shape(), gst = g.strides(), ds = dst.shape();
  const std::size_t nd = gs.size(), lead = nd - ds.size();
  ShapeVector dstr(nd, 0);  // per g dimension: its step in dst (0 where dst broadcasts)
  std::int64_t step = 1;
  for (std::size_t k = nd; k-- > lead;) {
    const std::int64_t d = ds[k - lead];
    dstr[k] = d == 1 ? 0 : step;
    step *= d;
  }
  std::vector<Acc> acc(static_cast<std::size_t>(dst.numel()), Acc(0));
  const Elem *src = static_cast<const Elem *>(TensorAccess::Read(g));
  ShapeVector idx(nd, 0);
  for (std::int64_t n = 0; n < g.numel(); ++n) {
    std::int64_t so = 0, doff = 0;
    for (std::size_t k = 0; k < nd; ++k) {
      so += idx[k] * gst[k];
      doff += idx[k] * dstr[k];
    }
    acc[static_cast<std::size_t>(doff)] += static_cast<Acc>(src[so]);
    for (std::size_t k = nd; k-- > 0;) {
      if (++idx[k] < gs[k]) break;
      idx[k] = 0;
    }
  }
  Elem *out = static_cast<Elem *>(dst.data_ptr());
  for (std::size_t i = 0; i < acc.size(); ++i) out[i] = static_cast<Elem>(acc[i]);
}

inline void SumDownTo(const Tensor &g, Tensor &dst) {
  switch (g.dtype()) {
    case kFloat32: return SumDown<double, float>(g, dst);
    case kFloat64: return SumDown<double, double>(g, dst);
    case kComplex64: return SumDown<std::complex<double>, std::complex<float>>(g, dst);
    case kComplex128: return SumDown<std::complex<double>, std::complex<double>>(g, dst);
    case kFloat16: return SumDown<float, Half>(g, dst);
    case kBFloat16: return SumDown<float, bfloat16>(g, dst);
    default:
      throw std::runtime_error(std::string("a gradient of dtype ") + DataTypeName(g.dtype()) + " in a broadcast shape");
  }
}

// Writes `outs` (null: zeros) into XLA's result buffers `dst`, checking shapes and dtypes. With
// `sum_down` (gradients) an output in a shape its buffer's broadcasts to is summed down to it first. An output
// already in its own buffer stays; one inside another result buffer is copied aside first, so no
// write clobbers an output not yet copied.
// `outs` is emptied (its room kept).
inline void CopyOut(TensorPtrList &outs, const TensorPtrList &dst, const std::string &name, bool sum_down = false) {
  for (std::size_t j = 0; j < outs.size(); ++j) {
    TensorPtr &t = outs[j];
    if (sum_down && t && t->dtype() == dst[j]->dtype() && t->shape() != dst[j]->shape() &&
        BroadcastsTo(dst[j]->shape(), t->shape())) {
      auto summed = std::make_shared<Tensor>(dst[j]->dtype(), dst[j]->shape());
      SumDownTo(*t, *summed);
      t = summed;
    }
    if (t && (t->dtype() != dst[j]->dtype() || t->shape() != dst[j]->shape())) {
      // where XLA's shape came from: the input's (a gradient), else the shape rule or the run on zeros
      throw std::runtime_error(name + (sum_down ? ": gradient " : ": output ") + std::to_string(j) + " has shape " +
                               ShapeString(t->shape()) + " and dtype " + DataTypeName(t->dtype()) +
                               ", but XLA expects shape " + ShapeString(dst[j]->shape()) + " and dtype " +
                               DataTypeName(dst[j]->dtype()) +
                               (sum_down ? " (its input's)"
                                         : " (from its shape rule, InferShape or to_jax's shape_fn; without one, "
                                           "from its run on zeros of these input shapes: an output shape that "
                                           "depends on the input values needs a shape rule)"));
    }
  }
  for (std::size_t j = 0; j < outs.size(); ++j) {
    if (!outs[j] || outs[j]->nbytes() == 0) continue;
    for (std::size_t k = 0; k < dst.size(); ++k) {
      const bool in_place = k == j && TensorAccess::Read(*outs[j]) == dst[j]->data_ptr() && outs[j]->is_contiguous();
      if (!in_place && dst[k]->nbytes() != 0 && Within(*outs[j], *dst[k])) {
        outs[j] = outs[j]->contiguous_copy();
        break;
      }
    }
  }
  for (std::size_t j = 0; j < outs.size(); ++j) {
    const TensorPtr &t = outs[j];
    if (!t) {
      std::memset(dst[j]->data_ptr(), 0, dst[j]->nbytes());
    } else if (TensorAccess::Read(*t) == dst[j]->data_ptr() || t->nbytes() == 0) {
      continue;  // built in place
    } else if (t->is_contiguous()) {
      std::memcpy(dst[j]->data_ptr(), TensorAccess::Read(*t), dst[j]->nbytes());
    } else {
      dst[j]->copy_from(*t);
    }
  }
  outs.clear();
}

// The forward and backward handlers of any Function, through its FfiEntry (detail/ffi_entry.h): one
// compiled copy serves every Function (src/jax_ffi.cpp, built once per JAX version, and each
// OB_XLA_FFI of a module).
class Handlers {
 public:
  // `where`: what the handlers are, in messages (binding.h NoPythonHandler).
  explicit Handlers(const FfiEntry &e, const char *where = "an XLA FFI handler (to_jax's generic handlers)")
      : e_(e), n_(e.nargs), where_(where) {}

  // Arguments: Forward's inputs. Results: Forward's outputs.
  ffi::Error Forward(ffi::RemainingArgs args, ffi::RemainingRets rets) const {
    try {
      if (args.size() != n_) throw std::runtime_error("expects " + std::to_string(n_) + " arguments, got " +
                                                      std::to_string(args.size()));
      const TensorPtrList dst = ResultTensors(rets);
      TensorPtrList outs;
      for (int attempt = 0;; ++attempt) {  // a second run only after RetryWithCopies
        std::vector<bool> aliased(dst.size(), false);
        Kept kept(n_, nullptr);
        const Inputs in = ReadInputs(args, dst, aliased, kept, e_.forward_writes());
        TensorPtrList offered;  // a result buffer holding an input is not free for new tensors
        offered.reserve(dst.size());
        for (std::size_t j = 0; j < dst.size(); ++j) {
          if (!aliased[j]) offered.push_back(dst[j]);
        }
        try {
          AutogradContext ctx;  // dies (with what Forward saved) before the outputs are copied
          Raw raw(n_ + 1, nullptr);
          OfferResults offer(offered);
          outs = RunForward(ctx, in, raw, &offer);
          WroteCopies(State(ctx), in, kept, e_.forward_writes());  // a write without MarkDirty landed in a copy
          State(ctx).args = nullptr;
          break;
        } catch (const RetryWithCopies &r) {
          if (attempt > 0) RefuseReadOnlyDirty(r.arg);
        }
      }
      if (outs.size() != dst.size()) {
        throw std::runtime_error("Forward returned " + std::to_string(outs.size()) + " tensors, but XLA expects " +
                                 std::to_string(dst.size()));
      }
      for (std::size_t j = 0; j < outs.size(); ++j) {
        if (!outs[j]) throw std::runtime_error("Forward returned a null tensor as output " + std::to_string(j));
      }
      CopyOut(outs, dst, e_.name());
      return ffi::Error::Success();
    } catch (const std::exception &ex) {
      return Fail("forward", ex.what());
    } catch (...) {
      return Fail("forward", "an exception that is not a std::exception");
    }
  }

  // Arguments: Forward's inputs, then one cotangent per output. Results: one gradient per input that
  // needs one (bit i of `needs`: JAX differentiates input i; all bits: every input), then one scratch
  // buffer per input declared written (to_jax's mutates), aliased to it: XLA copies the input there,
  // and the rerun Forward writes that copy. Forward and Backward see NeedsInputGrad(i) false for an
  // input outside `needs`, as in the runtime for an input that does not require grad: no gradient is
  // computed or written for it.
  ffi::Error Backward(ffi::RemainingArgs args, ffi::RemainingRets rets, std::uint64_t needs = ~std::uint64_t{0}) const {
    try {
      std::size_t n_grads = 0;
      for (std::size_t i = 0; i < n_; ++i) n_grads += NeedsBit(needs, i) ? 1 : 0;
      if (args.size() <= n_ || rets.size() < n_grads || rets.size() > n_grads + n_) {
        throw std::runtime_error("expects the " + std::to_string(n_) + " inputs, the output cotangents and " +
                                 std::to_string(n_grads) + " results (and a buffer per written input)");
      }
      const TensorPtrList all = ResultTensors(rets);
      TensorPtrList dst(n_);  // the gradients' buffers, by input (null for one that needs none)
      for (std::size_t i = 0, j = 0; i < n_; ++i) {
        if (NeedsBit(needs, i)) dst[i] = all[j++];
      }
      // the rerun Forward's outputs: built in scratch blocks the size of the cotangents (its outputs'
      // shapes), not fresh memory each call; held until the gradients are copied out
      TensorPtrList rerun;
      rerun.reserve(args.size() - n_);
      for (std::size_t j = n_; j < args.size(); ++j) {
        auto b = args.get<ffi::AnyBuffer>(j);
        const DataType dt = b.has_value() ? FromXla(b->element_type()) : kTypeUnknown;
        if (dt == kTypeUnknown || b->size_bytes() == 0) continue;
        std::shared_ptr<void> block = ScratchBlock(b->size_bytes());
        rerun.push_back(NewTensor(dt, ShapeOf(b->dimensions()), ShapeVector{}, block.get(), block,
                                                 true));
      }
      const OfferResults rerun_offer(rerun);
      std::unique_ptr<AutogradContext> ctx_owner;
      Inputs in;
      TensorPtrList outs;
      Raw raw(n_ + 1, nullptr);
      std::vector<std::uint64_t> prints(n_, 0);
      double phase = 0;
      for (int attempt = 0;; ++attempt) {  // a second run only after RetryWithCopies
        std::vector<bool> aliased(all.size(), false);
        Kept kept(n_, nullptr);
        in = ReadInputs(args, all, aliased, kept, e_.writes());
        ctx_owner = std::make_unique<AutogradContext>();
        ContextState &st = State(*ctx_owner);
        st.needs.assign(n_, false);
        for (std::size_t i = 0; i < n_; ++i) {
          st.needs[i] = NeedsBit(needs, i) && ::opbuilder::IsDifferentiable(in[i]->dtype());
        }
        // the gradient route records, so (as the runtime does when it records) a write to an input
        // without MarkDirty is an error, with the runtime's message
        phase = NextFingerprintPhase();
        for (std::size_t i = 0; i < n_; ++i) prints[i] = Fingerprint(*in[i], phase);
        try {
          outs = RunForward(*ctx_owner, in, raw, &rerun_offer);
          WroteCopies(st, in, kept, e_.writes());
          break;
        } catch (const RetryWithCopies &r) {
          State(*ctx_owner).args = nullptr;
          if (attempt > 0) RefuseReadOnlyDirty(r.arg);
        }
      }
      AutogradContext &ctx = *ctx_owner;
      ContextState &st = State(ctx);
      for (std::size_t i = 0; i < n_; ++i) {
        if (!st.IsDirty(in[i].get()) && Fingerprint(*in[i], phase) != prints[i]) {
          NoteWritten();
          throw std::runtime_error(e_.name() + "::Forward modified argument " + std::to_string(i) +
                                   " in place without MarkDirty; mark it (ctx->MarkDirty({tensor})) and return "
                                   "it, or write the result to a new tensor");
        }
      }
      st.args = nullptr;
      if (args.size() - n_ != outs.size()) {
        throw std::runtime_error("Forward returned " + std::to_string(outs.size()) + " tensors, but got " +
                                 std::to_string(args.size() - n_) + " cotangents");
      }
      const InputMode ct_mode = !e_.views                                ? InputMode::kCopy
                                : KeepsArguments(e_.cotangent_writes()) ? InputMode::kReadOnlyCopy
                                                                        : InputMode::kView;
      TensorPtrList grads, ct_copies;
      grads.reserve(args.size() - n_);
      std::vector<const void *> ct_kept;
      for (std::size_t j = 0; j < outs.size(); ++j) {
        auto b = args.get<ffi::AnyBuffer>(n_ + j);
        if (!b.has_value()) throw std::runtime_error("cotangent " + std::to_string(j) + ": " + b.error().message());
        grads.push_back(Input(*b, ct_mode, "cotangent", j));
        if (ct_mode == InputMode::kReadOnlyCopy && grads.back()->nbytes() != 0 && b->untyped_data() != nullptr) {
          ct_copies.push_back(grads.back());
          ct_kept.push_back(b->untyped_data());
        }
      }
      TensorPtrList g;
      {
        TensorPtrList wanted;  // the gradient buffers XLA gave, offered to Backward's new tensors
        wanted.reserve(n_);
        for (const auto &d : dst) {
          if (d) wanted.push_back(d);
        }
        OfferResults offer(wanted);
        e_.backward(&ctx, &grads, &g, &offer.buffers(), where_);
      }
      if (!ct_copies.empty()) {  // what Backward did to the copies tells later calls whether they need one
        bool wrote = false;
        for (std::size_t j = 0; j < ct_copies.size(); ++j) {
          wrote = wrote || std::memcmp(ct_copies[j]->data_ptr(), ct_kept[j], ct_copies[j]->nbytes()) != 0;
        }
        if (wrote) {
          NoteWrites(e_.cotangent_writes());
        } else {
          NoteReadOnlyCall(e_.cotangent_writes());
        }
      }
      if (g.size() != n_) {
        throw std::runtime_error("Backward returned " + std::to_string(g.size()) + " gradients for " +
                                 std::to_string(n_) + " arguments");
      }
      TensorPtrList g_out, g_dst;  // the gradients XLA asked for, in its result order
      g_out.reserve(n_);
      g_dst.reserve(n_);
      for (std::size_t i = 0; i < n_; ++i) {
        if (!dst[i]) continue;
        g_out.push_back(st.needs[i] ? g[i] : nullptr);
        g_dst.push_back(dst[i]);
      }
      CopyOut(g_out, g_dst, e_.name(), true);
      return ffi::Error::Success();
    } catch (const std::exception &ex) {
      return Fail("backward", ex.what());
    } catch (...) {
      return Fail("backward", "an exception that is not a std::exception");
    }
  }

 private:
  using Inputs = std::vector<TensorPtr>;
  // XLA's memory of each input a kAcceptsViews Forward got as a private copy, else null.
  using Kept = std::vector<const void *>;
  using Raw = std::vector<Tensor *>;
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  // Whether bit i of `needs` is set (an input past the 64th always needs its gradient).
  static bool NeedsBit(std::uint64_t needs, std::size_t i) { return i >= 64 || ((needs >> i) & 1U) != 0; }

  // Thrown when Forward marked dirty XLA's read-only buffer (a kAcceptsViews type known to write
  // nothing that wrote after all): the handler runs Forward again on private copies, which the type
  // gets from now on, so the call has the answer every other call (and the callback path) has.
  struct RetryWithCopies {
    int arg;
  };

  // A call wrote an argument (MarkDirty, or a write found without it): every call of T keeps copies.
  // T's knowledge (Writes) is the runtime's too: the backward handler's rerun of Forward records
  // (NeedsInputGrad is set) and reads and adds to it; the forward handler's calls record nothing, and a
  // Forward may write only when it records, so they keep their own (forward_writes).
  void NoteWritten() const {
    NoteWrites(e_.writes());
    NoteWrites(e_.forward_writes());
  }

  // The inputs as Forward gets them. An input XLA aliased to a result buffer (to_jax's `mutates`:
  // input_output_aliases) is that buffer, writable and not copied; `aliased` marks the result buffers
  // so used, which are then not offered to new tensors. Any other input is a private writable copy
  // (decided before Forward runs, so no write, MarkDirty'd or not, reaches XLA's buffer), except that
  // with kAcceptsViews a type known to write nothing gets XLA's memory read-only; `kept` records
  // XLA's memory of each copy a kAcceptsViews type got. `known` is what the handler's calls showed
  // (forward_writes, or writes for the rerun); a write seen anywhere keeps copies everywhere.
  Inputs ReadInputs(const ffi::RemainingArgs &args, const TensorPtrList &dst, std::vector<bool> &aliased, Kept &kept,
                    const WriteState *known) const {
    const bool keep = KeepsArguments(known) || e_.writes()->load(std::memory_order_relaxed) == kWritesArgs;
    const InputMode mode = !e_.views || keep ? InputMode::kCopy : InputMode::kView;
    Inputs in(n_);
    for (std::size_t i = 0; i < n_; ++i) {
      auto b = args.get<ffi::AnyBuffer>(i);
      if (!b.has_value()) throw std::runtime_error("argument " + std::to_string(i) + ": " + b.error().message());
      const std::size_t j = AliasOf(*b, dst);
      if (j != kNone) {
        in[i] = Wrap(*b, true, "argument", i);
        aliased[j] = true;
      } else {
        in[i] = Input(*b, mode, "argument", i);
        if (e_.views && mode == InputMode::kCopy) kept[i] = b->untyped_data();
      }
    }
    return in;
  }

  // After Forward ran without a refusal: whether a kAcceptsViews Forward wrote a private copy it was
  // given (MarkDirty'd or not; the copy is then discarded, or copied out as an output). What the call showed
  // goes to T's knowledge: a write keeps copies from now on; a call that wrote nothing (no MarkDirty,
  // every copy as XLA gave it) lets later calls of its handler (`known`) take XLA's memory itself.
  bool WroteCopies(const ContextState &st, const Inputs &in, const Kept &kept, WriteState *known) const {
    if (!e_.views) return false;
    bool any = false, wrote = false;
    for (std::size_t i = 0; i < n_; ++i) {
      const std::size_t n = in[i]->nbytes();
      if (kept[i] == nullptr || n == 0) continue;  // an empty copy shows nothing
      any = true;
      wrote = wrote || std::memcmp(in[i]->data_ptr(), kept[i], n) != 0;
    }
    if (wrote) {
      NoteWritten();
    } else if (any && st.dirty.empty()) {
      NoteReadOnlyCall(known);
    }
    return wrote;
  }

  // The result buffer XLA placed input `b` in (declared aliasing), or kNone.
  static std::size_t AliasOf(const ffi::AnyBuffer &b, const TensorPtrList &dst) {
    if (b.size_bytes() == 0) return kNone;
    for (std::size_t j = 0; j < dst.size(); ++j) {
      if (dst[j]->data_ptr() == b.untyped_data()) return j;
    }
    return kNone;
  }

  // The refusal if Forward marks XLA's read-only buffer dirty even on a retry with copies (it cannot:
  // copies are writable; kept so the impossible case is named, not silent).
  [[noreturn]] static void RefuseReadOnlyDirty(int i) {
    throw ValueError("argument " + std::to_string(i) + " is a JAX array (immutable), given as XLA's read-only "
                     "buffer to a Function that declares kAcceptsViews, but Forward marked it dirty (an "
                     "in-place write) even when run again on a private copy; declare the write to XLA with "
                     "to_jax(module, mutates={<function>: [" + std::to_string(i) + "]}), or drop kAcceptsViews");
  }

  // MarkDirty'd tensors must be arguments (as the runtime requires). A private copy may be marked
  // dirty (its values are copied out as the output). XLA's read-only buffer (a kAcceptsViews type
  // known to write nothing gets it) may not be written: Forward runs again on copies (RetryWithCopies);
  // a Function taking views honours is_writable(), so that buffer is as XLA gave it.
  void CheckDirty(const ContextState &st, const TensorPtrList &outs) const {
    if (!st.dirty.empty()) NoteWritten();  // T writes its arguments: later calls keep copies
    for (const auto &d : st.dirty) {
      const int i = st.ArgIndex(d.get());
      if (i < 0) throw std::runtime_error("MarkDirty was given a tensor that is not an argument of Forward");
      if (IndexOf(outs, d.get()) < 0) {
        throw std::runtime_error("argument " + std::to_string(i) + " was given to MarkDirty but not returned by "
                                 "Forward; an argument modified in place must be returned as an output");
      }
      if (!d->is_writable()) throw RetryWithCopies{i};
    }
  }

  // Forward with a context the handler owns (no runtime, no Python); `needs` marks the arguments
  // Backward will be asked for. `offer`: buffers for new tensors (XLA's results, or scratch), or null.
  TensorPtrList RunForward(AutogradContext &ctx, const Inputs &in, Raw &raw, const OfferResults *offer) const {
    ContextState &st = State(ctx);
    st.name = &e_.name();
    for (std::size_t i = 0; i < n_; ++i) raw[i] = in[i].get();
    st.args = raw.data();
    st.nargs = n_;
    TensorPtrList outs;
    e_.forward(&ctx, in.data(), &outs, offer != nullptr ? &offer->buffers() : nullptr, where_);
    CheckDirty(st, outs);
    return outs;
  }

  ffi::Error Fail(const char *stage, const char *what) const {
    return ffi::Error::Internal(e_.name() + " (XLA FFI " + stage + "): " + what);
  }

  const FfiEntry &e_;
  std::size_t n_;
  const char *where_;
};

// ---- a bound function run whole (detail/ffi_bound.h) ------------------------------------------------
// The generic route runs the module function itself in C++ on every call, so a Function it picks by
// the call's values is the one eager picks. Each Apply it makes comes to BoundRun::Run (the runner
// autograd.h hands it to): Forward runs with a context the handler owns; with a gradient wanted, the
// call is one node of a tape (the context and Backward, and which values its arguments and outputs
// are), which the backward handler runs in reverse as the runtime's engine would run those nodes.
// Work the function does outside Apply is not on the tape, as it is in no graph in eager.

// One Apply on the tape: its context (what Forward saved) and Backward; per argument the value its
// gradient goes to (-1: none), per output its value.
struct TapeNode {
  std::unique_ptr<AutogradContext> ctx;
  BackwardFn backward = nullptr;
  std::vector<int> in, out;
};

// What a recorded run keeps for its backward: the nodes in call order and, per value (the function's
// inputs first, then each node's outputs), its dtype, shape and whether it gets a gradient.
struct Tape {
  std::vector<TapeNode> nodes;
  std::vector<DataType> dtype;
  std::vector<ShapeVector> shape;  // per value (dtype's size); a reused tape may hold more, unused
  std::vector<bool> wants;
  std::vector<int> results;  // per output of the function: its value, or -1 (no gradient flows back)
  // Outputs that are views of an input (a Tensor the function built on x->storage(), no Function around
  // it): per such output, the input value and where its elements sit in that input (BoundRun::NoteView).
  struct View {
    std::size_t result;
    int value;
    std::int64_t offset;
    ShapeVector strides;
  };
  std::vector<View> views;
  std::size_t nbytes = 0;    // what the contexts hold (saved tensors), for the table's bound
  // The lent inputs' XLA addresses (record; null for an input aliased to a result). A context may hold
  // them; the backward's inputs are the same values, and at the same addresses the memory still holds them.
  std::vector<const void *> xla_inputs;
  // The nodes' lists of an earlier recording on this thread (KeepTape), emptied, kept for their room.
  std::vector<std::vector<int>> spare_lists;
  std::vector<int> List(std::size_t n, int fill) {
    std::vector<int> v;
    if (!spare_lists.empty()) {
      v = std::move(spare_lists.back());
      spare_lists.pop_back();
    }
    v.assign(n, fill);
    return v;
  }
};

// A finished tape, kept per thread for the next recording (cleared; its lists, and its shapes' buffers,
// keep their room): a 1-element gradient step otherwise spends ~2,000 instructions allocating them.
inline std::unique_ptr<Tape> &SpareTape() {
  static thread_local std::unique_ptr<Tape> spare;
  return spare;
}
inline std::unique_ptr<Tape> TakeTape() {
  std::unique_ptr<Tape> &spare = SpareTape();
  return spare ? std::move(spare) : std::make_unique<Tape>();
}
inline void KeepTape(std::unique_ptr<Tape> tape) {
  if (!tape || SpareTape()) return;
  constexpr std::size_t kKeepLists = 16;
  for (auto &node : tape->nodes) {
    for (std::vector<int> *v : {&node.in, &node.out}) {
      if (v->capacity() != 0 && v->capacity() <= 64 && tape->spare_lists.size() < kKeepLists) {
        tape->spare_lists.push_back(std::move(*v));
      }
    }
  }
  tape->nodes.clear();
  tape->dtype.clear();
  tape->wants.clear();
  tape->results.clear();
  tape->views.clear();
  tape->nbytes = 0;
  tape->xla_inputs.clear();
  SpareTape() = std::move(tape);
}

// A Function's arguments that are memory the handler lent (tensor_details.h LentScope). ForwardArg
// makes them private copies, except for a type that declares kConstArgs: its Forward reads them in
// place, read-only. If it marks one dirty all the same, or returns a view of one (an output inside its
// memory), that argument becomes its private copy and Forward runs again (Escaped), as it would on the
// caller's own writable tensor: the function sees one answer, and XLA's memory is not handed on.
class LentArgs {
 public:
  explicit LentArgs(const FunctionCall &f) : n_(f.nargs) {
    for (std::size_t i = 0; i < n_; ++i) {
      Tensor *t = f.args[i];
      if (t == nullptr || !TensorAccess::IsLent(*t)) continue;
      if (n_ > kInline && more_.empty()) more_.assign(n_, nullptr);
      at(i) = t;
      any_ = true;
    }
  }
  LentArgs(const LentArgs &) = delete;
  LentArgs &operator=(const LentArgs &) = delete;

  // After Forward threw: true when it had marked an argument read in place dirty (that argument is
  // then its private copy, and Forward runs again, as on the caller's writable tensor it would have
  // written it instead of failing on read-only memory).
  bool DirtyBeforeError(const ContextState &st) {
    return any_ && Escaped(st, nullptr, 0);
  }

  // After Forward: true when an argument read in place escaped (see above) and Forward must run again.
  bool Escaped(const ContextState &st, const TensorPtr *outs, std::size_t n) {
    if (!any_) return false;
    bool again = false;
    for (std::size_t i = 0; i < n_; ++i) {
      Tensor *t = at(i);
      if (t == nullptr) continue;
      if (!TensorAccess::IsLent(*t)) {  // made a private copy through another argument (f(x, x))
        at(i) = nullptr;
        continue;
      }
      bool escaped = st.IsDirty(t);
      for (std::size_t j = 0; j < n && !escaped; ++j) {
        escaped = outs[j] && outs[j].get() != t && t->nbytes() != 0 && Within(*outs[j], *t);
      }
      if (!escaped) continue;
      TensorAccess::Unlend(*t);
      at(i) = nullptr;
      again = true;
    }
    return again;
  }

 private:
  static constexpr std::size_t kInline = 4;
  Tensor *&at(std::size_t i) { return n_ > kInline ? more_[i] : inline_[i]; }
  std::size_t n_;
  bool any_ = false;
  Tensor *inline_[kInline] = {};
  std::vector<Tensor *> more_;
};

template <typename E>
void AddElems(const Tensor &a, const Tensor &b, Tensor &out) {
  const E *x = static_cast<const E *>(a.data_ptr()), *y = static_cast<const E *>(b.data_ptr());
  E *o = static_cast<E *>(out.data_ptr());
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    if constexpr (std::is_same_v<E, Half> || std::is_same_v<E, bfloat16>) {
      o[i] = E(static_cast<float>(x[i]) + static_cast<float>(y[i]));
    } else {
      o[i] = x[i] + y[i];
    }
  }
}

// a + b (same dtype and shape), a new tensor: two gradients of one value, summed as the engine does.
inline TensorPtr AddGradients(const TensorPtr &a, const TensorPtr &b) {
  const TensorPtr x = a->is_contiguous() ? a : a->contiguous_copy();
  const TensorPtr y = b->is_contiguous() ? b : b->contiguous_copy();
  auto out = std::make_shared<Tensor>(a->dtype(), a->shape());
  switch (a->dtype()) {
    case kFloat32: AddElems<float>(*x, *y, *out); break;
    case kFloat64: AddElems<double>(*x, *y, *out); break;
    case kComplex64: AddElems<std::complex<float>>(*x, *y, *out); break;
    case kComplex128: AddElems<std::complex<double>>(*x, *y, *out); break;
    case kFloat16: AddElems<Half>(*x, *y, *out); break;
    case kBFloat16: AddElems<bfloat16>(*x, *y, *out); break;
    default: throw std::runtime_error(std::string("a gradient of dtype ") + DataTypeName(a->dtype()));
  }
  return out;
}

// The runner of one run of a bound function (FfiApplyRunner's state): each Apply's Forward, and with
// `record` its node on the tape. Tensors are told apart by identity, as the runtime's graph does.
class BoundRun {
 public:
  // `inputs`: the function's arguments; `wants` (record only): per argument, whether it gets a gradient.
  // `depth` 1: a runner for Applies inside Backward calls, which run recording nothing.
  BoundRun(const TensorPtrList &inputs, const std::vector<bool> &wants, bool record, int depth = 0)
      : record_(record), depth_(depth), tape_(record ? TakeTape() : nullptr) {
    if (record) {  // room for the usual call (its inputs, a few nodes' outputs): no regrowth per value
      const std::size_t values = inputs.size() + 6;
      tape_->dtype.reserve(values);
      tape_->shape.reserve(values);
      tape_->wants.reserve(values);
      tape_->nodes.reserve(4);
      live_->reserve(values);
    }
    for (std::size_t i = 0; record && i < inputs.size(); ++i) NewValue(inputs[i], wants[i]);
    inputs_ = record ? inputs.size() : 0;
  }
  BoundRun(const BoundRun &) = delete;
  BoundRun &operator=(const BoundRun &) = delete;
  const FfiApplyRunner &runner() const { return runner_; }

  // After the function returned `outs`: the tape (which values they are; null without `record`); the
  // run's tensors go.
  std::unique_ptr<Tape> Finish(const TensorPtrList &outs) {
    if (!record_) return nullptr;
    for (std::size_t j = 0; j < outs.size(); ++j) {
      const int v = outs[j] ? ValueOf(outs[j].get()) : -1;
      tape_->results.push_back(v >= 0 && tape_->wants[v] ? v : -1);
      if (v < 0 && outs[j]) NoteView(j, *outs[j]);
    }
    live_->clear();
    return std::move(tape_);
  }

 private:
  static void Run(void *state, const FunctionCall &f, TensorPtr *single, TensorPtrList *list) {
    static_cast<BoundRun *>(state)->Apply(f, single, list);
  }

  int ValueOf(const Tensor *t) const {
    for (std::size_t k = live_->size(); k-- > 0;) {
      if ((*live_)[k].first.get() == t) return (*live_)[k].second;
    }
    return -1;
  }
  int NewValue(const TensorPtr &t, bool wants) {
    const int v = static_cast<int>(tape_->dtype.size());
    tape_->dtype.push_back(t->dtype());
    if (tape_->shape.size() > static_cast<std::size_t>(v)) {
      tape_->shape[static_cast<std::size_t>(v)] = t->shape();  // a reused tape: the buffer kept
    } else {
      tape_->shape.push_back(t->shape());
    }
    tape_->wants.push_back(wants);
    live_->emplace_back(t, v);  // kept alive while the run lasts: no address is reused
    return v;
  }

  // Output `j`, no value of the run, over the elements of an input that gets a gradient (a Tensor the
  // function built on x->storage()): a view of that input, as the runtime (runtime/call_rules.py
  // returned_view) and to_torch make it, so its cotangent reaches the input where its elements sit. Not a
  // view: one of another dtype (a bit cast), or with an element outside the input's.
  void NoteView(std::size_t j, const Tensor &o) {
    if (o.numel() == 0) return;
    for (std::size_t k = 0; k < inputs_; ++k) {
      const Tensor &x = *(*live_)[k].first;
      const int v = ValueOf(&x);  // the input's latest value: a Function that wrote it in place made a new one
      if (!tape_->wants[v] || x.dtype() != o.dtype() || !x.is_contiguous() || x.is_cuda() != o.is_cuda()) continue;
      const auto item = static_cast<std::ptrdiff_t>(x.element_size());
      const std::ptrdiff_t bytes =
          static_cast<const char *>(TensorAccess::Read(o)) - static_cast<const char *>(TensorAccess::Read(x));
      if (item == 0 || bytes % item != 0) continue;
      const ShapeVector strides = o.strides();
      std::int64_t lo = bytes / item, hi = lo;
      for (std::size_t d = 0; d < strides.size(); ++d) {
        const std::int64_t reach = (o.shape()[d] - 1) * strides[d];
        (reach < 0 ? lo : hi) += reach;
      }
      if (lo < 0 || hi >= x.numel()) continue;
      tape_->views.push_back(Tape::View{j, v, bytes / item, strides});
      return;
    }
  }

  static void Begin(ContextState &st, const FunctionCall &f) {
    st.name = f.name;
    st.args = f.args;
    st.originals = f.originals;
    st.nargs = f.nargs;
    st.writes = f.writes;
  }

  // Forward's outputs: none null; each tensor marked dirty an argument and returned. A private copy Apply
  // made is written back to the caller's tensor, as eager does; read-only memory is never written.
  void CheckOutputs(const FunctionCall &f, const ContextState &st, const TensorPtr *outs, std::size_t n) const {
    const std::string &name = *f.name;
    for (std::size_t j = 0; j < n; ++j) {
      if (!outs[j]) throw std::runtime_error(name + "::Forward returned a null tensor as output " + std::to_string(j));
    }
    for (const auto &d : st.dirty) {
      const int i = st.ArgIndex(d.get());
      if (i < 0) throw std::runtime_error(name + ": MarkDirty was given a tensor that is not an argument of Forward");
      bool returned = false;
      for (std::size_t j = 0; j < n; ++j) returned = returned || outs[j].get() == d.get();
      if (!returned) {
        throw std::runtime_error(name + ": argument " + std::to_string(i) + " was given to MarkDirty but not returned "
                                 "by Forward; an argument modified in place must be returned as an output");
      }
      Tensor *caller = f.originals[i] != nullptr ? f.originals[i] : d.get();
      if (!caller->is_writable()) {
        throw ValueError(name + ": argument " + std::to_string(i) + " is read-only memory, but Forward marked it "
                         "dirty (an in-place write)");
      }
      if (f.originals[i] != nullptr) f.originals[i]->copy_from(*d);  // Apply's private copy, as eager
    }
  }

  static const TensorPtr *Outs(TensorPtr *single, TensorPtrList *list) { return single != nullptr ? single : list->data(); }
  static std::size_t NumOuts(TensorPtr *single, TensorPtrList *list) { return single != nullptr ? 1 : list->size(); }

  // f.forward into *single or *list with the run's depth (an error names the Function). True when
  // Forward must run again: it marked an argument read in place dirty (then failed, or not), or returned
  // a view of one; LentArgs made those arguments private copies.
  bool ForwardRun(const FunctionCall &f, AutogradContext *ctx, TensorPtr *single, TensorPtrList *list,
                  LentArgs &lent) {
    if (single != nullptr) {
      single->reset();
    } else {
      list->clear();
    }
    ++depth_;
    try {
      f.forward(ctx, f.call, single, list);
    } catch (const std::exception &e) {
      --depth_;
      if (lent.DirtyBeforeError(State(*ctx))) return true;
      throw std::runtime_error(*f.name + ": " + e.what());
    } catch (...) {
      --depth_;
      if (lent.DirtyBeforeError(State(*ctx))) return true;
      throw;
    }
    --depth_;
    return lent.Escaped(State(*ctx), Outs(single, list), NumOuts(single, list));
  }

  void Apply(const FunctionCall &f, TensorPtr *single, TensorPtrList *list) {
    LentArgs lent(f);
    if (depth_ > 0 || !record_) {  // nothing to record (inside a Forward or a Backward, as the runtime)
      for (;;) {
        AutogradContext ctx;
        ContextState &st = State(ctx);
        Begin(st, f);
        if (ForwardRun(f, &ctx, single, list, lent)) continue;  // (ctx, and what it saved, go)
        CheckOutputs(f, st, Outs(single, list), NumOuts(single, list));
        if (st.dirty.empty()) NoteReadOnlyCall(f.writes);
        st.args = nullptr;
        st.originals = nullptr;
        return;
      }
    }
    std::unique_ptr<AutogradContext> ctx;
    std::vector<int> in = tape_->List(f.nargs, -1);
    bool recorded = false;
    std::vector<bool> needs(f.nargs, false);
    for (std::size_t i = 0; i < f.nargs; ++i) {
      const Tensor *a = f.originals[i] != nullptr ? f.originals[i] : f.args[i];
      const int v = a != nullptr ? ValueOf(a) : -1;
      if (v < 0 || !tape_->wants[v] || !::opbuilder::IsDifferentiable(a->dtype())) continue;
      needs[i] = true;
      in[i] = v;
      recorded = true;
    }
    // the arguments' fingerprints: in the object for up to kInlinePrints arguments (no allocation)
    constexpr std::size_t kInlinePrints = 8;
    std::uint64_t inline_prints[kInlinePrints] = {};
    std::vector<std::uint64_t> more_prints;
    std::uint64_t *prints = inline_prints;
    double phase = 0;
    if (recorded && f.nargs > kInlinePrints) {
      more_prints.assign(f.nargs, 0);
      prints = more_prints.data();
    }
    do {
      auto fresh = std::make_unique<AutogradContext>();
      Begin(State(*fresh), f);
      State(*fresh).needs = ctx ? std::move(State(*ctx).needs) : std::move(needs);
      ctx = std::move(fresh);
      if (recorded) {  // the runtime checks writes when it records, and so does this
        phase = NextFingerprintPhase();
        for (std::size_t i = 0; i < f.nargs; ++i) {
          if (f.args[i] != nullptr) prints[i] = Fingerprint(*f.args[i], phase);
        }
      }
    } while (ForwardRun(f, ctx.get(), single, list, lent));
    const TensorPtr *outs = Outs(single, list);
    const std::size_t n_outs = NumOuts(single, list);
    ContextState &st = State(*ctx);
    const std::string &name = *f.name;
    CheckOutputs(f, st, outs, n_outs);
    if (recorded) {
      for (std::size_t i = 0; i < f.nargs; ++i) {
        if (f.args[i] == nullptr || st.IsDirty(f.args[i]) || Fingerprint(*f.args[i], phase) == prints[i]) continue;
        NoteWrites(f.writes);
        throw std::runtime_error(name + "::Forward modified argument " + std::to_string(i) +
                                 " in place without MarkDirty; mark it (ctx->MarkDirty({tensor})) and return it, "
                                 "or write the result to a new tensor");
      }
    } else if (st.dirty.empty()) {
      NoteReadOnlyCall(f.writes);
    }
    st.args = nullptr;
    st.originals = nullptr;
    if (!recorded) return;
    TapeNode node;
    node.in = std::move(in);
    node.out = tape_->List(0, -1);
    node.out.reserve(n_outs);
    for (std::size_t j = 0; j < n_outs; ++j) {
      const Tensor *raw = outs[j].get();
      const bool wants = ::opbuilder::IsDifferentiable(raw->dtype()) && !st.IsNonDifferentiable(raw);
      // one tensor returned as two outputs: each its own value, as the runtime's; the later one is an
      // alias over the same memory (a first occurrence keeps its object, so it is what is compared)
      bool again = false;
      for (std::size_t k = 0; k < j; ++k) again = again || outs[k].get() == raw;
      if (again) (*list)[j] = NewTensor(*(*list)[j]);
      node.out.push_back(NewValue(outs[j], wants));
    }
    for (const auto &t : st.saved_raw) tape_->nbytes += t ? t->nbytes() : 0;
    node.backward = f.backward;
    node.ctx = std::move(ctx);
    tape_->nodes.push_back(std::move(node));
  }

  bool record_;
  std::size_t inputs_ = 0;  // the function's inputs: the run's first values
  int depth_ = 0;  // > 0 while a Forward runs: an Apply inside it records nothing
  std::unique_ptr<Tape> tape_;
  Lease<std::vector<std::pair<TensorPtr, int>>> live_;
  FfiApplyRunner runner_{this, &BoundRun::Run};
};

// dst[offset + sum(index * strides)] += g[index] for each element of `g` (contiguous, the view's shape):
// a view's gradient placed where its elements sit in its input (summed where they repeat).
template <typename E>
void PlaceElems(const Tensor &g, std::int64_t offset, const ShapeVector &strides, Tensor &dst) {
  const E *src = static_cast<const E *>(TensorAccess::Read(g));
  E *out = static_cast<E *>(dst.data_ptr());
  const ShapeVector &shape = g.shape();
  ShapeVector idx(shape.size(), 0);
  std::int64_t pos = offset;
  for (std::int64_t k = 0; k < g.numel(); ++k) {
    if constexpr (std::is_same_v<E, Half> || std::is_same_v<E, bfloat16>) {
      out[pos] = E(static_cast<float>(out[pos]) + static_cast<float>(src[k]));
    } else {
      out[pos] += src[k];
    }
    for (std::size_t d = shape.size(); d-- > 0;) {  // the next element: odometer over the view's shape
      pos += strides[d];
      if (++idx[d] < shape[d]) break;
      pos -= strides[d] * shape[d];
      idx[d] = 0;
    }
  }
}
inline void PlaceView(const Tensor &g, std::int64_t offset, const ShapeVector &strides, Tensor &dst) {
  switch (g.dtype()) {
    case kFloat32: PlaceElems<float>(g, offset, strides, dst); break;
    case kFloat64: PlaceElems<double>(g, offset, strides, dst); break;
    case kComplex64: PlaceElems<std::complex<float>>(g, offset, strides, dst); break;
    case kComplex128: PlaceElems<std::complex<double>>(g, offset, strides, dst); break;
    case kFloat16: PlaceElems<Half>(g, offset, strides, dst); break;
    case kBFloat16: PlaceElems<bfloat16>(g, offset, strides, dst); break;
    default: throw std::runtime_error(std::string("a gradient of dtype ") + DataTypeName(g.dtype()));
  }
}

// The gradients of the function's inputs (the first `n` values; null: none) from one cotangent per
// output: the tape's nodes in reverse, each Backward given its outputs' gradients (zeros, or null
// without materialize, for one that got none), each gradient summed down to its value's shape where
// it broadcasts, and summed with the value's other gradients. Each context goes when its node ran.
// `call(node, grads)` runs node.backward (the handler runs it inside its entry's scope).
// The gradients go to `g` (its room reused).
template <typename Call>
void RunTape(Tape &tape, const TensorPtrList &cts, std::size_t n, TensorPtrList &g, Call &&call) {
  g.assign(tape.dtype.size(), nullptr);
  auto add = [&](int v, TensorPtr t) { g[v] = g[v] ? AddGradients(g[v], t) : std::move(t); };
  for (std::size_t j = 0; j < cts.size() && j < tape.results.size(); ++j) {
    if (tape.results[j] >= 0 && cts[j]) add(tape.results[j], cts[j]);
  }
  for (const Tape::View &view : tape.views) {  // an output over an input's elements: its cotangent, placed there
    if (view.result >= cts.size() || !cts[view.result]) continue;
    const TensorPtr ct = cts[view.result]->is_contiguous() ? cts[view.result] : cts[view.result]->contiguous_copy();
    auto placed = Tensor::zeros(tape.dtype[view.value], tape.shape[view.value]);
    PlaceView(*ct, view.offset, view.strides, *placed);
    add(view.value, std::move(placed));
  }
  for (std::size_t k = tape.nodes.size(); k-- > 0;) {
    TapeNode &node = tape.nodes[k];
    bool reached = false;
    for (int o : node.out) reached = reached || g[o] != nullptr;
    if (!reached) {
      node.ctx.reset();
      continue;
    }
    const bool materialize = State(*node.ctx).materialize_grads;
    TensorPtrList grads;
    grads.reserve(node.out.size());
    for (int o : node.out) {
      grads.push_back(g[o] ? std::move(g[o]) : materialize ? Tensor::zeros(tape.dtype[o], tape.shape[o]) : nullptr);
    }
    const std::string &name = node.ctx->function_name();  // (the Function's, for the process)
    TensorPtrList r = call(node, std::move(grads));
    node.ctx.reset();
    if (r.size() != node.in.size()) {
      throw std::runtime_error(name + "::Backward returned " + std::to_string(r.size()) + " gradients for " +
                               std::to_string(node.in.size()) + " arguments");
    }
    for (std::size_t i = 0; i < r.size(); ++i) {
      const int v = node.in[i];
      if (v < 0 || !r[i]) continue;
      TensorPtr t = std::move(r[i]);
      if (t->dtype() == tape.dtype[v] && t->shape() != tape.shape[v] && BroadcastsTo(tape.shape[v], t->shape())) {
        auto summed = std::make_shared<Tensor>(tape.dtype[v], tape.shape[v]);
        SumDownTo(*t, *summed);
        t = summed;
      }
      if (t->dtype() != tape.dtype[v] || t->shape() != tape.shape[v]) {
        throw std::runtime_error(name + "::Backward returned a gradient of shape " + ShapeString(t->shape()) +
                                 " and dtype " + DataTypeName(t->dtype()) + " for argument " + std::to_string(i) +
                                 ", which has shape " + ShapeString(tape.shape[v]) + " and dtype " +
                                 DataTypeName(tape.dtype[v]));
      }
      add(v, std::move(t));
    }
  }
  g.resize(n);
}

// The tapes recorded forward handlers hand to backward handlers, by token (a residual output of the
// forward custom call). Bounded: at most kMaxTapes, kMaxBytes of saved tensors; the oldest go first. A
// backward whose tape is gone (evicted, taken by an earlier backward of the same forward: XLA may
// merge equal calls, a pullback may run twice) runs the forward again for one.
class TapeTable {
 public:
  static constexpr std::size_t kMaxTapes = 1024;
  static constexpr std::size_t kMaxBytes = std::size_t{256} << 20;

  static TapeTable &Get() {
    static TapeTable *table = new TapeTable;  // never destroyed: handlers may run while the process exits
    return *table;
  }
  // The tape's token (never 0), or 0 when it is not kept (too big).
  std::uint64_t Put(std::unique_ptr<Tape> tape) {
    if (tape->nbytes > kMaxBytes) return 0;
    std::vector<std::unique_ptr<Tape>> gone;  // destroyed after the lock
    std::lock_guard<std::mutex> lock(mu_);
    while (!tapes_.empty() && (tapes_.size() >= kMaxTapes || bytes_ + tape->nbytes > kMaxBytes)) {
      bytes_ -= tapes_.front().second->nbytes;
      gone.push_back(std::move(tapes_.front().second));
      tapes_.pop_front();
    }
    const std::uint64_t token = next_++;
    bytes_ += tape->nbytes;
    tapes_.emplace_back(token, std::move(tape));
    return token;
  }
  // The tape of `token`, taken out of the table, or null.
  std::unique_ptr<Tape> Take(std::uint64_t token) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = tapes_.begin(); it != tapes_.end(); ++it) {
      if (it->first != token) continue;
      std::unique_ptr<Tape> t = std::move(it->second);
      bytes_ -= t->nbytes;
      tapes_.erase(it);
      return t;
    }
    return nullptr;
  }
  std::size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return tapes_.size();
  }

 private:
  std::mutex mu_;
  std::uint64_t next_ = 1;
  std::size_t bytes_ = 0;
  std::deque<std::pair<std::uint64_t, std::unique_ptr<Tape>>> tapes_;
};

// The forward and backward handlers of a bound function, through its FfiBoundEntry.
class BoundHandlers {
 public:
  explicit BoundHandlers(const FfiBoundEntry &e, const char *where = "an XLA FFI handler (to_jax's generic handlers)")
      : e_(e), n_(e.nargs), where_(where) {}

  // Arguments: the function's. Results: its outputs; with `record`, then the token (2 uint32) of the tape
  // recorded for the inputs `needs` marks (bit i: JAX differentiates input i). XLA's buffers are never
  // written: the function is lent them (code that touches one gets a private copy first; a kConstArgs
  // Function reads them in place, read-only: LentArgs); an input XLA aliased to a result (to_jax's
  // mutates) is that result buffer (without `record`: with it, a copy, as the tape outlives it).
  ffi::Error Forward(ffi::RemainingArgs args, ffi::RemainingRets rets, std::uint64_t needs, bool record) const {
    LentScope trusted(true);  // the handler's own reads of lent memory take no copy
    TensorPtrList in(n_);
    try {
      if (args.size() != n_) throw std::runtime_error("expects " + std::to_string(n_) + " arguments, got " +
                                                      std::to_string(args.size()));
      TensorPtrList dst = ResultTensors(rets);
      TensorPtr token;
      if (record) {
        if (dst.empty() || dst.back()->nbytes() != 8) throw std::runtime_error("no token result");
        token = dst.back();
        dst.pop_back();
      }
      TensorPtrList outs;
      std::vector<bool> aliased(dst.size(), false), wants(n_, false);
      std::vector<const void *> xla(record ? n_ : 0, nullptr);
      for (std::size_t i = 0; i < n_; ++i) {
        auto b = args.get<ffi::AnyBuffer>(i);
        if (!b.has_value()) throw std::runtime_error("argument " + std::to_string(i) + ": " + b.error().message());
        const std::size_t j = AliasOf(*b, dst);
        if (j != kNone && !record) {  // declared written (mutates): the result buffer XLA copied it to
          in[i] = Wrap(*b, true, "argument", i);
          aliased[j] = true;
        } else if (j != kNone) {  // the same, for a tape that outlives the buffer: a private copy
          in[i] = Input(*b, InputMode::kCopy, "argument", i);
        } else {
          in[i] = Input(*b, InputMode::kLend, "argument", i);
          if (record) xla[i] = b->untyped_data();
        }
        wants[i] = record && NeedsBit(needs, i) && ::opbuilder::IsDifferentiable(in[i]->dtype());
      }
      TensorPtrList offered;  // a result buffer holding an input is not free for new tensors
      offered.reserve(dst.size());
      for (std::size_t j = 0; j < dst.size(); ++j) {
        if (!aliased[j]) offered.push_back(dst[j]);
      }
      std::unique_ptr<Tape> tape = Run(in, wants, record, &offered, &outs);
      if (record) tape->xla_inputs = std::move(xla);
      CheckCount(outs, dst.size());
      if (record) KeepOffXla(*tape, dst);
      CopyOut(outs, dst, *e_.name);
      UnlendKept(in, tape.get());
      if (record) {
        const std::uint64_t t = TapeTable::Get().Put(std::move(tape));  // no node: the backward gives zeros
        std::memcpy(token->data_ptr(), &t, 8);
      }
      return ffi::Error::Success();
    } catch (const std::exception &ex) {
      UnlendKept(in, nullptr);
      return Fail("forward", ex.what());
    } catch (...) {
      UnlendKept(in, nullptr);
      return Fail("forward", "an exception that is not a std::exception");
    }
  }

  // Arguments: the function's, one cotangent per output, the forward's token. Results: one gradient per
  // input `needs` marks (then any scratch results to_jax adds for declared writes, left as they are).
  // The tape is the forward's, or, when it is gone, one recorded now by running the function again.
  ffi::Error Backward(ffi::RemainingArgs args, ffi::RemainingRets rets, std::uint64_t needs) const {
    LentScope trusted(true);
    Lease<TensorPtrList> in_list;  // the inputs of a run here (no tape of the forward's): kept alive while its tape lives
    TensorPtrList &in = *in_list;
    in.assign(n_, nullptr);
    const char *stage = "backward";  // "forward" while the function runs again for its tape: its error is Forward's
    try {
      if (args.size() < n_ + 1) throw std::runtime_error("expects the function's arguments and a token");
      const std::size_t k = args.size() - n_ - 1;
      auto tb = args.get<ffi::AnyBuffer>(args.size() - 1);
      if (!tb.has_value() || tb->size_bytes() != 8) throw std::runtime_error("no token argument");
      std::uint64_t token = 0;
      std::memcpy(&token, tb->untyped_data(), 8);
      std::unique_ptr<Tape> tape = token != 0 ? TapeTable::Get().Take(token) : nullptr;
      if (tape && !tape->xla_inputs.empty()) {  // a context may hold XLA's input memory: still there?
        for (std::size_t i = 0; i < n_ && tape; ++i) {
          auto b = args.get<ffi::AnyBuffer>(i);
          if (tape->xla_inputs[i] != nullptr && (!b.has_value() || b->untyped_data() != tape->xla_inputs[i])) {
            tape.reset();
          }
        }
      }
      if (!tape) {
        TensorPtrList outs;
        Lease<std::vector<bool>> wants;
        wants->assign(n_, false);
        for (std::size_t i = 0; i < n_; ++i) {
          auto b = args.get<ffi::AnyBuffer>(i);
          if (!b.has_value()) throw std::runtime_error("argument " + std::to_string(i) + ": " + b.error().message());
          in[i] = Input(*b, InputMode::kLend, "argument", i);
          (*wants)[i] = NeedsBit(needs, i) && ::opbuilder::IsDifferentiable(in[i]->dtype());
        }
        stage = "forward";
        tape = Run(in, *wants, true, nullptr, &outs);
        CheckCount(outs, k);
        stage = "backward";
      }
      Lease<TensorPtrList> ct_list;  // XLA's memory, read-only: a Backward that is not kAcceptsViews gets copies
      TensorPtrList &cts = *ct_list;
      cts.reserve(k);
      for (std::size_t j = 0; j < k; ++j) {
        auto b = args.get<ffi::AnyBuffer>(n_ + j);
        if (!b.has_value()) throw std::runtime_error("cotangent " + std::to_string(j) + ": " + b.error().message());
        cts.push_back(Input(*b, InputMode::kView, "cotangent", j));
      }
      Lease<TensorPtrList> g_list;  // one gradient per input `needs` marks, in order
      TensorPtrList &g_dst = *g_list;
      ResultTensors(rets, g_dst);
      std::size_t wanted = 0;
      for (std::size_t i = 0; i < n_; ++i) wanted += NeedsBit(needs, i) ? 1 : 0;
      if (g_dst.size() > wanted) g_dst.resize(wanted);  // (scratch results for declared writes stay as they are)
      Lease<TensorPtrList> grad_list;
      TensorPtrList &g = *grad_list;
      {
        // each Backward runs in its module's scope: the gradient buffers offered, an Apply run here
        const OfferResults offer(g_dst);
        BoundRun inner(TensorPtrList{}, std::vector<bool>{}, false, 1);
        RunTape(*tape, cts, n_, g, [&](TapeNode &node, TensorPtrList grads) {
          struct Call {
            TapeNode *node;
            TensorPtrList grads, out;
            std::exception_ptr error;
          } c{&node, std::move(grads), {}, nullptr};
          e_.scoped(
              [](void *p) {
                auto &c = *static_cast<Call *>(p);
                try {
                  c.out = c.node->backward(c.node->ctx.get(), std::move(c.grads));
                } catch (...) {
                  c.error = std::current_exception();
                }
              },
              &c, &inner.runner(), &offer.buffers(), where_);
          if (c.error) {
            try {
              std::rethrow_exception(c.error);
            } catch (const std::exception &e) {  // named as a Forward's error is (and as eager's engine does)
              throw std::runtime_error(node.ctx->function_name() + ": " + e.what());
            }
          }
          return std::move(c.out);
        });
      }
      std::size_t kept = 0;  // the gradients XLA asked for, in its result order
      for (std::size_t i = 0; i < n_ && kept < g_dst.size(); ++i) {
        if (!NeedsBit(needs, i)) continue;
        if (kept != i) g[kept] = std::move(g[i]);
        ++kept;
      }
      g.resize(kept);
      CopyOut(g, g_dst, *e_.name, true);
      KeepTape(std::move(tape));
      UnlendKept(in, nullptr);
      return ffi::Error::Success();
    } catch (const std::exception &ex) {
      UnlendKept(in, nullptr);
      return Fail(stage, ex.what());
    } catch (...) {
      UnlendKept(in, nullptr);
      return Fail(stage, "an exception that is not a std::exception");
    }
  }

 private:
  static ffi::Error Fail(const char *stage, const char *what) {
    return ffi::Error::Internal(std::string("to_jax (XLA FFI ") + stage + "): " + what);
  }
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  static bool NeedsBit(std::uint64_t needs, std::size_t i) { return i >= 64 || ((needs >> i) & 1U) != 0; }

  static std::size_t AliasOf(const ffi::AnyBuffer &b, const TensorPtrList &dst) {
    if (b.size_bytes() == 0) return kNone;
    for (std::size_t j = 0; j < dst.size(); ++j) {
      if (dst[j]->data_ptr() == b.untyped_data()) return j;
    }
    return kNone;
  }

  void CheckCount(const TensorPtrList &outs, std::size_t n) const {
    if (outs.size() != n) {
      throw std::runtime_error(*e_.name + " returned " + std::to_string(outs.size()) + " tensors, but XLA expects " +
                               std::to_string(n));
    }
    for (std::size_t j = 0; j < outs.size(); ++j) {
      if (!outs[j]) throw std::runtime_error(*e_.name + " returned a null tensor as output " + std::to_string(j));
    }
  }

  // Lent inputs something still holds after the call (a static the function keeps, a thread it left
  // running) besides `in` and the contexts `tape` keeps (which the backward reads while XLA keeps the
  // inputs, checking their addresses): each becomes its private copy now, while XLA's memory is there.
  // (Never throws: it runs on the way out of an error too; a copy that cannot be allocated is not made.)
  static void UnlendKept(const TensorPtrList &in, const Tape *tape) noexcept {
    for (const auto &t : in) {
      if (!t || !TensorAccess::IsLent(*t)) continue;
      long expected = 1;
      if (tape != nullptr) {
        for (const auto &node : tape->nodes) {
          for (const auto &s : State(*node.ctx).saved_raw) expected += s.get() == t.get() ? 1 : 0;
        }
      }
      if (t.use_count() <= expected) continue;
      try {
        TensorAccess::Unlend(*t);
      } catch (...) {
      }
    }
  }

  // A tensor a context saved in XLA's memory (a result buffer offered to new tensors) is copied out of
  // it before the results are written: the tape outlives the call, XLA's buffers do not. So are the
  // tensors its saved_data holds (saved_value.h: held as C++ tensors in a run).
  static void KeepOffXla(Tape &tape, const TensorPtrList &dst) {
    auto keep = [&dst](TensorPtr &t) {
      if (!t || t->nbytes() == 0) return;
      for (const auto &d : dst) {
        if (d->nbytes() != 0 && Within(*t, *d)) {
          t = t->contiguous_copy();
          return;
        }
      }
    };
    for (auto &node : tape.nodes) {
      for (auto &t : State(*node.ctx).saved_raw) keep(t);
      for (auto &kv : node.ctx->saved_data) {
        for (auto &t : kv.second.HeldTensors()) keep(t);
      }
    }
  }

  // The function on `in`, its Applies run (and with `record` taped) here; `offer`: result buffers
  // offered to its new tensors, or null.
  std::unique_ptr<Tape> Run(const TensorPtrList &in, const std::vector<bool> &wants, bool record,
                            const TensorPtrList *offer, TensorPtrList *outs) const {
    BoundRun run(in, wants, record);
    if (offer != nullptr) {
      OfferResults o(*offer);
      e_.run(e_.fn, in.data(), outs, &run.runner(), &o.buffers(), where_);
    } else {
      e_.run(e_.fn, in.data(), outs, &run.runner(), nullptr, where_);
    }
    return run.Finish(*outs);
  }

  const FfiBoundEntry &e_;
  std::size_t n_;
  const char *where_;
};

// The bound entry a custom call names (its `entry` attribute: the FfiBoundEntry's address, read by
// to_jax from the probe's run), checked for its ABI number.
inline const FfiBoundEntry &BoundEntryAt(std::int64_t address) {
  const auto *e = reinterpret_cast<const FfiBoundEntry *>(static_cast<std::uintptr_t>(address));
  if (e == nullptr || e->abi != kFfiBoundAbi) {
    throw std::runtime_error("the custom call's entry attribute is not an opbuilder FfiBoundEntry of this version");
  }
  return *e;
}

// Adds `fn` to `module` as the PyCapsule attribute `attr` (what jax.ffi.register_ffi_target takes).
inline void AddCapsule(PyObject *module, const std::string &attr, XLA_FFI_Error *(*fn)(XLA_FFI_CallFrame *)) {
  PyRef cap = PyRef::Steal(Check(PyCapsule_New(reinterpret_cast<void *>(fn), nullptr, nullptr)));
  if (PyObject_SetAttrString(module, attr.c_str(), cap.get()) < 0) throw PythonError();
}

// OB_XLA_FFI's handlers of T (Forward's arguments after ctx all TensorPtr): the generic ones on T's entry.
template <typename T, typename F>
struct EntryOfForward;
template <typename T, typename R, typename... A>
struct EntryOfForward<T, R (*)(AutogradContext *, A...)> {
  static_assert((std::is_same_v<std::decay_t<A>, TensorPtr> && ...),
                "OB_XLA_FFI(m, name, T): every argument of T::Forward after ctx must be a TensorPtr (XLA passes "
                "buffers only)");
  static const FfiEntry &Get() { return *FfiEntryFor<T, std::decay_t<A>...>(); }
};

constexpr const char *kXlaFfiHeader = "an XLA FFI handler (opbuilder/xla_ffi.h)";

template <typename T>
XLA_FFI_Error *ForwardEntry(XLA_FFI_CallFrame *frame) {
  static const Handlers handlers(EntryOfForward<T, decltype(&T::Forward)>::Get(), kXlaFfiHeader);
  static auto *h = ffi::Ffi::Bind().RemainingArgs().RemainingRets().To(
      [](ffi::RemainingArgs a, ffi::RemainingRets r) { return handlers.Forward(a, r); }).release();
  return h->Call(frame);
}

// `needs`: which inputs JAX differentiates (Handlers::Backward); Export says so to to_jax (<name>_xla_needs).
template <typename T>
XLA_FFI_Error *BackwardEntry(XLA_FFI_CallFrame *frame) {
  static const Handlers handlers(EntryOfForward<T, decltype(&T::Forward)>::Get(), kXlaFfiHeader);
  static auto *h = ffi::Ffi::Bind().Attr<std::int64_t>("needs").RemainingArgs().RemainingRets().To(
      [](std::int64_t needs, ffi::RemainingArgs a, ffi::RemainingRets r) {
        return handlers.Backward(a, r, static_cast<std::uint64_t>(needs));
      }).release();
  return h->Call(frame);
}

template <typename T>
void Export(PyObject *module, const std::string &name) {
  AddCapsule(module, name + "_xla_fwd", &ForwardEntry<T>);
  AddCapsule(module, name + "_xla_bwd", &BackwardEntry<T>);
  if (PyObject_SetAttrString(module, (name + "_xla_needs").c_str(), Py_True) < 0) throw PythonError();
}

}  // namespace xla_ffi
}  // namespace detail
}  // namespace opbuilder
