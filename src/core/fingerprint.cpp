// The core library's bodies of the functions opbuilder/detail/fingerprint.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/detail/fingerprint.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/detail/fingerprint.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

OB_CORE_FN std::uint64_t Fingerprint(const Tensor &t, double phase) {
  if (t.is_cuda()) return 0;  // device memory is not readable here: writes to device inputs are not detected
  const char *base = static_cast<const char *>(TensorAccess::Read(t));  // (a read: lent memory stays lent)
  const std::size_t nbytes = t.nbytes();
  const std::int64_t n = t.numel();
  const auto es = t.element_size();
  std::uint64_t h = static_cast<std::uint64_t>(n);
  if (n == 0) return h;
  if (t.is_contiguous()) {
    if (nbytes <= FullFingerprintBytes()) return HashBytes(base, nbytes, h);
    const std::size_t span = nbytes / static_cast<std::size_t>(kFingerprintChunks);  // >= 64
    const char *first = base + static_cast<std::size_t>(phase * static_cast<double>(span - 64));
    // Ask for every chunk first: the misses then overlap instead of queueing.
    for (std::int64_t c = 0; c < kFingerprintChunks; ++c) Prefetch(first + static_cast<std::size_t>(c) * span);
    std::uint64_t l[4] = {h, h + 1, h + 2, h + 3};
    for (std::int64_t c = 0; c < kFingerprintChunks; ++c) {
      const char *p = first + static_cast<std::size_t>(c) * span;
      for (int k = 0; k < 8; ++k) l[k & 3] = FpStep(l[k & 3], LoadBytes(p + 8 * k, 8));
    }
    return FpStep(FpStep(FpStep(l[0], l[1]), l[2]), l[3]);
  }
  const ShapeVector strides = t.strides();
  if (nbytes <= FullFingerprintBytes()) {
    for (std::int64_t i = 0; i < n; ++i) h = FpStep(h, LoadBytes(base + StridedOffset(t, strides, i), es));
    return h;
  }
  const std::int64_t step = n / kFingerprintSamples;  // >= 1
  const auto first = static_cast<std::int64_t>(phase * static_cast<double>(step));
  std::int64_t offsets[kFingerprintSamples];
  for (std::int64_t k = 0; k < kFingerprintSamples; ++k) {
    offsets[k] = StridedOffset(t, strides, first + k * step);
    Prefetch(base + offsets[k]);
  }
  for (std::int64_t k = 0; k < kFingerprintSamples; ++k) h = FpStep(h, LoadBytes(base + offsets[k], es));
  return h;
}

}  // namespace detail
}  // namespace opbuilder
