"""Structural checks of a DSL function, before any dtype is known; what it declares.

Every construct outside the DSL is refused here with a HybridSyntaxError
naming it and the file and line it is on: ``while``, ``break``,
``continue``, ``with``, ``try``, nested functions, lambdas, comprehensions,
calls to unknown functions (and recursion), attributes other than ``.shape``
and ``.dtype``, writes into inputs, keyword arguments. The result,
``KernelInfo``, says which names are inputs, outputs (in return order),
temporaries, scalars, loop indices and constants from the enclosing scope.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Set

import numpy as np

from .dsl import DECLS, GRID, INTRINSICS, LOOPS
from .errors import HybridSyntaxError
from .source import ParsedKernel

__all__ = ["KernelInfo", "validate"]

_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitAnd, ast.BitOr,
           ast.BitXor, ast.LShift, ast.RShift)
_CMPOPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_STMT_NAMES = {ast.While: "'while' loops", ast.Break: "'break'", ast.Continue: "'continue'",
               ast.With: "'with' blocks", ast.Try: "'try' blocks", ast.Raise: "'raise'",
               ast.FunctionDef: "nested functions", ast.ClassDef: "classes", ast.Import: "imports",
               ast.ImportFrom: "imports", ast.Global: "'global'", ast.Nonlocal: "'nonlocal'",
               ast.Delete: "'del'", ast.Assert: "'assert'", ast.AsyncFunctionDef: "async functions"}
_EXPR_NAMES = {ast.Lambda: "lambdas", ast.ListComp: "list comprehensions", ast.DictComp: "dict comprehensions",
               ast.SetComp: "set comprehensions", ast.GeneratorExp: "generator expressions",
               ast.Dict: "dicts", ast.Set: "sets", ast.JoinedStr: "f-strings", ast.Starred: "starred arguments",
               ast.Slice: "slices (index elements one at a time)", ast.NamedExpr: "':=' assignments",
               ast.Await: "'await'", ast.Yield: "'yield'", ast.YieldFrom: "'yield'"}


@dataclass
class KernelInfo:
    """What a DSL function declares (names by role), its decl statements and enclosing-scope constants."""

    inputs: List[str]
    outputs: List[str]  # in return order
    decls: Dict[str, ast.Call] = field(default_factory=dict)  # output_tensor/allocate call per tensor name
    temporaries: List[str] = field(default_factory=list)
    scalars: Set[str] = field(default_factory=set)
    loop_vars: Set[str] = field(default_factory=set)
    grid_vars: Set[str] = field(default_factory=set)
    constants: Dict[str, Any] = field(default_factory=dict)

    def tensors(self) -> List[str]:
        return self.inputs + [n for n in self.decls]


def _outer_names(func: Callable[..., Any]) -> Dict[str, Any]:
    """The function's globals and closure variables, as the body would see them."""
    names = dict(getattr(func, "__globals__", {}))
    code = getattr(func, "__code__", None)
    closure = getattr(func, "__closure__", None) or ()
    if code is not None:
        for name, cell in zip(code.co_freevars, closure):
            try:
                names[name] = cell.cell_contents
            except ValueError:
                pass
    return names


