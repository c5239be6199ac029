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
class IntInferShape : public Function<IntInferShape> {  // a shape rule must return shapes
 public:
  static int InferShape(const TensorPtr &) { return 1; }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return x; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return g; }
};
class ContextInferShape : public Function<ContextInferShape> {  // the rule takes no ctx
 public:
  static ShapeVector InferShape(AutogradContext *, const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return x; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return g; }
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
