// A module function (OB_MODULE's m.def of tensors in, tensors out) as a plain function pointer, so
// to_jax's generic XLA FFI handlers (src/jax_ffi.cpp) run the whole function in C++ on every call:
// the Function it picks is picked by the call's real values, as in eager. Not for operator authors.
//
// The handler calls FfiBoundEntry::run without Python (no GIL). While it runs, every Function<T>::Apply
// on that thread hands its call (detail/function_details.h FunctionCall) to the handler's runner
// instead of the runtime (autograd.h checks InFfiRun()), which runs Forward with a context it owns
// and, for a gradient, keeps what Backward needs (xla_ffi_handlers.h's tape).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "opbuilder/detail/binding.h"
#include "opbuilder/detail/gil_free_run.h"
#include "opbuilder/detail/visibility.h"
#include "opbuilder/tensor.h"  // with detail/tensor_details.h (OfferedBuffers)

namespace opbuilder {
namespace detail OB_HIDDEN {

struct FunctionCall;  // detail/function_details.h

// Bumped whenever FfiBoundEntry or FfiApplyRunner changes: a caller refuses an entry of another number.
constexpr std::uint64_t kFfiBoundAbi = 0x0b0ffb0000000004ull;

// What Apply hands its call to while a handler runs a bound function on this thread.
struct FfiApplyRunner {
  void *state;
  void (*run)(void *state, const FunctionCall &f, TensorPtr *single, TensorPtrList *list);
};

// Per module: how many threads run a bound function for XLA now (Apply reads the thread's runner only
// while one does), and this thread's runner.
inline std::atomic<int> &FfiBoundRuns() {
  static std::atomic<int> n{0};
  return n;
}
inline const FfiApplyRunner *&FfiRunner() {
  static thread_local const FfiApplyRunner *runner = nullptr;
  return runner;
}
inline const FfiApplyRunner *InFfiRun() {
  return FfiBoundRuns().load(std::memory_order_relaxed) != 0 ? FfiRunner() : nullptr;
}

struct FfiBoundEntry {
  std::uint64_t abi;  // kFfiBoundAbi
  std::size_t nargs;  // the function's arguments, every one a TensorPtr
  const void *fn;     // the bound callable
  const std::string *name;  // its name in the module, for messages
  // fn(in[0], ..., in[nargs - 1]) into *out, each Apply handed to `runner`, new host tensors of an offered
  // size built in `offer` (or null); `where` names the handler in messages. Throws what fn throws.
  void (*run)(const void *fn, const TensorPtr *in, TensorPtrList *out, const FfiApplyRunner *runner,
              const OfferedBuffers *offer, const char *where);
  // body(arg) on the same terms (the handler's Backward calls: an Apply inside a Backward goes to `runner`).
  void (*scoped)(void (*body)(void *), void *arg, const FfiApplyRunner *runner, const OfferedBuffers *offer,
                 const char *where);
};

// While alive: this thread's Applies in this module go to `runner`, its Offered() is `offer` (if any)
// and NoPythonHandler() is `where`. `trusted`: the code run is trusted with lent memory (a Backward),
// or not (the function's own body: a lent tensor it reads becomes a private copy).
class FfiBoundScope {
 public:
  FfiBoundScope(const FfiApplyRunner *runner, const OfferedBuffers *offer, const char *where, bool trusted)
      : lent_(trusted), runner_(FfiRunner()), offered_(Offered()), where_(NoPythonHandler()) {
    FfiBoundRuns().fetch_add(1, std::memory_order_relaxed);
    FfiRunner() = runner;
    Offered() = offer != nullptr ? *offer : OfferedBuffers{};
    NoPythonHandler() = where;
    ++GilFreeRun().depth;  // a GIL release in here does nothing, a check takes it (gil_wrap.h)
  }
  ~FfiBoundScope() {
    GilFreeRunState &run = GilFreeRun();
    if (--run.depth == 0 && run.taken) {  // a check took the GIL: given back as the run ends
      run.taken = false;
      PyGILState_Release(static_cast<PyGILState_STATE>(run.gil));
    }
    FfiRunner() = runner_;
    Offered() = offered_;
    NoPythonHandler() = where_;
    FfiBoundRuns().fetch_sub(1, std::memory_order_relaxed);
  }
  FfiBoundScope(const FfiBoundScope &) = delete;
  FfiBoundScope &operator=(const FfiBoundScope &) = delete;

 private:
  LentScope lent_;
  const FfiApplyRunner *runner_;
  OfferedBuffers offered_;
  const char *where_;
};

template <typename R>
TensorPtrList FfiResultList(R &&r) {
  using D = std::decay_t<R>;
  if constexpr (std::is_same_v<D, TensorPtr>) {
    return TensorPtrList{std::forward<R>(r)};
  } else if constexpr (std::is_same_v<D, TensorPtrList>) {
    return std::forward<R>(r);
  } else {  // a tuple or pair of TensorPtr
    return std::apply([](auto &&...t) { return TensorPtrList{std::forward<decltype(t)>(t)...}; },
                      std::forward<R>(r));
  }
}

// body(arg) in an FfiBoundScope (`trusted`: see there). One copy per module, out of line: each bound
// function's Run and the handler's Backward calls share it.
__attribute__((noinline)) inline void FfiScopedAs(bool trusted, void (*body)(void *), void *arg,
                                                  const FfiApplyRunner *runner, const OfferedBuffers *offer,
                                                  const char *where) {
  FfiBoundScope scope(runner, offer, where, trusted);
  body(arg);
}

template <typename F, typename Seq, typename R, typename... A>
struct FfiBoundOf;
template <typename F, std::size_t... I, typename R, typename... A>
struct FfiBoundOf<F, std::index_sequence<I...>, R, A...> {
  struct Call {
    const void *fn;
    const TensorPtr *in;
    TensorPtrList *out;
  };
  static void Body(void *p) {
    const Call &c = *static_cast<const Call *>(p);
    *c.out = FfiResultList((*const_cast<F *>(static_cast<const F *>(c.fn)))(c.in[I]...));
  }
  static void Run(const void *fn, const TensorPtr *in, TensorPtrList *out, const FfiApplyRunner *runner,
                  const OfferedBuffers *offer, const char *where) {
    Call c{fn, in, out};
    FfiScopedAs(false, &Body, &c, runner, offer, where);
  }
};

inline void FfiScoped(void (*body)(void *), void *arg, const FfiApplyRunner *runner, const OfferedBuffers *offer,
                      const char *where) {
  FfiScopedAs(true, body, arg, runner, offer, where);
}

// The entry of a bound callable `f` of R(A...) (kept for the process), or nullptr when an argument is
// not a TensorPtr (XLA passes buffers only) or there is none.
template <typename F, typename R, typename... A>
const FfiBoundEntry *MakeFfiBoundEntry(const F *f, const char *name) {
  if constexpr (sizeof...(A) > 0 && (std::is_same_v<std::decay_t<A>, TensorPtr> && ...)) {
    return new FfiBoundEntry{kFfiBoundAbi, sizeof...(A), f, new std::string(name),
                             &FfiBoundOf<F, std::index_sequence_for<A...>, R, A...>::Run, &FfiScoped};
  } else {
    (void)f;
    (void)name;
    return nullptr;
  }
}

}  // namespace detail
}  // namespace opbuilder
