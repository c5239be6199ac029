// One value of AutogradContext::saved_data (autograd.h). Not for operator authors.
//
// A value is held as a Python object, converted by the operator's binding layer (binding.h Binding) on
// the way in (operator=) and out (cast<T>()); each conversion takes the GIL for itself.
//
// In an XLA FFI handler's run (binding.h NoPythonHandler) a tensor, a list of tensors or an optional
// tensor is held as C++ tensors instead, with reference semantics (Forward may fill a tensor after
// storing it) and no GIL. The handler's forward keeps the context past the call (its tape), so it copies
// the held tensors that lie in XLA's result buffers out of them after the run
// (xla_ffi_handlers.h KeepOffXla, through HeldTensors()), as it does SaveForBackward's.
#pragma once

#include <Python.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "opbuilder/detail/binding.h"
#include "opbuilder/detail/gil_free_run.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/detail/visibility.h"
#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// The GIL for one conversion of a saved_data value: PyGILState_Ensure and Release nest, so a thread
// that holds the GIL keeps it and one that did not (an XLA FFI handler's run, a body under
// gil_scoped_release) gives it back at once. (PyGILState_Check, which GilForRefcount asks, is answered
// in an XLA FFI run by gil_wrap.h, which keeps the GIL to the run's end: threads the run then joins,
// whose Applies need the GIL, would wait for ever.)
class GilForValue {
 public:
  GilForValue() : state_(PyGILState_Ensure()) {}
  ~GilForValue() { PyGILState_Release(state_); }
  GilForValue(const GilForValue &) = delete;
  GilForValue &operator=(const GilForValue &) = delete;

 private:
  PyGILState_STATE state_;
};

// A value cast<T>() gives that holds no Python object: numbers, strings, tensors, lists and optionals
// of them. Any other T (pybind11::object, nanobind::handle, ...) is Python's.
template <typename T>
struct PlainSaved : std::bool_constant<std::is_arithmetic_v<T> || std::is_same_v<T, std::string> ||
                                       std::is_same_v<T, TensorPtr>> {};
template <typename T>
struct PlainSaved<std::vector<T>> : PlainSaved<T> {};
template <typename T>
struct PlainSaved<std::optional<T>> : PlainSaved<T> {};

class SavedValue {
 public:
  SavedValue() = default;

  template <typename V, typename = std::enable_if_t<!std::is_same_v<std::decay_t<V>, SavedValue>>>
  SavedValue &operator=(V &&v) {
    CheckPython();
    using D = std::decay_t<V>;
    if constexpr (kHeldKind<D> != Held::kNone) {
      if (NoPythonHandler() != nullptr) {  // an XLA FFI run: held as C++ tensors (see the top)
        TensorPtrList held;
        if constexpr (std::is_same_v<D, TensorPtr>) {
          held.push_back(std::forward<V>(v));
        } else if constexpr (std::is_same_v<D, TensorPtrList>) {
          held = std::forward<V>(v);
        } else {
          if (v) held.push_back(*std::forward<V>(v));
        }
        GilForValue gil;  // (a Python value it replaces is dropped under it)
        obj_ = PyRef();
        made_.clear();
        held_ = std::move(held);
        kind_ = kHeldKind<D>;
        return *this;
      }
    }
    GilForValue gil;  // (the value replaced is dropped under it too)
    obj_ = PyRef::Steal(Binding<D>::ToPython(std::forward<V>(v)));
    made_.clear();
    held_.clear();
    kind_ = Held::kNone;
    return *this;
  }

  template <typename T>
  T cast() const {
    CheckPython();
    if constexpr (!PlainSaved<T>::value) KeepGilForRun();
    if (kind_ != Held::kNone) {
      if constexpr (kHeldKind<T> != Held::kNone) {
        if (kind_ == kHeldKind<T>) return HeldAs<T>();
      }
      // asked for another type: the held tensors as the Python value they stand for, over copies of
      // them (the run's result buffers are XLA's; a handle into what it gives stays valid while this
      // value lives: the object is kept)
      TensorPtrList copies = CopiesOffXla(held_);
      GilForValue gil;  // (Binding<T>: any dependent type defers the binding layer's lookup)
      PyRef value;
      if (kind_ == Held::kTensor) value = PyRef::Steal(Binding<T>::ToPython(copies[0]));
      if (kind_ == Held::kList) value = PyRef::Steal(Binding<T>::ToPython(copies));
      if (kind_ == Held::kOptional) {
        value = PyRef::Steal(Binding<T>::ToPython(
            copies.empty() ? std::optional<TensorPtr>() : std::optional<TensorPtr>(copies[0])));
      }
      made_.push_back(value);
      return Read<T>(value.get());
    }
    if (!obj_) throw std::runtime_error("saved_data: no value was stored under this key");
    GilForValue gil;
    return Read<T>(obj_.get());
  }

