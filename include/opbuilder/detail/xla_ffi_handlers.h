// The XLA FFI handlers of a Function<T> (xla_ffi.h's OB_XLA_FFI exports them): XLA's buffers as
// Tensors, the scratch copies, the forward and backward handlers and their entry points. What they
// do, and the rules they keep, is said at the top of xla_ffi.h. Not for operator authors. Included by
// xla_ffi.h, which checks that XLA's FFI headers are there.
#pragma once

#include <Python.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "opbuilder/autograd.h"
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

inline ShapeVector ShapeOf(ffi::Span<const std::int64_t> dims) { return ShapeVector(dims.begin(), dims.end()); }

// An XLA buffer as a contiguous Tensor over its memory (XLA owns the memory and outlives the call).
inline TensorPtr Wrap(const ffi::AnyBuffer &b, bool writable, const char *what, std::size_t k) {
  const DataType dt = FromXla(b.element_type());
  if (dt == kTypeUnknown) {
    throw detail::TypeError(std::string(what) + " " + std::to_string(k) + " has an XLA element type opbuilder has no "
                            "tensor of (code " + std::to_string(static_cast<int>(b.element_type())) + ")");
  }
  return std::make_shared<Tensor>(dt, ShapeOf(b.dimensions()), ShapeVector{}, b.untyped_data(),
                                  std::shared_ptr<void>(), writable);
}

// A private writable copy of `src` (contiguous) in a block this thread reuses from call to call: a
// fresh block each call faults in its pages every time (measured: 1M float64 mul 4.4 ms -> 2.2 ms,
// against 1.0 ms with no copy). A block is reused once no tensor holds it (a handler's tensors die
// with the call); at most kScratchBlocks of up to kScratchBytes are kept per thread.
// With `writable` false the copy is marked read-only (it stands for XLA's read-only buffer).
inline TensorPtr ScratchCopy(const Tensor &src, bool writable = true) {
  constexpr std::size_t kScratchBlocks = 8;
  constexpr std::size_t kScratchBytes = std::size_t{64} << 20;
  if (src.nbytes() > kScratchBytes) {
    TensorPtr c = src.contiguous_copy();
    if (writable) return c;
    return std::make_shared<Tensor>(c->dtype(), c->shape(), ShapeVector{}, c->data_ptr(),
                                    std::shared_ptr<void>(c, c->data_ptr()), false);
  }
  struct Block {
    std::shared_ptr<void> data;
    std::size_t nbytes;
  };
  thread_local std::vector<Block> blocks;
  const std::size_t n = src.nbytes();
  Block *use = nullptr;
  for (auto &b : blocks) {
    if (b.data.use_count() == 1 && b.nbytes >= n && (use == nullptr || b.nbytes < use->nbytes)) use = &b;
  }
  if (use == nullptr) {
    if (blocks.size() >= kScratchBlocks) {  // drop the smallest free block, if any
      auto drop = blocks.end();
      for (auto it = blocks.begin(); it != blocks.end(); ++it) {
        if (it->data.use_count() == 1 && (drop == blocks.end() || it->nbytes < drop->nbytes)) drop = it;
      }
      if (drop != blocks.end()) blocks.erase(drop);
    }
    std::shared_ptr<void> data = AllocateStorage(n == 0 ? 1 : n);
    if (blocks.size() >= kScratchBlocks) {
      auto t = std::make_shared<Tensor>(src.dtype(), src.shape(), ShapeVector{}, data.get(), data, writable);
      if (n != 0) std::memcpy(t->data_ptr(), src.data_ptr(), n);
      return t;
    }
    blocks.push_back(Block{std::move(data), n});
    use = &blocks.back();
  }
  auto t = std::make_shared<Tensor>(src.dtype(), src.shape(), ShapeVector{}, use->data.get(), use->data, writable);
  if (n != 0) std::memcpy(t->data_ptr(), src.data_ptr(), n);
  return t;
}

// How Forward (or Backward) gets XLA's buffer: a private writable copy (Forward's inputs, unless a
// kAcceptsViews type is known to write nothing), a read-only Tensor over XLA's memory (kAcceptsViews, a
// type known to write nothing), or a private copy marked read-only (the cotangents Backward takes as
// views, while it may write them: the write lands in the copy).
enum class InputMode { kCopy, kView, kReadOnlyCopy };

// What Forward (or Backward) gets for XLA's input buffer `b`, as `mode` says. Never XLA's memory writable.
inline TensorPtr Input(const ffi::AnyBuffer &b, InputMode mode, const char *what, std::size_t k) {
  TensorPtr t = Wrap(b, false, what, k);
  if (mode == InputMode::kView) return t;
  return ScratchCopy(*t, mode == InputMode::kCopy);
}

