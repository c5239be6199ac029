"""Hatch build hook: compile opbuilder's native runtime when opbuilder is installed.

``pip install .``, ``pip install -e .`` and ``pip wheel .`` run it. It builds nanobind's runtime and
the core library (opbuilder/native/installed.py, the same build code load() uses), and with gcc the
precompiled opbuilder/extension.h the first operator compiles with (opbuilder/native/pch.py), for the
Python that installs, against the limited API on Python >= 3.12, and puts them in ``opbuilder/_native/``: in the
wheel (tagged ``cp312-abi3-<platform>``, or ``cp311-cp311-<platform>`` on 3.11), or in the checkout
for an editable install. Without a working compiler the install still succeeds, as a pure wheel:
the first load() then builds the runtime (the JIT fallback), as before.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class NativeRuntimeHook(BuildHookInterface):
    """Builds opbuilder/_native/ (libnanobind.so, libobcore.so, pch.h and pch.h.gch, native.json) into
    the wheel."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or os.environ.get("OPBUILDER_SKIP_NATIVE", "") not in ("", "0"):
            return
        editable = version == "editable"
        if not editable:  # the files go into the wheel from a directory removed once it is written (finalize)
            self._scratch = tempfile.mkdtemp(prefix="opbuilder-wheel-")
        dest = Path(self.root, "opbuilder", "_native") if editable else Path(self._scratch) / "_native"
        sys.path.insert(0, self.root)  # the opbuilder being installed, not one already installed
        start = time.perf_counter()
        try:
            from opbuilder.native.abi import wheel_tag
            from opbuilder.native.install_build import build_native
            build_native(dest)
        except Exception as e:  # no compiler, no nanobind: install anyway; load() builds it (JIT fallback)
            self.app.display_warning(f"opbuilder: its native runtime was not built ({type(e).__name__}: {e}); "
                                     f"the first load() of an operator builds it instead")
            return
        finally:
            sys.path.remove(self.root)
        self.app.display_info(f"opbuilder: built its native runtime into {dest} in "
                              f"{time.perf_counter() - start:.1f} s")
        build_data["pure_python"] = False
        build_data["tag"] = wheel_tag()
        if not editable:
            for f in sorted(dest.iterdir()):
                build_data["force_include"][str(f)] = f"opbuilder/_native/{f.name}"

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:  # the wheel holds its copies now (~80 MB, left in /tmp on every build before)
            shutil.rmtree(scratch, ignore_errors=True)
            self._scratch = None
