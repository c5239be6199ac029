"""The C structs of include/opbuilder/detail/backend_abi.h (which backend.h includes), as ctypes
sees them (change both together).

A plugin library and the runtime share nothing but these layouts and the
function-pointer types below; ``OB_BACKEND_ABI`` is checked when a library is
initialized.
"""
from __future__ import annotations

import ctypes as C

__all__ = ["ABI", "Tensor", "Ref", "Attr", "ConstRec", "NodeRec", "GraphRec", "Option", "Config", "Run",
           "Host", "BackendRec", "INIT", "REF_INPUT", "REF_CONST", "REF_OUTPUT", "ATTR", "CONST_TENSOR",
           "CONST_NUMBER", "CONST_OTHER"]

ABI = 1
REF_INPUT, REF_CONST, REF_OUTPUT = 0, 1, 2
ATTR = {"none": 0, "int": 1, "float": 2, "bool": 3, "str": 4, "ints": 5, "floats": 6, "other": 7}
CONST_TENSOR, CONST_NUMBER, CONST_OTHER = 0, 1, 2


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_char_p), ("ndim", C.c_int32),
                ("shape", C.POINTER(C.c_int64)), ("handle", C.c_int64)]


class Ref(C.Structure):
    _fields_ = [("kind", C.c_int32), ("index", C.c_int32), ("node", C.c_int32)]


class Attr(C.Structure):
    _fields_ = [("name", C.c_char_p), ("kind", C.c_int32), ("count", C.c_int32), ("i", C.c_int64),
                ("f", C.c_double), ("ints", C.POINTER(C.c_int64)), ("floats", C.POINTER(C.c_double)),
                ("text", C.c_char_p)]


class ConstRec(C.Structure):
    _fields_ = [("kind", C.c_int32), ("number", C.c_double), ("meta", Tensor), ("text", C.c_char_p)]


class NodeRec(C.Structure):
    _fields_ = [("id", C.c_int32), ("op", C.c_char_p), ("kind", C.c_char_p), ("ninputs", C.c_int32),
                ("inputs", C.POINTER(Ref)), ("nattrs", C.c_int32), ("attrs", C.POINTER(Attr)),
                ("noutputs", C.c_int32), ("outputs", C.POINTER(Tensor))]


class GraphRec(C.Structure):
    _fields_ = [("name", C.c_char_p), ("handle", C.c_int64), ("ninputs", C.c_int32), ("inputs", C.POINTER(Tensor)),
                ("nconsts", C.c_int32), ("consts", C.POINTER(ConstRec)), ("nnodes", C.c_int32),
                ("nodes", C.POINTER(NodeRec)), ("noutputs", C.c_int32), ("outputs", C.POINTER(Ref))]


class Option(C.Structure):
    _fields_ = [("key", C.c_char_p), ("value", C.c_char_p)]


class Config(C.Structure):
    _fields_ = [("jit_level", C.c_char_p), ("noptions", C.c_int32), ("options", C.POINTER(Option))]


class Run(C.Structure):
    _fields_ = [("ctx", C.c_void_p), ("ninputs", C.c_int32), ("inputs", C.POINTER(Tensor)),
                ("noutputs", C.c_int32), ("outputs", C.POINTER(Tensor))]


BUILD_BUILTIN = C.CFUNCTYPE(C.c_int, C.POINTER(GraphRec), C.c_char_p, C.POINTER(Config), C.POINTER(C.c_uint64))
RUN_BUILTIN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_uint64, C.c_int32, C.POINTER(Tensor), C.c_int32,
                          C.POINTER(C.c_int32), C.POINTER(Tensor))
RUN_NODE = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int32, C.POINTER(Tensor), C.POINTER(Tensor))
ALLOC = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_char_p, C.c_int32, C.POINTER(C.c_int64), C.POINTER(Tensor))
GET_CONST = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int32, C.POINTER(Tensor))


class Host(C.Structure):
    _fields_ = [("abi", C.c_uint32), ("verbose", C.c_int32), ("build_builtin", BUILD_BUILTIN),
                ("run_builtin", RUN_BUILTIN), ("run_node", RUN_NODE), ("alloc", ALLOC), ("get_const", GET_CONST)]


BUILD = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(GraphRec), C.POINTER(Config), C.POINTER(C.c_uint64),
                    C.c_char_p, C.c_int64)
RUN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_uint64, C.POINTER(Run), C.c_char_p, C.c_int64)


class BackendRec(C.Structure):
    _fields_ = [("name", C.c_char_p), ("self", C.c_void_p), ("differentiable", C.c_int32), ("build", BUILD),
                ("run", RUN)]


# int opbuilder_backend_init(uint32_t abi, const ob_host *host, const ob_backend **table, int32_t *count)
INIT = (C.c_int, [C.c_uint32, C.POINTER(Host), C.POINTER(C.POINTER(BackendRec)), C.POINTER(C.c_int32)])
