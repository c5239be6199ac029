"""The cache directory: where it is, and whether it is safe to trust.

``OPBUILDER_CACHE_DIR`` (default ``~/.cache/opbuilder``). Directories are
created mode 0700. A cache directory that another user owns, or that group or
others can write to, is refused: anyone who can write there could plant a
library that we would load.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional, Union

from .errors import UnsafeCacheDirError

__all__ = ["cache_root", "ensure_private_dir", "check_private_dir"]


def cache_root(override: Optional[Union[str, os.PathLike]] = None) -> Path:
    if override is not None:
        return Path(override).expanduser().absolute()
    env = os.environ.get("OPBUILDER_CACHE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    return Path.home() / ".cache" / "opbuilder"


def check_private_dir(path: Path) -> None:
    """Raise UnsafeCacheDirError unless ``path`` is ours and not group/other-writable."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheDirError(f"opbuilder cache path {path} is not a directory")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise UnsafeCacheDirError(
            f"opbuilder cache directory {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); "
            f"nothing is built or loaded from it. Set OPBUILDER_CACHE_DIR to a directory of your own.")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheDirError(
            f"opbuilder cache directory {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"nothing is built or loaded from it. Fix: chmod 700 {path}")


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (0700) if missing, then check it."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=False)
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o700)
    check_private_dir(path)
    return path
