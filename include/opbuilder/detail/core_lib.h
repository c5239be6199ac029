// Where the core's non-template functions are compiled: in each operator, or once.
//
// The headers only declare them, marked OB_CORE_FN; their bodies are sources in src/core/ (one
// file per header: src/core/tensor.cpp holds tensor.h's), outside include/.
//
// A nanobind operator built by the builder gets -DOB_CORE_TAG=<tag> (OB_CORE_SHARED is 1): it
// binds to the core library, libobcore, compiled once per toolchain and header contents from
// src/core/core_lib.cpp (built with OB_CORE_BUILD by opbuilder/native/core_lib.py), which the builder
// loads before the operator. The tag, a digest of the headers and these sources, is part of each
// such function's symbol name (abi_tag), so an operator built from other headers binds to its own
// core library, never another's.
//
// Every other build compiles the bodies itself, `inline`, as in any header-only library: pybind11
// operators, sanitizer builds, CUDA sources, aot libraries, code built outside the builder, and
// any build that defines OB_CORE_INLINE. Each header then includes its src/core/ file at its end
// (a path relative to the header: src/ sits beside include/, in a checkout and in the wheel).
//
//   tensor.h:           OB_CORE_FN int Work(int a);
//   src/core/tensor.cpp: OB_CORE_FN int Work(int a) { ... }
#pragma once

// A source that switches the C++ library to another ABI itself (`#define _GLIBCXX_DEBUG` before this
// header, an -include file, -Wp,-D...) cannot call the core library, compiled without it (its
// containers have other layouts): it compiles the core inline, as the builder asks for such flags.
#if defined(OB_CORE_TAG) && !defined(OB_CORE_BUILD) && !defined(OB_CORE_INLINE) && \
    (defined(_GLIBCXX_DEBUG) || defined(_GLIBCXX_PARALLEL) || defined(_LIBCPP_VERSION))
#define OB_CORE_INLINE 1
#endif

// gcc's dual ABI: a source that picks the other std::string and std::list than the core library was
// built with (`#define _GLIBCXX_USE_CXX11_ABI 0` before any include; the builder passes the core's
// choice as OB_CORE_CXX11_ABI) would call core functions by names the library does not define.
#if defined(OB_CORE_TAG) && !defined(OB_CORE_BUILD) && !defined(OB_CORE_INLINE) && defined(OB_CORE_CXX11_ABI)
#include <cstddef>  // the C++ library's configuration: _GLIBCXX_USE_CXX11_ABI as this source sets it
#if defined(_GLIBCXX_USE_CXX11_ABI) && _GLIBCXX_USE_CXX11_ABI != OB_CORE_CXX11_ABI
#define OB_CORE_INLINE 1
#endif
#endif

#if defined(OB_CORE_TAG) && !defined(OB_CORE_INLINE)
#define OB_CORE_STR_(x) #x
#define OB_CORE_STR(x) OB_CORE_STR_(x)
#define OB_CORE_FN __attribute__((visibility("default"), abi_tag(OB_CORE_STR(OB_CORE_TAG))))
// a variable of the core library: one definition (OB_CORE_BUILD), read by operators
#define OB_CORE_VAR __attribute__((visibility("default"), abi_tag(OB_CORE_STR(OB_CORE_TAG))))
#define OB_CORE_SHARED 1
#else
#define OB_CORE_FN inline
#define OB_CORE_SHARED 0
#endif

// Under `#pragma pack(push, n)` (or -fpack-struct) every struct of opbuilder, the binding library,
// Python and the C++ library would be laid out unlike their compiled code (nanobind's runtime,
// libpython, libstdc++, the core library): wrong values, std::bad_alloc, crashes. Said at compile time.
namespace opbuilder {
namespace detail {
struct PackProbe {
  char c;
  void *p;  // as aligned as the ABI aligns a pointer in a struct (then no padding is lost to packing)
};
static_assert(alignof(PackProbe) == alignof(void *) && sizeof(PackProbe) == 2 * sizeof(void *),
              "opbuilder's headers are included under #pragma pack (or built with -fpack-struct): their structs, "
              "and those of the binding library, Python and the C++ library, would be laid out unlike the "
              "compiled code they are passed to; include them before #pragma pack(push, n) and end the "
              "packed region with #pragma pack(pop)");
}  // namespace detail
}  // namespace opbuilder
