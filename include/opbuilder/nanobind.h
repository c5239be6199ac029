// The nanobind binding layer: casters for TensorPtr, TensorPtrList and
// std::optional<TensorPtr> over the binding-neutral bridge, what the core asks
// of a binding (detail/binding.h), and OB_MODULE.
//
//   OB_MODULE(m) { m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { ... }); }
//
// nanobind's runtime (libnanobind) is built once per toolchain by the builder
// and loaded before the module; this header only declares what it exports.
//
// A conversion that fails for a reason worth reading (an unsupported dtype, a
// Python error) is kept by the caster and raised when the function is called,
// with its own type and message, as the pybind11 layer does: nanobind's
// from_python cannot throw, and a plain `false` would only say "incompatible
// function arguments".
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdio>
#include <exception>
#include <optional>
#include <typeinfo>
#include <utility>

#include "opbuilder/detail/binding.h"
#include "opbuilder/detail/bound_call.h"
#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// The core's exceptions as Python errors, for every nanobind function (nanobind keeps one
// list of translators per process; each module adds its own, once).
inline void RegisterNanobindTranslator() {
  static const bool done = (nanobind::register_exception_translator(TranslateNeutral), true);
  (void)done;
}

template <typename Dep>
struct Binding {
  template <typename V>
  static PyObject *ToPython(V &&v) {
    return nanobind::cast(std::forward<V>(v)).release().ptr();
  }
  template <typename T>
  static T FromPython(PyObject *o) {
    return nanobind::cast<T>(nanobind::handle(o));
  }
  static bool IsCastError(const std::exception &e) { return dynamic_cast<const std::bad_cast *>(&e) != nullptr; }
  static void SetErrorFromCurrentException() {
    try {
      throw;
    } catch (nanobind::python_error &e) {
      e.restore();
    } catch (const nanobind::builtin_exception &e) {
      PyErr_SetString(e.type() == nanobind::exception_type::type_error    ? PyExc_TypeError
                      : e.type() == nanobind::exception_type::value_error ? PyExc_ValueError
                      : e.type() == nanobind::exception_type::index_error ? PyExc_IndexError
                      : e.type() == nanobind::exception_type::key_error   ? PyExc_KeyError
                                                                         : PyExc_RuntimeError,
                      e.what());
    } catch (...) {
      SetNeutralOrStdError();
    }
  }
};

// The nanobind domain of this module (NB_DOMAIN_STR below): a name no other module has, so that the
// C++ classes it binds are registered in a type registry of its own. Two operators that each bind a
// `class Acc` of their own then both import, and neither's functions accept the other's objects
// (with one shared registry the second `Acc` was dropped with a warning and each module's functions
// took the other's objects, reading them with the wrong layout). Hidden, so one copy per module
// library: its address names it (extension modules are never unloaded, so never reused).
inline const char *ModuleDomain() noexcept {
  static char name[48] = {};
  if (name[0] == '\0') std::snprintf(name, sizeof name, "opbuilder_%p", static_cast<void *>(name));
  return name;
}

// A conversion's result, or the exception it threw (raised when the value is taken).
template <typename V>
struct Deferred {
  V value{};
  std::exception_ptr error;
  V &get() {
    if (error) std::rethrow_exception(error);
    return value;
  }
  // A tensor from `o` into `out`: false if `o` is no tensor; a throwing conversion is kept.
  bool Load(PyObject *o, TensorPtr &out) noexcept {
    try {
      RegisterNanobindTranslator();
    } catch (...) {
      error = std::current_exception();
      return true;
    }
    return LoadTensor(o, out, error);
  }
};

// from_cpp's error path: the Python error set, a null handle returned.
inline PyObject *ToObjectOrNull(const TensorPtr &t) noexcept {
  try {
    RegisterNanobindTranslator();
    return TensorToObject(t);
  } catch (...) {
    SetNeutralOrStdError();
    return nullptr;
  }
}

}  // namespace detail
}  // namespace opbuilder

