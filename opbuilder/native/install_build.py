"""Building opbuilder's native runtime when opbuilder is installed (hatch_build.py runs ``build_native``):
nanobind's runtime and the core library, through the builder's pipeline, into ``opbuilder/_native/``
with their record (installed.py reads it)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict

from .installed import MANIFEST, RUNTIME_FILE, current_abi

__all__ = ["build_native"]


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
        specs = {RUNTIME_FILE: runtime_spec(root, verbose), CORE_FILE: core_spec(root, verbose)}
        with ThreadPoolExecutor(len(specs)) as pool:  # side by side, as a first load() builds them
            built = {name: pool.submit(B.retrying, spec.name, lambda spec=spec: B._build_checked(spec))
                     for name, spec in specs.items()}
            libs = {name: job.result().library for name, job in built.items()}
        files = {}
        for name, lib in libs.items():
            shutil.copyfile(lib, dest / (name + ".tmp"))
            os.replace(dest / (name + ".tmp"), dest / name)
            files[name] = file_hash(dest / name)
        record = {"abi": current_abi(cxx_abi(cxx, root), root), "tag": wheel_tag(), "files": files, "hash": HASH,
                  "compiler": cxx.version}
    (dest / MANIFEST).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record