  PyObject *ptr() const { return obj_.get(); }
  explicit operator bool() const { return static_cast<bool>(obj_) || kind_ != Held::kNone; }

  // The tensors held as C++ tensors (an XLA FFI run's; see the top), for the handler to copy out of XLA.
  TensorPtrList &HeldTensors() { return held_; }

 private:
  enum class Held : std::uint8_t { kNone, kTensor, kList, kOptional };
  template <typename T>
  static constexpr Held kHeldKind = std::is_same_v<T, TensorPtr>                    ? Held::kTensor
                                    : std::is_same_v<T, TensorPtrList>              ? Held::kList
                                    : std::is_same_v<T, std::optional<TensorPtr>> ? Held::kOptional
                                                                                    : Held::kNone;

  // `o` as T, by the rules of CheckReadAs (binding.h), on both layers alike (their own cast errors too)
  template <typename T>
  static T Read(PyObject *o) {
    if constexpr (ReadOptional<T>::value) {  // element by element, so both layers read each alike
      return o == Py_None ? T() : T(Read<typename T::value_type>(o));
    } else if constexpr (ReadElements<T>::value) {
      if (!PyList_Check(o) && !PyTuple_Check(o)) ThrowReadAs(o, "saved_data");  // (pybind11 takes any sequence)
      const bool list = PyList_Check(o);
      const Py_ssize_t n = list ? PyList_Size(o) : PyTuple_Size(o);
      T out;
      out.reserve(static_cast<std::size_t>(n));
      for (Py_ssize_t i = 0; i < n; ++i) {
        out.push_back(Read<typename T::value_type>(list ? PyList_GetItem(o, i) : PyTuple_GetItem(o, i)));
      }
      return out;
    } else {
      CheckReadAs<T>(o, "saved_data");
      if constexpr (std::is_same_v<T, bool>) {
        return PyObject_IsTrue(o) == 1;  // Python's or numpy's bool (nanobind's caster takes Python's only)
      } else {
        return ReadLeaf<T>(o);
      }
    }
  }
  template <typename T>
  static T ReadLeaf(PyObject *o) {
    try {
      return Binding<T>::template FromPython<T>(o);
    } catch (const std::exception &e) {
      if (Binding<T>::IsCastError(e)) ThrowReadAs(o, "saved_data");
      throw;
    }
  }

  template <typename T>
  T HeldAs() const {
    if constexpr (std::is_same_v<T, TensorPtr>) {
      return held_[0];
    } else if constexpr (std::is_same_v<T, TensorPtrList>) {
      return held_;
    } else {
      return held_.empty() ? std::optional<TensorPtr>() : std::optional<TensorPtr>(held_[0]);
    }
  }

  // Copies of held tensors, in memory of their own (no result buffer XLA offered is taken for them).
  static TensorPtrList CopiesOffXla(const TensorPtrList &ts) {
    const OfferedBuffers offered = Offered();
    Offered() = OfferedBuffers{};
    TensorPtrList out;
    try {
      for (const auto &t : ts) out.push_back(t ? t->contiguous_copy() : t);
    } catch (...) {
      Offered() = offered;
      throw;
    }
    Offered() = offered;
    return out;
  }

  // A Python object cast() gives may be used and dropped after it returns: in an XLA FFI run of a module
  // function the GIL is then kept to the run's end, as a GIL check there keeps it (gil_wrap.h).
  static void KeepGilForRun() {
    GilFreeRunState &run = GilFreeRun();
    if (run.depth == 0 || run.taken) return;
    run.gil = PyGILState_Ensure();  // (nests if this thread holds it already; the run's end gives it back)
    run.taken = true;
  }

  static void CheckPython() {
    if (const char *probe = ProbeRefusesPython()) {
      throw std::runtime_error(std::string("ctx->saved_data holds Python objects (seen by ") + probe + ")");
    }
    if (!Py_IsInitialized()) {
      const char *where = NoPythonHandler();
      throw std::runtime_error(std::string("ctx->saved_data holds Python objects, and Python has ended") +
                               (where != nullptr ? std::string(" (in ") + where + ")" : std::string()));
    }
  }

  PyRef obj_;
  mutable std::vector<PyRef> made_;  // the objects reads as another type made (see cast)
  TensorPtrList held_;
  Held kind_ = Held::kNone;
};

}  // namespace detail
}  // namespace opbuilder
