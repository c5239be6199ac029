"""What the NVIDIA driver says about this machine's GPUs, through ``nvidia-smi``.

``device_archs`` is asked by nvcc builds that choose no architecture
themselves. Its answer is remembered in the cache's probe records
(probe_cache.py) against nvidia-smi's stamp and the GPUs the kernel driver
lists under ``/proc/driver/nvidia/gpus``, so only the first build (or one
after a driver or GPU change) runs nvidia-smi; a warm load runs nothing.
``driver_info`` is for ``doctor`` only.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import List, Optional, Tuple

from .probe_cache import remembered
from .toolchain import which

__all__ = ["device_archs", "driver_info"]

_GPUS = "/proc/driver/nvidia/gpus"
_CAP = re.compile(r"\d+\.\d+")


def _gpus_fingerprint() -> str:
    """A digest of the GPUs the loaded kernel driver lists (model, bus), or "none": no process, a few reads."""
    try:
        entries = sorted(os.listdir(_GPUS))
    except OSError:
        return "none"
    h = hashlib.sha256()
    for e in entries:
        h.update(e.encode() + b"\0")
        try:
            with open(os.path.join(_GPUS, e, "information"), "rb") as f:
                h.update(f.read(4096))
        except OSError:
            pass
    return h.hexdigest()[:16]


def _run(argv: List[str]) -> Tuple[int, str]:
    import subprocess
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return -1, str(e)
    return res.returncode, res.stdout + res.stderr


def device_archs(state_dir: Optional[Path]) -> Tuple[str, ...]:
    """The distinct compute capabilities ("9.0") of the GPUs nvidia-smi lists; () without nvidia-smi,
    a driver or a GPU."""
    smi = which("nvidia-smi")
    if smi is None:
        return ()

    def probe():
        code, out = _run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"])
        caps = sorted({ln.strip() for ln in out.splitlines() if _CAP.fullmatch(ln.strip())}) if code == 0 else []
        return {"caps": caps}, [smi]

    facts = remembered(state_dir, f"gpu compute caps {smi} gpus={_gpus_fingerprint()}", probe, inputs=[smi],
                       schema={"caps": list})
    return tuple(str(c) for c in facts["caps"])  # type: ignore[union-attr]


def driver_info() -> Tuple[Optional[str], Optional[str], str]:
    """(driver version, the newest CUDA version it runs, how that was found or why not): nvidia-smi's
    header, else the kernel module's version file."""
    smi = which("nvidia-smi")
    if smi is not None:
        code, out = _run([smi])
        drv = re.search(r"Driver Version:\s*([\d.]+)", out)
        cuda = re.search(r"CUDA Version:\s*([\d.]+)", out)
        if code == 0 and drv:
            return drv.group(1), cuda.group(1) if cuda else None, smi
        why = f"{smi} failed: {out.strip().splitlines()[0] if out.strip() else f'exit {code}'}"
    else:
        why = "nvidia-smi not found"
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module\s+([\d.]+)", f.read())
        if m:
            return m.group(1), None, "/proc/driver/nvidia/version"
    except OSError:
        pass
    return None, None, why
