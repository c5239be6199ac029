"""Building opbuilder's native runtime when opbuilder is installed (hatch_build.py runs ``build_native``):
nanobind's runtime and the core library, through the builder's pipeline, and the precompiled
``opbuilder/extension.h`` of a nanobind operator with the default options (pch.py), into
``opbuilder/_native/`` with their record (installed.py reads it)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Optional

from .installed import MANIFEST, RUNTIME_FILE, current_abi

__all__ = ["build_native", "build_pch"]

HEADER_NOT_PRECOMPILED = "opbuilder/extension.h was not precompiled at install time"


def build_native(dest: Path, verbose: bool = False) -> Dict[str, object]:
    """Compile nanobind's runtime and the core library for this Python and the compiler found (CXX, else
    c++ / g++ / clang++) into ``dest``, with their record (native.json); the record. The builds go
    through the builder's pipeline in a temporary cache."""
    from .. import builder as B
    from ..cache.file_hash import HASH, file_hash
    from ..tools.toolchain import find_compiler
    from .abi import cxx_abi, wheel_tag
    from .core_lib import CORE_FILE, core_spec
    from .nanobind_runtime import runtime_spec

    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="opbuilder-native-") as tmp:
        root = Path(tmp) / "cache"
        root.mkdir(mode=0o700)
        cxx = find_compiler(root)
        # the headers' digest before the builds read them: a header edited while they run leaves a record
        # that fits no headers, so load() builds its own (taken after, it would vouch for a mixed build)
        abi = current_abi(cxx_abi(cxx, root), root)
        specs = {RUNTIME_FILE: runtime_spec(root, verbose), CORE_FILE: core_spec(root, verbose)}
        with ThreadPoolExecutor(len(specs) + 1) as pool:  # side by side, as a first load() builds them
            built = {name: pool.submit(B.retrying, spec.name, lambda spec=spec: B._build_checked(spec))
                     for name, spec in specs.items()}
            pch = pool.submit(build_pch, dest, root, cxx, verbose)
            libs = {name: job.result().library for name, job in built.items()}
            try:
                pch_record = pch.result()
            except Exception as e:  # the runtime serves without it: the cache's PCH, built after the first build
                import sys
                print(f"opbuilder: {HEADER_NOT_PRECOMPILED}: {e}", file=sys.stderr)
                pch_record = None
        if pch_record is None:
            for f in ("pch.h", "pch.h.gch"):
                (dest / f).unlink(missing_ok=True)
        files, sizes = {}, {}
        for name, lib in libs.items():
            shutil.copyfile(lib, dest / (name + ".tmp"))
            os.replace(dest / (name + ".tmp"), dest / name)
            files[name] = file_hash(dest / name)
            sizes[name] = (dest / name).stat().st_size  # a shipped load checks these, not the hashes (installed.py)
        record = {"abi": abi, "tag": wheel_tag(), "files": files, "sizes": sizes, "hash": HASH,
                  "compiler": cxx.version}
        if pch_record is not None:
            record["pch"] = pch_record
    (dest / MANIFEST).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    from ..cache.shipped import record_copy  # its marshal copy, which a shipped load() reads (no _json)
    (dest / "native.rec").write_bytes(record_copy(record))
    return record


def build_pch(dest: Path, root: Path, cxx, verbose: bool = False) -> Optional[Dict[str, object]]:
    """Precompile ``opbuilder/extension.h`` as a nanobind operator with the default options compiles
    it (pch.py) into ``dest`` (``pch.h``, ``pch.h.gch``); its record for native.json, or None where
    none is made (not gcc, ``OPBUILDER_PCH=0``). A failed precompile is a ``BuildError`` with its
    output (build_native goes on without it)."""
    from .. import builder as B
    from ..cache.file_hash import file_hash
    from ..compile.binding import NANOBIND
    from ..errors import BuildError
    from ..spec import make_spec
    from . import pch as pchmod

    if cxx.family != "gcc" or not pchmod.enabled():
        return None
    src = root.parent / "opbuilder_pch.cpp"  # what its flags are planned for: a source that starts with the header
    src.write_text(f'#include "{pchmod.HEADER}"\n')
    spec = make_spec("opbuilder_pch", [src], "CPU", "module", None, None, None, None, False, verbose, root, NANOBIND)
    plan = B._plan(B._trusted(spec), cxx)
    header, gch = dest / "pch.h", dest / "pch.h.gch"
    header.write_text(pchmod.HEADER_TEXT)
    tmp = dest / "pch.h.gch.tmp"
    cmd = [*cxx.argv, *plan.pch_flags, "-x", "c++-header", str(header), "-o", str(tmp)]
    if verbose:
        print(" ".join(cmd), flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"precompiling {pchmod.HEADER} failed (exit {res.returncode})", name="opbuilder_pch",
                         log=res.stdout + res.stderr)
    os.replace(tmp, gch)
    return {"key": B.installed_pch_key(plan), "compiler": cxx.identity, "size": gch.stat().st_size,
            "hash": file_hash(gch)}
