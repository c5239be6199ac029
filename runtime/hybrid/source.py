"""A DSL function's syntax tree, with line numbers of the file it was written in.

``parse(func)`` reads the function's source (``inspect``), parses it with
``ast`` and moves every line number to where it is in the file, so errors
and debug checks name the user's line. ``ParsedKernel.normalized`` is the
tree without positions or comments: what the cache key is made of, so
editing a comment or moving the function rebuilds nothing.

Nesting is bounded (``MAX_NESTING`` levels of statements and expressions):
each later step walks the tree recursively (the checks, the C++ generator,
``ast.unparse`` and ``copy.deepcopy`` take up to ~4 Python frames a level),
so a deeper function (a sum of 400 terms is 400 levels) is refused here with
a HybridSyntaxError naming its line, never a RecursionError halfway.
"""
from __future__ import annotations

import ast
import inspect
import re
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, List, Tuple

from .errors import HybridSyntaxError

__all__ = ["ParsedKernel", "parse", "MAX_NESTING"]

# Levels of nested statements and expressions a DSL function may have: ~4 frames a level at most (see
# above) stays far inside Python's default recursion limit of 1000 even when called from a deep stack.
MAX_NESTING = 100


@dataclass(frozen=True)
class ParsedKernel:
    """The parsed DSL function: its tree (decorators dropped), file, name and normalized text."""

    tree: ast.FunctionDef
    filename: str
    name: str
    normalized: str

    def error(self, node: Any, message: str, cls: type = HybridSyntaxError) -> Exception:
        """An error at ``node``'s line (``cls`` is a HybridError subclass).

        A node inlined from a called DSL function (inline.py) names that function's file and its own names.
        """
        for mangled, original in getattr(node, "ob_names", {}).items():
            message = re.sub(rf"\b{re.escape(mangled)}\b", original, message)
        name = getattr(node, "ob_kernel", self.name)
        return cls(f"{message} (in hybrid kernel '{name}')", self.where(node), getattr(node, "lineno", 0))

    def where(self, node: Any) -> str:
        """The file ``node`` was written in: this kernel's, or that of the DSL function it was inlined from."""
        return getattr(node, "ob_file", self.filename)


def parse(func: Callable[..., Any]) -> ParsedKernel:
    """Parse ``func``'s source; HybridSyntaxError if it has none or is not a plain ``def``."""
    name = getattr(func, "__name__", repr(func))
    code = getattr(func, "__code__", None)
    filename = code.co_filename if code is not None else "<unknown>"
    first = code.co_firstlineno if code is not None else 1
    try:
        text = inspect.getsource(func)
    except (OSError, TypeError) as e:
        raise HybridSyntaxError(f"the source of hybrid kernel '{name}' cannot be read ({e}); define it with def "
                                f"in a file", filename, first) from None
    module = ast.parse(textwrap.dedent(text))
    if not module.body or not isinstance(module.body[0], ast.FunctionDef):
        raise HybridSyntaxError(f"hybrid kernel '{name}' must be a function defined with def (lambdas and "
                                f"async functions are not kernels)", filename, first)
    tree = module.body[0]
    ast.increment_lineno(tree, first - 1)
    tree.decorator_list = []
    _check_nesting(tree, filename, name)
    normalized = ast.dump(tree, annotate_fields=False, include_attributes=False)
    return ParsedKernel(tree=tree, filename=filename, name=name, normalized=normalized)


def _check_nesting(tree: ast.FunctionDef, filename: str, name: str) -> None:
    """HybridSyntaxError at the first statement or expression nested deeper than MAX_NESTING (walked without
    recursion, so any depth Python itself accepted is measured)."""
    stack: List[Tuple[ast.AST, int]] = [(s, 1) for s in reversed(tree.body)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            line = getattr(node, "lineno", tree.lineno)
            raise HybridSyntaxError(f"statements and expressions are nested more than {MAX_NESTING} levels deep "
                                    f"here (a sum of n terms is about n levels); the hybrid DSL takes at most "
                                    f"{MAX_NESTING}: split the expression into several statements (s = a + b, "
                                    f"then s = s + c, ...) (in hybrid kernel '{name}')", filename, line)
        stack += [(c, depth + 1) for c in ast.iter_child_nodes(node) if isinstance(c, (ast.stmt, ast.expr))]