// While alive, saved_data (Python objects) refuses to be used on this thread (binding.h).
class NoPythonHere {
 public:
  NoPythonHere() : saved_(NoPythonHandler()) { NoPythonHandler() = "an XLA FFI handler (opbuilder/xla_ffi.h)"; }
  ~NoPythonHere() { NoPythonHandler() = saved_; }
  NoPythonHere(const NoPythonHere &) = delete;
  NoPythonHere &operator=(const NoPythonHere &) = delete;

 private:
  const char *saved_;
};

// XLA's result buffers as Tensors, in order.
inline TensorPtrList ResultTensors(ffi::RemainingRets &rets) {
  TensorPtrList out;
  for (std::size_t j = 0; j < rets.size(); ++j) {
    auto r = rets.get<ffi::AnyBuffer>(j);
    if (!r.has_value()) throw std::runtime_error("result " + std::to_string(j) + ": " + r.error().message());
    out.push_back(Wrap(**r, true, "result", j));
  }
  return out;
}

// While alive, new host Tensors of a result buffer's size are built in that buffer (detail/tensor_details.h's
// OfferedBuffers): Forward's outputs usually land in place. 64-byte aligned buffers only, as malloc'd
// tensors are.
class OfferResults {
 public:
  explicit OfferResults(const TensorPtrList &dst) : saved_(Offered()) {
    for (const auto &t : dst) {
      const auto addr = reinterpret_cast<std::uintptr_t>(t->data_ptr());
      if (t->nbytes() == 0 || addr % 64 != 0) continue;
      data_.push_back(t->data_ptr());
      nbytes_.push_back(t->nbytes());
    }
    taken_.reset(new bool[data_.size() + 1]());
    Offered() = OfferedBuffers{data_.data(), nbytes_.data(), taken_.get(), data_.size()};
  }
  ~OfferResults() { Offered() = saved_; }
  OfferResults(const OfferResults &) = delete;
  OfferResults &operator=(const OfferResults &) = delete;

 private:
  OfferedBuffers saved_;
  std::vector<void *> data_;
  std::vector<std::size_t> nbytes_;
  std::unique_ptr<bool[]> taken_;
};

inline bool Within(const Tensor &t, const Tensor &buffer) {
  const char *p = static_cast<const char *>(t.data_ptr()), *b = static_cast<const char *>(buffer.data_ptr());
  return p >= b && p < b + buffer.nbytes();
}

// Writes `outs` (null: zeros) into XLA's result buffers `dst`, checking shapes and dtypes. An output
// already in its own buffer stays; one inside another result buffer is copied aside first, so no
// write clobbers an output not yet copied.
inline void CopyOut(TensorPtrList outs, const TensorPtrList &dst, const std::string &name) {
  for (std::size_t j = 0; j < outs.size(); ++j) {
    const TensorPtr &t = outs[j];
    if (t && (t->dtype() != dst[j]->dtype() || t->shape() != dst[j]->shape())) {
      throw std::runtime_error(name + ": output " + std::to_string(j) + " has shape " + ShapeString(t->shape()) +
                               " and dtype " + DataTypeName(t->dtype()) + ", but XLA expects shape " +
                               ShapeString(dst[j]->shape()) + " and dtype " + DataTypeName(dst[j]->dtype()) +
                               " (from InferShape or to_jax's shape_fn)");
    }
  }
  for (std::size_t j = 0; j < outs.size(); ++j) {
    if (!outs[j] || outs[j]->nbytes() == 0) continue;
    for (std::size_t k = 0; k < dst.size(); ++k) {
      const bool in_place = k == j && outs[j]->data_ptr() == dst[j]->data_ptr() && outs[j]->is_contiguous();
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
    } else if (t->data_ptr() == dst[j]->data_ptr() || t->nbytes() == 0) {
      continue;  // built in place
    } else if (t->is_contiguous()) {
      std::memcpy(dst[j]->data_ptr(), t->data_ptr(), dst[j]->nbytes());
    } else {
      dst[j]->copy_from(*t);
    }
  }
}

template <typename A>
constexpr bool kIsTensorArg = std::is_same_v<std::decay_t<A>, TensorPtr>;

template <typename T, typename F>
struct Handlers;

