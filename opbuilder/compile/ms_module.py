"""Whether a PYBIND11_MODULE source set can be built with nanobind without changing what Python sees.

Code written for MindSpore's ``ms_extension.h`` binds its functions with pybind11 (~6 s to compile);
the same module built with nanobind takes ~1.3 s. ``nanobind_safe`` says yes only when every rule
below holds, read with a small tokenizer on the comment-stripped text (a loose match would guess):

- every source is C++ (.cpp/.cc/.cxx), its only directives are ``#pragma once`` and ``#include`` of
  ``ms_extension.h`` or a C/C++ standard header (no ``#define``/``#if``: they could read
  OB_BINDING_NANOBIND or rename what is parsed here; no project header, which cannot be read here;
  ms_extension.h includes, in that build, the standard headers pybind11's would have brought);
- the module's source includes ``ms_extension.h`` (which defines PYBIND11_MODULE in that build);
- no source names pybind11 in any other way: no ``pybind11`` or ``py::``, no ``PYBIND11_*`` name
  but the one ``PYBIND11_MODULE(MS_EXTENSION_NAME | OB_EXTENSION_NAME, m)``, at file scope;
- that module holds only ``m.def("name", [&]qualified::function, "doc");`` statements, each name once;
- each function is defined once, in that source, in the namespace its reference names (not in a
  class, not a template), as ``[static|inline] R f(P...) {`` with R and every P of a type both
  layers convert alike (measured: tests/test_builder_ms_nanobind.py runs the probe): a tensor
  (``TensorPtr``/``BaseTensorPtr``, by value or const reference), ``std::optional`` of one, or
  ``double``; R may also be a tensor list, ``int64_t``, ``bool``, ``std::string`` or ``void``.
  Not ``int64_t``/``bool``/``std::string``/vector parameters: pybind11 takes ``np.float32(1.5)`` as
  the int 1, None and 1.5 as bools, bytes as a string, a Tensor as a list; nanobind refuses them;
- no source declares a name of its own for one of those types (``using TensorPtr = ...``).
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["FileFacts", "file_facts", "nanobind_safe"]

CXX_SUFFIXES = (".cpp", ".cc", ".cxx")
_OUR_HEADERS = frozenset({"ms_extension.h"})
_STD_HEADERS = frozenset("""
algorithm any array atomic bitset cassert cctype cerrno cfloat charconv chrono cinttypes climits cmath complex
condition_variable cstddef cstdint cstdio cstdlib cstring ctime deque exception functional initializer_list
iomanip ios iosfwd iostream istream iterator limits list map memory mutex new numeric optional ostream queue
random ratio set shared_mutex sstream stack stdexcept string string_view thread tuple type_traits typeinfo
unordered_map unordered_set utility valarray variant vector assert.h float.h limits.h math.h stddef.h stdint.h
stdio.h stdlib.h string.h""".split())

_TENSOR = frozenset({"TensorPtr", "BaseTensorPtr"})
_TENSOR_LIST = frozenset({"TensorPtrList", "BaseTensorPtrList"})
_OWN_NAMES = _TENSOR | _TENSOR_LIST | {"Tensor", "BaseTensor", "optional"}  # a source must not declare these
_NAMESPACES = frozenset({"opbuilder", "mindspore", "tensor", "pynative", "autograd", "pyboost"})
_MODULE_NAMES = frozenset({"MS_EXTENSION_NAME", "OB_EXTENSION_NAME"})

_COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(\s]{0,16})\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\\n]|\\.)*")|(?P<chr>\'(?:[^\'\\\n]|\\.)*\')|(?P<id>[A-Za-z_]\w*)|'
                    r'(?P<num>\.?\d[\w.\']*)|(?P<op>::|->|[^\sA-Za-z_0-9"]))')
_DIRECTIVE = re.compile(r'#\s*(?:pragma\s+once|include\s*(?:"([^"]+)"|<([^>]+)>))\s*$')


class FileFacts:
    """What one source says (None in ``why`` when it passed the per-file rules). A plain class: a
    NamedTuple costs ~0.5 ms to create, and a warm load() of such a source imports this module."""

    __slots__ = ("why", "module", "functions", "defined")

    def __init__(self, why: Optional[str], module: Optional[Tuple[Tuple[str, Tuple[str, ...]], ...]],
                 functions: Dict[Tuple[str, ...], bool], defined: Tuple[str, ...]) -> None:
        self.why = why  # the first rule it breaks
        self.module = module  # (Python name, function reference path) per def
        self.functions = functions  # qualified name -> its signature is accepted (per definition found)
        self.defined = defined  # unqualified names of every function defined, with repeats


def _strip_comments(text: str) -> str:
    return _COMMENT.sub(lambda m: " " if m.group(0).startswith("/") else m.group(0), text)


def _split(text: str) -> Tuple[List[str], List[str]]:
    """(directive lines, tokens of the rest); continued lines are joined first."""
    text = _strip_comments(text).replace("\\\n", "")
    directives, code = [], []
    for line in text.splitlines():
        (directives if line.lstrip().startswith("#") else code).append(line)
    tokens, src, pos = [], "\n".join(code), 0
    if re.search(r'R"', src):
        return directives, ["\0"]  # a raw string literal: not read here
    while True:
        m = _TOKEN.match(src, pos)
        if m is None:
            if src[pos:].strip():
                tokens.append("\0")  # something this tokenizer does not know (a raw string, a char literal)
            return directives, tokens
        tokens.append(m.group(m.lastgroup))
        pos = m.end()


def _type_kind(tokens: Sequence[str]) -> Optional[str]:
    """"tensor", "optional", "double", "list", "int64", "bool", "string", "void" for the type
    ``tokens`` spell (const and one & allowed around it); None for any other."""
    t = [x for x in tokens if x != "const"]
    if t and t[-1] == "&":
        if "const" not in tokens:
            return None  # a non-const reference
        t = t[:-1]
    if t[:1] == ["::"]:
        t = t[1:]
    if len(t) >= 5 and t[:4] == ["std", "::", "optional", "<"] and t[-1] == ">":
        return "optional" if _type_kind(t[4:-1]) == "tensor" else None
    if len(t) == 1 and t[0] in ("double", "bool", "void", "int64_t"):
        return {"double": "double", "bool": "bool", "void": "void", "int64_t": "int64"}[t[0]]
    if t in (["std", "::", "string"], ["std", "::", "int64_t"]):
        return "string" if t[2] == "string" else "int64"
    while len(t) >= 3 and t[0] in _NAMESPACES and t[1] == "::":
        t = t[2:]
    if len(t) == 1 and t[0] in _TENSOR:
        return "tensor"
    if len(t) == 1 and t[0] in _TENSOR_LIST:
        return "list"
    return None


_PARAM_KINDS = frozenset({"tensor", "optional", "double"})
_RETURN_KINDS = frozenset({"tensor", "list", "double", "int64", "bool", "string", "void"})


def _params_ok(tokens: Sequence[str]) -> bool:
    """Each comma-separated parameter is an accepted type and an optional name, nothing more."""
    if not tokens or tokens == ["void"]:
        return True
    params: List[List[str]] = [[]]
    depth = 0
    for t in tokens:
        depth += t == "<"
        depth -= t == ">"
        if t == "," and depth == 0:
            params.append([])
        else:
            params[-1].append(t)
    for p in params:
        named = len(p) >= 2 and re.fullmatch(r"[A-Za-z_]\w*", p[-1]) is not None
        if _type_kind(p) not in _PARAM_KINDS and not (named and _type_kind(p[:-1]) in _PARAM_KINDS):
            return False
    return True


def _close(tokens: Sequence[str], i: int, open_: str, close: str) -> int:
    """The index of the token closing the ``open_`` at ``i``; -1 if it is never closed."""
    depth = 0
    for j in range(i, len(tokens)):
        depth += tokens[j] == open_
        depth -= tokens[j] == close
        if depth == 0:
            return j
    return -1


def _parse_module(tokens: Sequence[str], i: int) -> Tuple[Optional[str], Optional[tuple], int]:
    """(why not, ((name, reference), ...), end index) of ``PYBIND11_MODULE`` at ``i``."""
    if tokens[i + 1:i + 2] != ["("] or len(tokens) < i + 7:
        return "PYBIND11_MODULE is not followed by (name, m) {", None, i
    if tokens[i + 2] not in _MODULE_NAMES or tokens[i + 3] != "," or tokens[i + 5:i + 7] != [")", "{"]:
        return "PYBIND11_MODULE's arguments are not (MS_EXTENSION_NAME, m)", None, i
    m, end = tokens[i + 4], _close(tokens, i + 6, "{", "}")
    if end < 0:
        return "the module block is not closed", None, i
    body, defs, names = list(tokens[i + 7:end]), [], set()
    while body:
        if body[:4] != [m, ".", "def", "("] or len(body) < 5 or not body[4].startswith('"'):
            return f"the module block holds something other than {m}.def(\"name\", function, \"doc\");", None, end
        k = 5
        if body[k:k + 1] != [","]:
            return "a def's name is not one string literal", None, end
        k += 1
        k += body[k:k + 1] == ["&"]
        ref: List[str] = []
        if body[k:k + 1] == ["::"]:
            k += 1
        while k < len(body) and re.fullmatch(r"[A-Za-z_]\w*", body[k]):
            ref.append(body[k])
            if body[k + 1:k + 2] != ["::"]:
                break
            k += 2
        k += 1
        if not ref or body[k:k + 1] != [","] or k + 1 >= len(body) or not body[k + 1].startswith('"') \
                or body[k + 2:k + 4] != [")", ";"]:
            return "a def is not (\"name\", [&]function, \"doc\") (a lambda, py::arg, keywords, ...)", None, end
        name = body[4][1:-1]
        if name in names:
            return f"{name} is defined twice (overloads)", None, end
        names.add(name)
        defs.append((name, tuple(ref)))
        body = body[k + 4:]
    return None, tuple(defs), end


def file_facts(text: str, suffix: str) -> FileFacts:
    """The per-file facts of one source's ``text`` (its suffix decides if it is C++)."""
    def no(why: str) -> FileFacts:
        return FileFacts(why, None, {}, ())

    if suffix not in CXX_SUFFIXES:
        return no(f"a {suffix} source")
    directives, tokens = _split(text)
    includes_ms = False
    for d in directives:
        m = _DIRECTIVE.match(d.strip())
        if m is None:
            return no(f"the directive {d.strip()!r}")
        header = m.group(1) or m.group(2)
        if header is not None and header not in _OUR_HEADERS and not (m.group(2) and header in _STD_HEADERS):
            return no(f"#include of {header}")
        includes_ms = includes_ms or header == "ms_extension.h"
    if "\0" in tokens:
        return no("a raw string or character literal")
    for i, t in enumerate(tokens):
        if t == "pybind11" or (t == "py" and tokens[i + 1:i + 2] == ["::"]):
            return no("a pybind11 name")
        if t.startswith("PYBIND11_") and t != "PYBIND11_MODULE":
            return no(f"{t}")
        if t in _OWN_NAMES and ((tokens[i + 1:i + 2] in ([";"], ["="]) and tokens[i - 1:i] != ["::"])
                                or tokens[i - 1:i] in (["class"], ["struct"], ["union"], ["enum"])):
            return no(f"a declaration of {t}")
    module, functions, defined = None, {}, []
    scopes: List[Optional[str]] = []  # per open brace: its namespace, or None (a class, a function, ...)
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t == "PYBIND11_MODULE":
            if module is not None or scopes:
                return no("a second PYBIND11_MODULE, or one not at file scope")
            why, module, i = _parse_module(tokens, i)
            if why is not None:
                return no(why)
        elif t == "namespace" and i + 1 < len(tokens):
            j, path = i + 1, []
            while j < len(tokens) and tokens[j] not in ("{", ";"):
                path.append(tokens[j])
                j += 1
            if tokens[j:j + 1] != ["{"]:  # a namespace alias
                i = j + 1
                continue
            scopes.append("::".join(p for p in path if p != "::") or None)
            i = j
        elif t == "{":
            scopes.append(None)
        elif t == "}":
            if scopes:
                scopes.pop()
        elif t == "(" and i > 0 and re.fullmatch(r"[A-Za-z_]\w*", tokens[i - 1]) and all(scopes):
            close = _close(tokens, i, "(", ")")
            if close > 0 and tokens[close + 1:close + 2] == ["{"]:  # a definition at namespace scope
                start = i - 1
                while start > 0 and tokens[start - 1] not in (";", "}", "{"):
                    start -= 1
                head = [x for x in tokens[start:i - 1] if x not in ("static", "inline")]
                if "::" in tokens[i - 2:i - 1] or "template" in head:
                    head = ["template"]  # a member defined out of its class, or a template: not accepted
                ns = tuple(x for s in scopes for x in str(s).split("::"))
                ok = _type_kind(head) in _RETURN_KINDS and _params_ok(tokens[i + 1:close])
                key = ns + (tokens[i - 1],)
                functions[key] = ok and key not in functions
                defined.append(tokens[i - 1])
                scopes.append(None)  # the body
                i = close + 1
        i += 1
    if module is not None and not includes_ms:
        return no("PYBIND11_MODULE without #include \"ms_extension.h\"")
    return FileFacts(None, module, functions, tuple(defined))


def nanobind_safe(facts: Sequence[Tuple[str, FileFacts]]) -> Tuple[bool, str]:
    """(True, "") when the source set (file name, its facts) can be built with nanobind; else
    (False, the first reason it stays on pybind11)."""
    modules = [(n, f) for n, f in facts if f.module is not None]
    for name, f in facts:
        if f.why is not None:
            return False, f"{name}: {f.why}"
    if len(modules) != 1:
        return False, "not exactly one PYBIND11_MODULE"
    name, mod = modules[0]
    others = [d for n, f in facts if n != name for d in f.defined]
    for py_name, ref in mod.module or ():
        if not mod.functions.get(ref):
            return False, (f"{name}: {py_name}'s function {'::'.join(ref)} is not defined there "
                           f"with a signature both bindings convert alike")
        if ref[-1] in others or mod.defined.count(ref[-1]) != 1:
            return False, f"{'::'.join(ref)} is defined more than once"
    return True, ""
