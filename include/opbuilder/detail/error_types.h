// The C++ exceptions that reach Python as TypeError and ValueError, without Python.h, so
// headers that aot operators include (they build without Python) can throw them too.
// Each binding layer registers a translator for TypeError; ValueError derives from
// std::invalid_argument, which both binding libraries already raise as ValueError.
#pragma once

#include <stdexcept>

#include "opbuilder/detail/visibility.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

class TypeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ValueError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace detail
}  // namespace opbuilder