template <typename T, typename R, typename... A>
struct Handlers<T, R (*)(AutogradContext *, A...)> {
  static_assert((kIsTensorArg<A> && ...),
                "OB_XLA_FFI(m, name, T): every argument of T::Forward after ctx must be a TensorPtr (XLA passes "
                "buffers only)");
  static constexpr std::size_t kN = sizeof...(A);
  static constexpr bool kViews = AcceptsViews<T>::value;
  using Inputs = std::array<TensorPtr, kN>;
  // XLA's memory of each input a kAcceptsViews Forward got as a private copy, else null.
  using Kept = std::array<const void *, kN + 1>;

  // What T's recorded calls showed of writes into its arguments: the runtime's knowledge
  // (Function<T>::Writes, call_rules.h), which the backward handler's rerun of Forward (it records:
  // ctx->NeedsInputGrad is set) reads and adds to.
  static WriteState *Writes() { return T::Writes(); }
  // The same for the forward handler's calls, kept apart: they record nothing (NeedsInputGrad false),
  // and a Forward may write only when it records, so a call that wrote nothing here says nothing of
  // the rerun (and the other way round).
  static WriteState *ForwardWrites() {
    static WriteState state{kWritesUnknown};
    return &state;
  }
  // What T::Backward's calls showed of writes into the output cotangents it is given (XLA's buffers,
  // which may be shared with the rest of the computation, a constant even): read-only private copies
  // until a call left them as they were, XLA's memory after that; a write keeps copies from then on.
  static WriteState *CotangentWrites() {
    static WriteState state{kWritesUnknown};
    return &state;
  }
  // A call wrote an argument (MarkDirty, or a write found without it): every call of T keeps copies.
  static void NoteWritten() {
    NoteWrites(Writes());
    NoteWrites(ForwardWrites());
  }

  // The inputs as Forward gets them. An input XLA aliased to a result buffer (to_jax's `mutates`:
  // input_output_aliases) is that buffer, writable and not copied; `aliased` marks the result buffers
  // so used, which are then not offered to new tensors. Any other input is a private writable copy
  // (decided before Forward runs, so no write, MarkDirty'd or not, reaches XLA's buffer), except that
  // with kAcceptsViews a type known to write nothing gets XLA's memory read-only; `kept` records
  // XLA's memory of each copy a kAcceptsViews type got. `known` is what the handler's calls showed
  // (ForwardWrites, or Writes for the rerun); a write seen anywhere keeps copies everywhere.
  static Inputs ReadInputs(const ffi::RemainingArgs &args, const TensorPtrList &dst, std::vector<bool> &aliased,
                           Kept &kept, const WriteState *known) {
    const bool keep = KeepsArguments(known) || Writes()->load(std::memory_order_relaxed) == kWritesArgs;
    const InputMode mode = !kViews || keep ? InputMode::kCopy : InputMode::kView;
    Inputs in;
    for (std::size_t i = 0; i < kN; ++i) {
      auto b = args.get<ffi::AnyBuffer>(i);
      if (!b.has_value()) throw std::runtime_error("argument " + std::to_string(i) + ": " + b.error().message());
      const std::size_t j = AliasOf(*b, dst);
      if (j != kNone) {
        in[i] = Wrap(*b, true, "argument", i);
        aliased[j] = true;
      } else {
        in[i] = Input(*b, mode, "argument", i);
        if (kViews && mode == InputMode::kCopy) kept[i] = b->untyped_data();
      }
    }
    return in;
  }

