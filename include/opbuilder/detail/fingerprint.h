// Content fingerprints of tensors: how Function<T>::Apply notices a Forward
// that wrote into an input without MarkDirty (C++ writes memory directly, so
// no version counter can see it).
//
// Taken only when the call records a node, before and after Forward, for
// every tensor argument.
//  * Buffers of up to kFullFingerprintBytes: every byte takes part. Each step
//    of the hash is a bijection of its state, so any change confined to one
//    8-byte word always changes the fingerprint; other changes are missed
//    with probability about 2^-64.
//  * Larger contiguous buffers: kFingerprintChunks chunks of 64 bytes, evenly
//    spaced with a random phase per call. A Forward that rewrites the whole
//    input (the usual in-place kernel) is always caught; one that changes a
//    fraction f of it, spread out, is caught with probability about
//    1 - (1 - f)^(elements read); a change to a few isolated elements may be
//    missed.
//  * Larger strided buffers: kFingerprintSamples single elements, likewise.
// With OPBUILDER_CHECK_WRITES=full in the environment (read once per process)
// every byte of every buffer takes part: exact, at a full pass over each input
// before and after Forward (for debugging; the default costs well under a us).
// Never caught: writes that leave the bytes as they were, writes to memory
// that is not a tensor argument (a tensor inside a TensorPtrList argument),
// and writes after Forward returns.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

constexpr std::size_t kFullFingerprintBytes = 4096;
constexpr std::int64_t kFingerprintChunks = 64;  // of 64 bytes each
constexpr std::int64_t kFingerprintSamples = 256;

// Buffers of up to this many bytes are hashed whole (all of them with OPBUILDER_CHECK_WRITES=full).
inline std::size_t FullFingerprintBytes() {
  static const std::size_t limit = [] {
    const char *v = std::getenv("OPBUILDER_CHECK_WRITES");
    return v != nullptr && std::strcmp(v, "full") == 0 ? static_cast<std::size_t>(-1) : kFullFingerprintBytes;
  }();
  return limit;
}

// One step of the hash: bijective in h for a fixed v and in v for a fixed h.
inline std::uint64_t FpStep(std::uint64_t h, std::uint64_t v) {
  h ^= v;
  h = (h << 29) | (h >> 35);
  return h * 0x9E3779B97F4A7C15ULL;
}

inline std::uint64_t LoadBytes(const char *p, std::size_t n) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, n);
  return v;
}

inline void Prefetch(const char *p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p);
#else
  (void)p;
#endif
}

// Every byte of [p, p + n), in four independent lanes (for speed).
inline std::uint64_t HashBytes(const char *p, std::size_t n, std::uint64_t h) {
  std::uint64_t l[4] = {h, h + 1, h + 2, h + 3};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) l[k] = FpStep(l[k], LoadBytes(p + i + 8 * k, 8));
  }
  for (; i + 8 <= n; i += 8) l[0] = FpStep(l[0], LoadBytes(p + i, 8));
  if (i < n) l[1] = FpStep(l[1], LoadBytes(p + i, n - i));
  return FpStep(FpStep(FpStep(l[0], l[1]), l[2]), l[3]);
}

// Byte offset of element `flat` (row-major order) of a strided tensor.
inline std::int64_t StridedOffset(const Tensor &t, const ShapeVector &strides, std::int64_t flat) {
  std::int64_t off = 0;
  const ShapeVector &shape = t.shape();
  for (std::size_t d = shape.size(); d-- > 0;) {
    off += (flat % shape[d]) * strides[d];
    flat /= shape[d];
  }
  return off * static_cast<std::int64_t>(t.element_size());
}

// The fingerprint of `t`'s contents; `phase` in [0, 1) places the samples of
// large buffers and must be the same for the two calls that are compared.
OB_CORE_FN std::uint64_t Fingerprint(const Tensor &t, double phase);

// A new phase per call (a per-thread xorshift), so repeated calls look at different bytes.
inline double NextFingerprintPhase() {
  thread_local std::uint64_t s = 0x2545F4914F6CDD1DULL ^ reinterpret_cast<std::uintptr_t>(&s);
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return static_cast<double>(s >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace detail
}  // namespace opbuilder

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#if __has_include("../../../src/core/fingerprint.cpp")
#include "../../../src/core/fingerprint.cpp"
#else  // a copy of these headers (vendored): the installed ones' sources, found from the include path
#include "../src/core/fingerprint.cpp"
#endif
#endif
