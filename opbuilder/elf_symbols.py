"""The names a shared library exports, read from its ELF dynamic symbol table (no process, no nm).

Used on error paths only: when a built module has no ``PyInit_<name>``, the
``PyInit_`` functions it does define say which module name its source declared.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import List

__all__ = ["exported_functions"]

_SHT_DYNSYM = 11
_STT_FUNC = 2
_SHN_UNDEF = 0


def exported_functions(path: Path, prefix: str = "") -> List[str]:
    """Names of the functions ``path`` defines in its dynamic symbol table that start with ``prefix``;
    empty if the file is not a readable 64-bit little-endian ELF file."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # ELFCLASS64, ELFDATA2LSB
        return []
    try:
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        out = []
        for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
            if kind != _SHT_DYNSYM or not entsize:
                continue
            strtab = sections[link][4]
            for k in range(size // entsize):
                st_name, st_info, _other, st_shndx, _value, _size = struct.unpack_from(
                    "<IBBHQQ", data, offset + k * entsize)
                if st_shndx == _SHN_UNDEF or st_info & 0xF != _STT_FUNC:
                    continue
                end = data.index(b"\0", strtab + st_name)
                name = data[strtab + st_name:end].decode(errors="replace")
                if name.startswith(prefix):
                    out.append(name)
        return out
    except (struct.error, IndexError, ValueError):
        return []