  // After Forward ran without a refusal: whether a kAcceptsViews Forward wrote a private copy it was
  // given (MarkDirty'd or not; the copy is then discarded, or copied out as an output). What the call showed
  // goes to T's knowledge: a write keeps copies from now on; a call that wrote nothing (no MarkDirty,
  // every copy as XLA gave it) lets later calls of its handler (`known`) take XLA's memory itself.
  static bool WroteCopies(const ContextState &st, const Inputs &in, const Kept &kept, WriteState *known) {
    if constexpr (kViews) {
      bool any = false, wrote = false;
      for (std::size_t i = 0; i < kN; ++i) {
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
    } else {
      (void)st, (void)in, (void)kept, (void)known;
      return false;
    }
  }

  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  // The result buffer XLA placed input `b` in (declared aliasing), or kNone.
  static std::size_t AliasOf(const ffi::AnyBuffer &b, const TensorPtrList &dst) {
    if (b.size_bytes() == 0) return kNone;
    for (std::size_t j = 0; j < dst.size(); ++j) {
      if (dst[j]->data_ptr() == b.untyped_data()) return j;
    }
    return kNone;
  }

  // Thrown when Forward marked dirty XLA's read-only buffer (a kAcceptsViews type known to write
  // nothing that wrote after all): the handler runs Forward again on private copies, which the type
  // gets from now on, so the call has the answer every other call (and the callback path) has.
  struct RetryWithCopies {
    int arg;
  };

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
  static void CheckDirty(const ContextState &st, const TensorPtrList &outs) {
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
  // Backward will be asked for.
  template <std::size_t... I>
  static TensorPtrList RunForward(AutogradContext &ctx, const Inputs &in, std::array<Tensor *, kN + 1> &raw,
                                  std::index_sequence<I...>) {
    ContextState &st = State(ctx);
    st.name = &FunctionName<T>();
    for (std::size_t i = 0; i < kN; ++i) raw[i] = in[i].get();
    st.args = raw.data();
    st.nargs = kN;
    NoPythonHere no_python;
    TensorPtrList outs = AsList(T::Forward(&ctx, in[I]...));
    CheckDirty(st, outs);
    return outs;
  }

  static ffi::Error Fail(const char *stage, const char *what) {
    return ffi::Error::Internal(FunctionName<T>() + " (XLA FFI " + stage + "): " + what);
  }

  static ffi::Error Forward(ffi::RemainingArgs args, ffi::RemainingRets rets) {
    try {
      if (args.size() != kN) throw std::runtime_error("expects " + std::to_string(kN) + " arguments, got " +
                                                      std::to_string(args.size()));
      const TensorPtrList dst = ResultTensors(rets);
      TensorPtrList outs;
      for (int attempt = 0;; ++attempt) {  // a second run only after RetryWithCopies
        std::vector<bool> aliased(dst.size(), false);
        Kept kept{};
        const Inputs in = ReadInputs(args, dst, aliased, kept, ForwardWrites());
        TensorPtrList offered;  // a result buffer holding an input is not free for new tensors
        for (std::size_t j = 0; j < dst.size(); ++j) {
          if (!aliased[j]) offered.push_back(dst[j]);
        }
        try {
          AutogradContext ctx;  // dies (with what Forward saved) before the outputs are copied
          std::array<Tensor *, kN + 1> raw{};
          OfferResults offer(offered);
          outs = RunForward(ctx, in, raw, std::index_sequence_for<A...>{});
          WroteCopies(State(ctx), in, kept, ForwardWrites());  // a write without MarkDirty landed in a copy
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
      CopyOut(std::move(outs), dst, FunctionName<T>());
      return ffi::Error::Success();
    } catch (const std::exception &e) {
      return Fail("forward", e.what());
    } catch (...) {
      return Fail("forward", "an exception that is not a std::exception");
    }
  }

  // Arguments: Forward's inputs, then one cotangent per output. Results: one gradient per input, then
  // one scratch buffer per input declared written (to_jax's mutates), aliased to it: XLA copies the
  // input there, and the rerun Forward writes that copy.
  static ffi::Error Backward(ffi::RemainingArgs args, ffi::RemainingRets rets) {
    try {
      if (args.size() <= kN || rets.size() < kN || rets.size() > 2 * kN) {
        throw std::runtime_error("expects the " + std::to_string(kN) + " inputs, the output cotangents and " +
                                 std::to_string(kN) + " results (and a buffer per written input)");
      }
      const TensorPtrList all = ResultTensors(rets);
      TensorPtrList dst = all;
      dst.resize(kN);  // the gradients' buffers
      std::unique_ptr<AutogradContext> ctx_owner;
      Inputs in;
      TensorPtrList outs;
      std::array<Tensor *, kN + 1> raw{};
      std::array<std::uint64_t, kN + 1> prints{};
      double phase = 0;
      for (int attempt = 0;; ++attempt) {  // a second run only after RetryWithCopies
        std::vector<bool> aliased(all.size(), false);
        Kept kept{};
        in = ReadInputs(args, all, aliased, kept, Writes());
        ctx_owner = std::make_unique<AutogradContext>();
        ContextState &st = State(*ctx_owner);
        st.needs.assign(kN, false);
        for (std::size_t i = 0; i < kN; ++i) st.needs[i] = ::opbuilder::IsDifferentiable(in[i]->dtype());
        // the gradient route records, so (as the runtime does when it records) a write to an input
        // without MarkDirty is an error, with the runtime's message
        phase = NextFingerprintPhase();
        for (std::size_t i = 0; i < kN; ++i) prints[i] = Fingerprint(*in[i], phase);
        try {
          outs = RunForward(*ctx_owner, in, raw, std::index_sequence_for<A...>{});
          WroteCopies(st, in, kept, Writes());
          break;
        } catch (const RetryWithCopies &r) {
          State(*ctx_owner).args = nullptr;
          if (attempt > 0) RefuseReadOnlyDirty(r.arg);
        }
      }
      AutogradContext &ctx = *ctx_owner;
      ContextState &st = State(ctx);
      for (std::size_t i = 0; i < kN; ++i) {
        if (!st.IsDirty(in[i].get()) && Fingerprint(*in[i], phase) != prints[i]) {
          NoteWritten();
          throw std::runtime_error(FunctionName<T>() + "::Forward modified argument " + std::to_string(i) +
                                   " in place without MarkDirty; mark it (ctx->MarkDirty({tensor})) and return "
                                   "it, or write the result to a new tensor");
        }
      }
      st.args = nullptr;
      if (args.size() - kN != outs.size()) {
        throw std::runtime_error("Forward returned " + std::to_string(outs.size()) + " tensors, but got " +
                                 std::to_string(args.size() - kN) + " cotangents");
      }
      const InputMode ct_mode = !kViews                            ? InputMode::kCopy
                                : KeepsArguments(CotangentWrites()) ? InputMode::kReadOnlyCopy
                                                                    : InputMode::kView;
      TensorPtrList grads, ct_copies;
      std::vector<const void *> ct_kept;
      for (std::size_t j = 0; j < outs.size(); ++j) {
        auto b = args.get<ffi::AnyBuffer>(kN + j);
        if (!b.has_value()) throw std::runtime_error("cotangent " + std::to_string(j) + ": " + b.error().message());
        grads.push_back(Input(*b, ct_mode, "cotangent", j));
        if (ct_mode == InputMode::kReadOnlyCopy && grads.back()->nbytes() != 0 && b->untyped_data() != nullptr) {
          ct_copies.push_back(grads.back());
          ct_kept.push_back(b->untyped_data());
        }
      }
      TensorPtrList g;
      {
        OfferResults offer(dst);
        NoPythonHere no_python;
        g = T::Backward(&ctx, std::move(grads));
      }
      if (!ct_copies.empty()) {  // what Backward did to the copies tells later calls whether they need one
        bool wrote = false;
        for (std::size_t j = 0; j < ct_copies.size(); ++j) {
          wrote = wrote || std::memcmp(ct_copies[j]->data_ptr(), ct_kept[j], ct_copies[j]->nbytes()) != 0;
        }
        if (wrote) {
          NoteWrites(CotangentWrites());
        } else {
          NoteReadOnlyCall(CotangentWrites());
        }
      }
      if (g.size() != kN) {
        throw std::runtime_error("Backward returned " + std::to_string(g.size()) + " gradients for " +
                                 std::to_string(kN) + " arguments");
      }
      for (std::size_t i = 0; i < kN; ++i) {
        if (!st.needs[i]) g[i] = nullptr;
      }
      CopyOut(std::move(g), dst, FunctionName<T>());
      return ffi::Error::Success();
    } catch (const std::exception &e) {
      return Fail("backward", e.what());
    } catch (...) {
      return Fail("backward", "an exception that is not a std::exception");
    }
  }
};

template <typename T>
using HandlersOf = Handlers<T, decltype(&T::Forward)>;

template <typename T>
XLA_FFI_Error *ForwardEntry(XLA_FFI_CallFrame *frame) {
  static auto *h =
      ffi::Ffi::Bind().RemainingArgs().RemainingRets().To(&HandlersOf<T>::Forward).release();
  return h->Call(frame);
}

template <typename T>
XLA_FFI_Error *BackwardEntry(XLA_FFI_CallFrame *frame) {
  static auto *h =
      ffi::Ffi::Bind().RemainingArgs().RemainingRets().To(&HandlersOf<T>::Backward).release();
  return h->Call(frame);
}

// Adds `fn` to `module` as the PyCapsule attribute `attr` (what jax.ffi.register_ffi_target takes).
inline void AddCapsule(PyObject *module, const std::string &attr, XLA_FFI_Error *(*fn)(XLA_FFI_CallFrame *)) {
  PyRef cap = PyRef::Steal(Check(PyCapsule_New(reinterpret_cast<void *>(fn), nullptr, nullptr)));
  if (PyObject_SetAttrString(module, attr.c_str(), cap.get()) < 0) throw PythonError();
}

template <typename T>
void Export(PyObject *module, const std::string &name) {
  AddCapsule(module, name + "_xla_fwd", &ForwardEntry<T>);
  AddCapsule(module, name + "_xla_bwd", &BackwardEntry<T>);
}

}  // namespace xla_ffi
}  // namespace detail
}  // namespace opbuilder
