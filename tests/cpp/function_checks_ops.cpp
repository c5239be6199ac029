// Function<T> classes that get Forward or Backward wrong, one per CHECK value, for
// tests/test_builder_errors.py: each build must fail with one static_assert naming the class.
#include "opbuilder/extension.h"
using namespace opbuilder;

class NoForward : public Function<NoForward> {
 public:
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return g; }
};
class NoBackward : public Function<NoBackward> {
 public:
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return x; }
};
class MemberForward : public Function<MemberForward> {  // not static
 public:
  TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return x; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return g; }
};
class NoContext : public Function<NoContext> {  // Forward without the AutogradContext *
 public:
  static TensorPtr Forward(const TensorPtr &x) { return x; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return g; }
};
class IntForward : public Function<IntForward> {
 public:
  static int Forward(AutogradContext *, const TensorPtr &) { return 1; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return g; }
};
class OneGradBackward : public Function<OneGradBackward> {  // takes one gradient, not the list
 public:
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return x; }
  static TensorPtrList Backward(AutogradContext *, const TensorPtr &g) { return {g}; }
};
class TensorBackward : public Function<TensorBackward> {  // returns one tensor, not a list
 public:
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return x; }
  static TensorPtr Backward(AutogradContext *, TensorPtrList g) { return g[0]; }
};
class TemplateForward : public Function<TemplateForward> {  // right: a template and an overload
 public:
  template <typename X>
  static TensorPtr Forward(AutogradContext *, const X &x) { return x; }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x, double) { return x; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return g; }
};

PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  m.def("f", [](const TensorPtr &x) { return CHECK::Apply(x); });
}
