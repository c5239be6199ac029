"""Calls from one DSL function to another, inlined before validation and code generation.

A hybrid kernel may call a ``@kernel`` function, or a plain function written
in the DSL in its own module, as a top-level statement ``y = f(a, b)`` (or
``y, z = f(a)`` for several outputs). The callee is parsed, its own calls are
inlined, and it is validated on its own (its errors name its file and line);
then its body replaces the call: its inputs become the caller's argument
tensors, its outputs the assigned names, its other tensors, scalars and loop
indices get fresh names, and its module constants become literals. Inlined
nodes keep the callee's file, name and line (``ob_file``/``ob_kernel``), so
type errors and debug index checks point into the callee. Recursion, direct
or mutual, is a HybridSyntaxError naming the cycle.
"""
from __future__ import annotations

import ast
import copy
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .callee import Callee, DslKernel
from .dsl import DECLS, GRID, INTRINSICS, LOOPS
from .source import ParsedKernel, parse
from .validate import KernelInfo, _outer_names, validate

__all__ = ["Callee", "Expanded", "expand"]


@dataclass
class Expanded:
    """A kernel with its DSL calls inlined: the merged tree, what it declares, and what it calls."""

    parsed: ParsedKernel
    info: KernelInfo
    calls: Dict[str, Callee]  # name in the function's body -> callee (the Python target calls these)
    sources: Tuple[str, ...]  # normalized source of every DSL function called, directly or not
    # every name read from outside a function (module constants, DSL callees), its own and its callees':
    # (the function, the name, the value it had); the code is only valid while each still has that value
    bindings: Tuple[Tuple[Callable[..., Any], str, Any], ...] = ()


def _own_bindings(func: Callable[..., Any], info: KernelInfo) -> List[Tuple[Callable[..., Any], str, Any]]:
    """The constants ``func`` reads from outside, as the objects its scope holds (not their ``.item()``)."""
    outer = _outer_names(func)
    return [(func, n, outer.get(n)) for n in sorted(info.constants)]


def _plain(v: Any) -> Any:
    """The Python function behind a DSL callee value (a HybridKernel or a function), else None."""
    if isinstance(v, DslKernel):
        return v.func
    return v if isinstance(v, types.FunctionType) else None


def _locals(tree: ast.FunctionDef) -> Set[str]:
    names: Set[str] = {a.arg for a in tree.args.args}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
    return names


def _dsl_callees(parsed: ParsedKernel, func: Callable[..., Any]) -> Dict[str, Callable[..., Any]]:
    """Names called in ``func``'s body that are DSL functions: @kernel ones, or plain ones of its module."""
    outer = _outer_names(func)
    local = _locals(parsed.tree)
    found: Dict[str, Callable[..., Any]] = {}
    for n in ast.walk(parsed.tree):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
            continue
        name = n.func.id
        if name in local or name in INTRINSICS or name in DECLS or name in LOOPS or name == GRID:
            continue
        v = outer.get(name)
        target = _plain(v)
        if target is None:
            continue
        same_module = getattr(target, "__globals__", None) is getattr(func, "__globals__", None)
        if isinstance(v, DslKernel) or same_module:
            found[name] = target
    return found


class _Rename(ast.NodeTransformer):
    """Renames a callee's names into the caller and tags each node with where it came from."""

    def __init__(self, names: Dict[str, str], consts: Dict[str, Any], where: Tuple[str, str],
                 aliases: Dict[str, str]) -> None:
        self.names, self.consts, self.where, self.aliases = names, consts, where, aliases

    def tag(self, node: ast.AST) -> None:
        if not hasattr(node, "ob_file"):
            node.ob_file, node.ob_kernel = self.where  # type: ignore[attr-defined]
        if isinstance(node, ast.Subscript) and not hasattr(node, "ob_text"):
            node.ob_text = ast.unparse(node)  # type: ignore[attr-defined]
        old = getattr(node, "ob_names", {})
        node.ob_names = {**{m: old.get(o, o) for m, o in self.aliases.items()}, **old}  # type: ignore[attr-defined]

    def visit(self, node: ast.AST) -> Any:
        if isinstance(node, ast.AST) and not isinstance(node, (ast.expr_context, ast.operator, ast.cmpop,
                                                               ast.unaryop, ast.boolop)):
            self.tag(node)
        return super().visit(node)

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in self.names:
            node.id = self.names[node.id]
        elif node.id in self.consts and isinstance(node.ctx, ast.Load):
            return ast.copy_location(ast.Constant(self.consts[node.id]), node)
        return node