namespace nanobind {
namespace detail {

#define OB_NB_CASTER_COMMON(V, descr)                                      \
  using Value = V;                                                         \
  static constexpr auto Name = descr;                                      \
  template <typename T_>                                                   \
  using Cast = movable_cast_t<T_>;                                         \
  template <typename T_>                                                   \
  static constexpr bool can_cast() {                                       \
    return true;                                                           \
  }                                                                        \
  explicit operator Value *() { return &d.get(); }                         \
  explicit operator Value &() { return d.get(); }                          \
  explicit operator Value &&() { return std::move(d.get()); }              \
  ::opbuilder::detail::Deferred<Value> d;

template <>
struct type_caster<opbuilder::TensorPtr> {
  OB_NB_CASTER_COMMON(opbuilder::TensorPtr, const_name("runtime.Tensor"))
  bool from_python(handle src, uint8_t, cleanup_list *) noexcept { return d.Load(src.ptr(), d.value); }
  static handle from_cpp(const opbuilder::TensorPtr &t, rv_policy, cleanup_list *) noexcept {
    return opbuilder::detail::ToObjectOrNull(t);
  }
};

template <>
struct type_caster<std::optional<opbuilder::TensorPtr>> {
  OB_NB_CASTER_COMMON(std::optional<opbuilder::TensorPtr>, const_name("runtime.Tensor | None"))
  bool from_python(handle src, uint8_t, cleanup_list *) noexcept {
    if (src.is_none()) {
      d.value.reset();
      return true;
    }
    opbuilder::TensorPtr t;
    if (!d.Load(src.ptr(), t)) return false;
    d.value = std::move(t);
    return true;
  }
  static handle from_cpp(const std::optional<opbuilder::TensorPtr> &t, rv_policy, cleanup_list *) noexcept {
    if (!t) return none().release();
    return opbuilder::detail::ToObjectOrNull(*t);
  }
};

template <>
struct type_caster<opbuilder::TensorPtrList> {
  OB_NB_CASTER_COMMON(opbuilder::TensorPtrList, const_name("list[runtime.Tensor]"))
  bool from_python(handle src, uint8_t, cleanup_list *) noexcept {
    PyObject *o = src.ptr();
    if (!PyList_Check(o) && !PyTuple_Check(o)) return false;
    PyObject *seq = PySequence_Fast(o, "");  // a list or tuple: cannot fail
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const opbuilder::detail::FastItems items(seq);
    bool ok = true;
    d.value.clear();
    d.value.reserve(static_cast<std::size_t>(n));
    for (Py_ssize_t i = 0; i < n && ok && !d.error; ++i) {
      opbuilder::TensorPtr t;
      ok = d.Load(items[i], t);
      d.value.push_back(std::move(t));
    }
    Py_DECREF(seq);
    return ok;
  }
  static handle from_cpp(const opbuilder::TensorPtrList &ts, rv_policy, cleanup_list *) noexcept {
    PyObject *list = PyList_New(static_cast<Py_ssize_t>(ts.size()));
    if (list == nullptr) return handle();
    for (std::size_t i = 0; i < ts.size(); ++i) {
      PyObject *o = opbuilder::detail::ToObjectOrNull(ts[i]);
      if (o == nullptr) {
        Py_DECREF(list);
        return handle();
      }
      PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), o);
    }
    return list;
  }
};

#undef OB_NB_CASTER_COMMON

}  // namespace detail
}  // namespace nanobind

// Each module its own nanobind domain (ModuleDomain), unless the source asks for a shared one by
// defining NB_DOMAIN before including this header (then modules of that domain share their classes).
#if !defined(NB_DOMAIN)
#undef NB_DOMAIN_STR
#define NB_DOMAIN_STR ::opbuilder::detail::ModuleDomain()
#endif

namespace opbuilder {
namespace detail OB_HIDDEN {
using ObModule = TracedModule<::nanobind::module_>;
template <>
struct IsKeywordOnly<::nanobind::kw_only> : std::true_type {};
}  // namespace detail
// The module OB_MODULE and NB_MODULE hand their body (by value, as NB_MODULE's own): a helper in another
// source that binds functions takes one, so jit records them whole (docs/reference/jit.md).
using ObModule = detail::ObModule;
}  // namespace opbuilder

// A module bound with nanobind, by OB_MODULE (the builder names it: OB_EXTENSION_NAME) or by NB_MODULE:
// its `m` is an ObModule, whose def() binds each function so that runtime.jit records the whole call
// (detail/bound_call.h). NB_MODULE is nanobind's, with that one change; a function bound elsewhere (a
// class's method, a def() on a plain nanobind::module_) is not recorded by jit: a trace that meets its
// Apply stops, and that signature runs eagerly.
#define OB_NB_MODULE_(name, variable)                                 \
  static void ob_module_body_(::opbuilder::detail::ObModule);        \
  NB_MODULE_IMPL(name, ob_module_) {                                  \
    ::opbuilder::detail::RegisterNanobindTranslator();                \
    ob_module_body_(::opbuilder::detail::ObModule(ob_module_));       \
  }                                                                   \
  static void ob_module_body_(::opbuilder::detail::ObModule variable)
#undef NB_MODULE
#define NB_MODULE(name, variable) OB_NB_MODULE_(name, variable)
#define OB_MODULE(m) NB_MODULE(OB_EXTENSION_NAME, m)

// A source written with PYBIND11_MODULE(MS_EXTENSION_NAME, m) whose module only binds plain functions
// of argument types both layers convert alike (m.def("name", &fn, "doc")): the builder builds it with
// nanobind (binding.py reads the sources and decides; anything else stays on pybind11).
#ifndef PYBIND11_MODULE
#define PYBIND11_MODULE(name, m) OB_MODULE(m)
#endif
