"""fullgraph=True says why a to_torch operator breaks the graph: the reason given to
torch.compiler.disable names the operator and what it lacks (not torch's "reason: None")."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402

pytestmark = pytest.mark.build


def test_fullgraph_names_a_missing_shape_rule(my_ops):
    t = opbuilder.to_torch(my_ops)
    x, y = torch.randn(3), torch.randn(3)
    with pytest.raises(torch._dynamo.exc.Unsupported,
                       match=r"\(reason: mul has no shape rule \(to_torch's shape_fn or a C\+\+ InferShape\), so "
                             r"torch.compile cannot trace it: it runs eagerly\)"):
        torch.compile(lambda a, b: t.mul(a, b), fullgraph=True, backend="eager")(x, y)


def test_fullgraph_names_an_operator_returning_its_argument(inplace_view_ops):
    t = opbuilder.to_torch(inplace_view_ops, shape_fn={"identity": lambda x: x})
    x = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(t.identity(x), x)  # an eager call: the op is seen returning its argument
    with pytest.raises(torch._dynamo.exc.Unsupported,
                       match=r"\(reason: identity returns its argument \(unchanged, a view of it, or written in "
                             r"place with MarkDirty\) or one tensor twice, which a compiled graph cannot express: it "
                             r"runs eagerly\)"):
        torch.compile(lambda a: t.identity(a) * 2, fullgraph=True, backend="eager")(x)