class _Expander:
    def __init__(self, stack: Tuple[Tuple[Any, str], ...]) -> None:
        self.stack = stack  # (code object, name) of each function being expanded, outermost first

    def run(self, func: Callable[..., Any]) -> Expanded:
        parsed = parse(func)
        callees = _dsl_callees(parsed, func)
        if not callees:
            info = validate(parsed, func)
            return Expanded(parsed, info, {}, (), tuple(_own_bindings(func, info)))
        self.parsed, self.func = parsed, func
        self.taken = _locals(parsed.tree) | {n.id for n in ast.walk(parsed.tree) if isinstance(n, ast.Name)}
        self.counter = 0
        self.calls: Dict[str, Callee] = {}
        self.sources: List[str] = []
        outer = _outer_names(func)
        self.bindings: List[Tuple[Callable[..., Any], str, Any]] = [(func, n, outer.get(n)) for n in sorted(callees)]
        tree = parsed.tree
        self._check_positions(tree, callees)
        ret = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Return) else None
        returned = {n.id for n in ast.walk(ret) if isinstance(n, ast.Name)} if ret is not None else set()
        tensors = set(a.arg for a in tree.args.args)
        body: List[ast.stmt] = []
        for s in tree.body:
            call = self._dsl_call(s, callees)
            if call is None:
                body.append(s)
                if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) and \
                        isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Name) and \
                        s.value.func.id in DECLS:
                    tensors.add(s.targets[0].id)
                continue
            body += self._inline(s, call, callees[call.func.id], tensors, returned)  # type: ignore[union-attr]
        merged = copy.copy(tree)
        merged.body = body
        normalized = ast.dump(merged, annotate_fields=False, include_attributes=False)
        out = ParsedKernel(tree=merged, filename=parsed.filename, name=parsed.name, normalized=normalized)
        info = validate(out, func)
        return Expanded(out, info, self.calls, tuple(self.sources), tuple(self.bindings + _own_bindings(func, info)))

    def _cycle(self, node: ast.AST, target: Callable[..., Any], name: str) -> None:
        codes = [c for c, _ in self.stack]
        if target.__code__ not in codes:
            return
        if len(self.stack) == 1 or codes[-1] is target.__code__:
            raise self.parsed.error(node, f"recursion: kernel '{self.parsed.name}' calls itself; hybrid kernels "
                                          f"cannot recurse")
        chain = [n for _, n in self.stack[codes.index(target.__code__):]] + [name]
        raise self.parsed.error(node, f"recursion: {' -> '.join(chain)}; hybrid kernels cannot recurse")

    def _check_positions(self, tree: ast.FunctionDef, callees: Dict[str, Callable[..., Any]]) -> None:
        allowed = {id(self._dsl_call(s, callees)) for s in tree.body}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in callees:
                self._cycle(n, callees[n.func.id], n.func.id)
                if id(n) not in allowed:
                    raise self.parsed.error(n, f"a call to DSL function '{n.func.id}' is a statement of its own at "
                                               f"the top level of the kernel: y = {n.func.id}(x, ...) (or "
                                               f"y, z = ... for several outputs)")

    @staticmethod
    def _dsl_call(s: ast.stmt, callees: Dict[str, Callable[..., Any]]) -> Optional[ast.Call]:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.value, ast.Call) and \
                isinstance(s.value.func, ast.Name) and s.value.func.id in callees:
            t = s.targets[0]
            if isinstance(t, ast.Name) or (isinstance(t, ast.Tuple) and all(isinstance(e, ast.Name) for e in t.elts)):
                return s.value
        return None

    def _inline(self, s: ast.Assign, call: ast.Call, target: Callable[..., Any], tensors: Set[str],
                returned: Set[str]) -> List[ast.stmt]:
        name = call.func.id  # type: ignore[union-attr]
        sub = _Expander(self.stack + ((target.__code__, name),)).run(target)
        info, cp = sub.info, sub.parsed
        self.calls[name] = Callee(target, sub.calls)
        self.sources += [cp.normalized, *sub.sources]
        self.bindings += sub.bindings
        if call.keywords or len(call.args) != len(info.inputs):
            raise self.parsed.error(call, f"'{name}' takes {len(info.inputs)} tensor argument(s) "
                                          f"({', '.join(info.inputs)}), given by position; got "
                                          f"{len(call.args) + len(call.keywords)}")
        for a in call.args:
            if not isinstance(a, ast.Name) or a.id not in tensors:
                raise self.parsed.error(a, f"the arguments of DSL function '{name}' are tensors of the kernel "
                                           f"(inputs, or declared above); got {ast.unparse(a)}")
        t = s.targets[0]
        outs = [t] if isinstance(t, ast.Name) else list(t.elts)  # type: ignore[attr-defined]
        if len(outs) != len(info.outputs):
            raise self.parsed.error(s, f"'{name}' returns {len(info.outputs)} tensor(s) "
                                       f"({', '.join(info.outputs)}); assign them to as many names")
        for o in outs:
            assert isinstance(o, ast.Name)
            if o.id in tensors:
                raise self.parsed.error(s, f"'{o.id}' is already defined; a tensor is declared once")
            tensors.add(o.id)
        names = dict(zip(info.inputs, [a.id for a in call.args]))  # type: ignore[attr-defined]
        names.update(zip(info.outputs, [o.id for o in outs]))  # type: ignore[attr-defined]
        self.counter += 1
        own = set(info.decls) | info.scalars | info.loop_vars | info.grid_vars | _locals(cp.tree)
        aliases: Dict[str, str] = {}
        for n in sorted(own - set(names)):
            m = f"{name}_{self.counter}_{n}"
            while m in self.taken:
                m += "_"
            self.taken.add(m)
            names[n] = m
            aliases[m] = n
        consts = {k: v for k, v in info.constants.items() if k not in names}
        body = [copy.deepcopy(b) for b in cp.tree.body[:-1]
                if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
        rename = _Rename(names, consts, (cp.filename, cp.name), aliases)
        body = [rename.visit(b) for b in body]
        for b in body:  # the callee's outputs the caller does not return are temporaries of the caller
            if isinstance(b, ast.Assign) and isinstance(b.targets[0], ast.Name) and \
                    b.targets[0].id in names.values() and isinstance(b.value, ast.Call) and \
                    isinstance(b.value.func, ast.Name) and b.value.func.id == "output_tensor" and \
                    b.targets[0].id not in returned:
                b.value.func.id = "allocate"
                b.value.ob_uninit = True  # type: ignore[attr-defined]
        return body


def expand(func: Callable[..., Any]) -> Expanded:
    """``func`` parsed, with its DSL calls inlined, and validated; HybridSyntaxError naming file:line."""
    return _Expander(((func.__code__, getattr(func, "__name__", "kernel")),)).run(func)