class _Validator:
    def __init__(self, parsed: ParsedKernel, func: Callable[..., Any]) -> None:
        self.p = parsed
        self.outer = _outer_names(func)
        tree = parsed.tree
        args = tree.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.defaults or args.posonlyargs:
            raise parsed.error(tree, "kernel parameters must be plain positional names (no defaults, *args, "
                                     "**kwargs or keyword-only parameters); each is an input tensor")
        self.info = KernelInfo(inputs=[a.arg for a in args.args], outputs=[])
        self.assigned: Set[str] = set()
        self.scope: Set[str] = set()  # the loop indices of the loops around the statement being checked
        self.loops: Dict[str, int] = {}  # loop index -> line of its (last) loop

    def err(self, node: Any, msg: str) -> HybridSyntaxError:
        return self.p.error(node, msg)  # type: ignore[return-value]

    # ---- statements -------------------------------------------------------
    def run(self) -> KernelInfo:
        body = self.p.tree.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]  # the docstring
        if not body or not isinstance(body[-1], ast.Return):
            raise self.err(body[-1] if body else self.p.tree,
                           "a hybrid kernel ends with 'return' of its output tensor(s)")
        self.block(body[:-1], top=True, loop_vars=set())
        self.ret(body[-1])
        return self.info

    def block(self, stmts: List[ast.stmt], top: bool, loop_vars: Set[str]) -> None:
        for s in stmts:
            self.stmt(s, top, loop_vars)

    def stmt(self, s: ast.stmt, top: bool, loop_vars: Set[str]) -> None:
        info = self.info
        if type(s) in _STMT_NAMES:
            raise self.err(s, f"{_STMT_NAMES[type(s)]} are not supported in the hybrid DSL" +
                           ("; loop over range(...) with an if inside instead" if isinstance(s, ast.While) else ""))
        if isinstance(s, ast.Pass):
            return
        if isinstance(s, ast.Return):
            raise self.err(s, "'return' must be the last statement of the kernel, at its top level")
        if isinstance(s, ast.Expr):
            if isinstance(s.value, ast.Constant) and isinstance(s.value.value, str):
                return  # a string as a comment
            raise self.err(s, "an expression statement has no effect in the hybrid DSL (assign its value to a "
                              "tensor element or a scalar)")
        if isinstance(s, ast.Assign):
            if len(s.targets) != 1 or isinstance(s.targets[0], (ast.Tuple, ast.List)):
                raise self.err(s, "assign one target at a time (no 'a = b = ...' or tuple unpacking)")
            target = s.targets[0]
            if isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Name) and s.value.func.id in DECLS:
                self.decl(s, target, top)
                return
            self.expr(s.value)
            self.assign_target(target, s, loop_vars)
            return
        if isinstance(s, ast.AugAssign):
            if not isinstance(s.op, _BINOPS):
                raise self.err(s, f"the operator {type(s.op).__name__} is not supported")
            self.expr(s.value)
            if isinstance(s.target, ast.Name) and s.target.id not in self.assigned:
                raise self.err(s, f"'{s.target.id}' is updated with {type(s.op).__name__} before it is assigned")
            self.expr(s.target if not isinstance(s.target, ast.Name) else ast.Name(s.target.id, ast.Load()))
            self.assign_target(s.target, s, loop_vars)
            return
        if isinstance(s, ast.AnnAssign):
            raise self.err(s, "annotated assignments are not supported; write 'name = value'")
        if isinstance(s, ast.For):
            self.for_(s, loop_vars)
            return
        if isinstance(s, ast.If):
            self.expr(s.test)
            self.block(s.body, False, loop_vars)
            self.block(s.orelse, False, loop_vars)
            return
        raise self.err(s, f"the statement {type(s).__name__} is not supported in the hybrid DSL")

    def decl(self, s: ast.Assign, target: ast.expr, top: bool) -> None:
        call = s.value
        assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
        what = call.func.id
        if not isinstance(target, ast.Name):
            raise self.err(s, f"assign {what}(...) to a name")
        if not top:
            raise self.err(s, f"{what}(...) must be at the top level of the kernel, not inside a loop or an if")
        if call.keywords or len(call.args) != 2:
            raise self.err(call, f"{what} takes two arguments: {what}(shape, dtype)")
        name = target.id
        if name in self.info.inputs or name in self.info.decls or name in self.assigned:
            raise self.err(s, f"'{name}' is already defined; a tensor is declared once")
        self.shape_arg(call.args[0])
        self.dtype_arg(call.args[1])
        self.info.decls[name] = call
        if what == "allocate":
            self.info.temporaries.append(name)

    def shape_arg(self, node: ast.expr) -> None:
        if isinstance(node, ast.Attribute) and node.attr == "shape" and isinstance(node.value, ast.Name) \
                and node.value.id in self.info.tensors():
            return
        if isinstance(node, (ast.Tuple, ast.List)):
            for e in node.elts:
                self.expr(e)
            return
        raise self.err(node, "a shape is a tuple of sizes, e.g. (n, 4), or another tensor's .shape")

    def dtype_arg(self, node: ast.expr) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return
        if isinstance(node, ast.Attribute) and node.attr == "dtype" and isinstance(node.value, ast.Name) \
                and node.value.id in self.info.tensors():
            return
        if isinstance(node, ast.Name) and node.id in INTRINSICS:
            return
        raise self.err(node, "a dtype is a string such as 'float32', a dtype name such as float32, or another "
                             "tensor's .dtype")

    def assign_target(self, target: ast.expr, s: ast.stmt, loop_vars: Set[str]) -> None:
        info = self.info
        if isinstance(target, ast.Name):
            name = target.id
            if name in info.tensors():
                raise self.err(s, f"'{name}' is a tensor; assign to its elements ({name}[i] = ...)")
            if name in loop_vars or name in info.grid_vars:
                raise self.err(s, f"'{name}' is a loop index; it cannot be assigned inside its loop")
            if name in INTRINSICS or name in DECLS or name in LOOPS or name == GRID:
                raise self.err(s, f"'{name}' is a name the DSL supplies; choose another name")
            info.scalars.add(name)
            self.assigned.add(name)
            return
        if isinstance(target, ast.Subscript):
            base = target.value
            if not isinstance(base, ast.Name) or base.id not in info.tensors():
                raise self.err(s, "assign to an element of a tensor: name[i, j] = ...")
            if base.id in info.inputs:
                raise self.err(s, f"'{base.id}' is an input; inputs are read-only in a hybrid kernel (write into "
                                  f"an output_tensor or an allocate temporary)")
            self.index(target)
            return
        raise self.err(s, f"cannot assign to {type(target).__name__}")

    def for_(self, s: ast.For, loop_vars: Set[str]) -> None:
        if s.orelse:
            raise self.err(s, "'for ... else' is not supported")
        it = s.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in LOOPS + (GRID,)):
            raise self.err(s, f"a loop runs over range(...) or a hint ({', '.join(LOOPS[1:])}, grid); "
                              f"got {ast.unparse(it)}")
        if it.keywords:
            raise self.err(it, f"{it.func.id} takes no keyword arguments")
        if not isinstance(s.target, ast.Name):
            raise self.err(s, "a loop index is one name (for i in range(n))")
        name = s.target.id
        if name in self.info.tensors() or name in self.info.scalars or name in loop_vars:
            raise self.err(s, f"loop index '{name}' is already used as a tensor, a scalar or an enclosing index")
        if it.func.id == GRID:
            if len(it.args) != 1:
                raise self.err(it, "grid takes one shape: for idx in grid(x.shape)")
            self.shape_arg(it.args[0])
            self.info.grid_vars.add(name)
        else:
            if not 1 <= len(it.args) <= 3:
                raise self.err(it, f"{it.func.id} takes 1 to 3 arguments, as range does")
            for a in it.args:
                self.expr(a)
            self.info.loop_vars.add(name)
        self.loops[name] = s.lineno
        outer, self.scope = self.scope, loop_vars | {name}
        self.block(s.body, False, loop_vars | {name})
        self.scope = outer

    def ret(self, s: ast.Return) -> None:
        v = s.value
        items = v.elts if isinstance(v, (ast.Tuple, ast.List)) else [v] if v is not None else []
        outs = []
        for e in items:
            if not isinstance(e, ast.Name) or e.id not in self.info.decls or e.id in self.info.temporaries:
                raise self.err(s, "return the output tensors by name (each declared with output_tensor)")
            outs.append(e.id)
        declared = [n for n in self.info.decls if n not in self.info.temporaries]
        if not outs or sorted(outs) != sorted(declared):
            raise self.err(s, f"return every output_tensor once (declared: {', '.join(declared) or 'none'})")
        self.info.outputs = outs

    # ---- expressions ------------------------------------------------------
    def index(self, node: ast.Subscript) -> None:
        sl = node.slice
        for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl]):
            if isinstance(e, ast.Name) and e.id in self.info.grid_vars:
                self.in_scope(e)
                continue
            self.expr(e)

    def in_scope(self, node: ast.Name) -> None:
        """A loop index is read only inside its loop (the C++ loop variable ends with the loop)."""
        n = node.id
        if n in self.loops and n not in self.scope and n not in self.assigned:
            raise self.err(node, f"loop index '{n}' is read after its loop (line {self.loops[n]}) ended; inside "
                                 f"the loop, copy it into a scalar (last = {n}) and read that")

    def expr(self, node: ast.expr) -> None:
        info = self.info
        if type(node) in _EXPR_NAMES:
            raise self.err(node, f"{_EXPR_NAMES[type(node)]} are not supported in the hybrid DSL")
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or isinstance(node.value, (int, float)):
                return
            raise self.err(node, f"the constant {node.value!r} is not a number")
        if isinstance(node, ast.Name):
            self.name(node)
            return
        if isinstance(node, ast.BinOp):
            if not isinstance(node.op, _BINOPS):
                raise self.err(node, f"the operator {type(node.op).__name__} is not supported")
            self.expr(node.left)
            self.expr(node.right)
            return
        if isinstance(node, ast.UnaryOp):
            self.expr(node.operand)
            return
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self.expr(v)
            return
        if isinstance(node, ast.Compare):
            for op in node.ops:
                if not isinstance(op, _CMPOPS):
                    raise self.err(node, f"the comparison {type(op).__name__} is not supported (use ==, !=, <, "
                                         f"<=, >, >=)")
            self.expr(node.left)
            for c in node.comparators:
                self.expr(c)
            return
        if isinstance(node, ast.IfExp):
            self.expr(node.test)
            self.expr(node.body)
            self.expr(node.orelse)
            return
        if isinstance(node, ast.Subscript):
            base = node.value
            if isinstance(base, ast.Attribute) and base.attr == "shape":
                if not (isinstance(base.value, ast.Name) and base.value.id in info.tensors()):
                    raise self.err(node, "'.shape' is read from a tensor by name: x.shape[0]")
                k = node.slice
                if not (isinstance(k, ast.Constant) and type(k.value) is int) and not (
                        isinstance(k, ast.UnaryOp) and isinstance(k.op, ast.USub) and
                        isinstance(k.operand, ast.Constant) and type(k.operand.value) is int):
                    raise self.err(node, "index a shape with a constant: x.shape[0]")
                return
            if isinstance(base, ast.Name) and base.id in info.grid_vars:
                self.in_scope(base)
                k = node.slice
                if not (isinstance(k, ast.Constant) and type(k.value) is int):
                    raise self.err(node, f"index the grid index '{base.id}' with a constant: {base.id}[0]")
                return
            if not isinstance(base, ast.Name) or base.id not in info.tensors():
                raise self.err(node, "only tensors are indexed: name[i, j]")
            self.index(node)
            return
        if isinstance(node, ast.Attribute):
            if node.attr in ("shape", "dtype"):
                raise self.err(node, f"'.{node.attr}' is used in output_tensor/allocate/grid arguments, or as "
                                     f"x.shape[k]; not as a value here")
            raise self.err(node, f"the attribute '.{node.attr}' is not supported (only .shape and .dtype of "
                                 f"tensors)")
        if isinstance(node, ast.Call):
            self.call(node)
            return
        if isinstance(node, (ast.Tuple, ast.List)):
            raise self.err(node, "tuples and lists are only shapes (output_tensor/allocate/grid) and the "
                                 "returned outputs")
        raise self.err(node, f"the expression {type(node).__name__} is not supported in the hybrid DSL")

    def call(self, node: ast.Call) -> None:
        f = node.func
        if not isinstance(f, ast.Name):
            raise self.err(node, f"calls to {ast.unparse(f)} are not supported; use the DSL's own functions "
                                 f"(sqrt, exp, ...) without a module prefix")
        name = f.id
        if name == self.p.name and name not in INTRINSICS:
            raise self.err(node, f"recursion: kernel '{name}' calls itself; hybrid kernels cannot recurse")
        if name in DECLS:
            raise self.err(node, f"{name}(...) is assigned to a name at the top level: y = {name}(shape, dtype)")
        if name in LOOPS or name == GRID:
            raise self.err(node, f"{name}(...) is only the iterable of a for loop")
        if name not in INTRINSICS:
            raise self.err(node, f"call to unknown function '{name}'; the DSL's functions are "
                                 f"{', '.join(sorted(INTRINSICS))}")
        if node.keywords:
            raise self.err(node, f"{name} takes no keyword arguments")
        lo, hi = INTRINSICS[name].arity
        if not lo <= len(node.args) <= hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            raise self.err(node, f"{name} takes {want} argument(s), got {len(node.args)}")
        for a in node.args:
            self.expr(a)

    def name(self, node: ast.Name) -> None:
        info = self.info
        n = node.id
        if n in info.loop_vars or n in info.grid_vars:
            self.in_scope(node)
        if n in info.tensors() or n in info.scalars or n in info.loop_vars or n in info.grid_vars \
                or n in self.assigned:
            return
        if n in INTRINSICS:
            raise self.err(node, f"'{n}' is a DSL function; call it: {n}(...)")
        if self._is_local(n):
            return  # assigned later in the source (a loop carries it back); the type pass checks its use
        if n in self.outer:
            v = self.outer[n]
            if isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating)):
                info.constants[n] = v.item() if isinstance(v, np.generic) else v
                return
            raise self.err(node, f"'{n}' is a {type(v).__name__} from outside the kernel; only int, float and "
                                 f"bool constants can be used from there")
        raise self.err(node, f"name '{n}' is not defined in the kernel")

    def _is_local(self, n: str) -> bool:
        for node in ast.walk(self.p.tree):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == n for t in targets):
                    return True
            if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and node.target.id == n:
                return True
        return False


def validate(parsed: ParsedKernel, func: Callable[..., Any]) -> KernelInfo:
    """Check ``parsed`` against the DSL; what it declares. HybridSyntaxError at the first problem."""
    return _Validator(parsed, func).run()
