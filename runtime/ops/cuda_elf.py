"""Does a shared library use CUDA? A cheap read of its ELF headers, no loading, no CUDA.

An aot library built by nvcc expects device pointers: handed host tensors its
kernel launch fails or, worse, runs on garbage. ``cuda_use(path)`` says why a
library counts as CUDA code, from what any nvcc build leaves behind: device
code in a ``.nv_fatbin`` section (nvcc's default, with the CUDA runtime linked
statically) or a dynamic dependency on the CUDA runtime or driver library
(``-cudart shared``, or a host library that calls CUDA). Only the section
headers and the ``.dynamic`` table are read (a few kilobytes).
"""
from __future__ import annotations

import struct
from typing import List, Optional, Tuple

__all__ = ["cuda_use"]

_DEVICE_SECTIONS = (".nv_fatbin", "__nv_relfatbin", ".nvFatBinSegment")
_CUDA_LIBS = ("libcudart.so", "libcuda.so")
_SHT_DYNAMIC = 6
_DT_NEEDED = 1


def cuda_use(path: str) -> Optional[str]:
    """Why ``path`` is CUDA code ("carries device code (.nv_fatbin)", "links libcudart.so.13"), or None.

    None also for a file that is not a 64-bit little-endian ELF (nothing is claimed about it).
    """
    try:
        with open(path, "rb") as f:
            sections = _sections(f)
            if sections is None:
                return None
            names = [name for name, *_ in sections]
            for wanted in _DEVICE_SECTIONS:
                if wanted in names:
                    return f"carries device code ({wanted})"
            for lib in _needed(f, sections):
                if lib.startswith(_CUDA_LIBS):
                    return f"links {lib}"
    except OSError:
        return None
    return None


Section = Tuple[str, int, int, int, int]  # name, type, offset, size, link


def _sections(f) -> Optional[List[Section]]:
    head = f.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    if shoff == 0 or shnum == 0 or shentsize < 64 or shstrndx >= shnum:
        return None
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    raw = []
    for i in range(shnum):
        name, kind, _flags, _addr, offset, size, link = struct.unpack_from("<IIQQQQI", table, i * shentsize)
        raw.append((name, kind, offset, size, link))
    strtab = _read(f, raw[shstrndx][2], raw[shstrndx][3])
    return [(_cstr(strtab, n), kind, off, size, link) for n, kind, off, size, link in raw]


def _needed(f, sections: List[Section]) -> List[str]:
    out = []
    for _name, kind, off, size, link in sections:
        if kind != _SHT_DYNAMIC or link >= len(sections):
            continue
        dynstr = _read(f, sections[link][2], sections[link][3])
        dyn = _read(f, off, size)
        for i in range(0, len(dyn) - 15, 16):
            tag, val = struct.unpack_from("<qQ", dyn, i)
            if tag == 0:
                break
            if tag == _DT_NEEDED:
                out.append(_cstr(dynstr, val))
    return out


def _read(f, offset: int, size: int) -> bytes:
    f.seek(offset)
    return f.read(min(size, 1 << 24))


def _cstr(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return table[offset:end if end >= 0 else len(table)].decode("latin-1")
