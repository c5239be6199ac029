"""Command line: ``python -m opbuilder <command>`` (also installed as ``opbuilder``).

  build NAME SOURCE... [--backend CPU|GPU] ...   build into the cache now (prebuild for deployment);
                                                 with --into DIR, also into a prebuilt store
  export NAME... -o FILE.tar                     the cache's builds of operators, as a bundle
  import FILE.tar [--into DIR]                   a bundle's builds, into a store (default: the cache)
  cache list [NAME]                              what is cached, and how big
  cache clean [NAME]                             delete one operator's builds, or the whole cache
  doctor                                         check compiler, ninja, pybind11, cache dir; say how to fix;
                                                 which operators are shipped and which were JIT-built
  wheel PKGDIR [-w DIR]                          a package's wheel with its operators built in (build_meta)
  demo [--ms-style]                              the design's example, end to end
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import List, Optional

__all__ = ["main", "build_parser"]


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    run_demo(source="ms_style_ops.cpp" if args.ms_style else "function_ops.cpp",
             name="ms_ops" if args.ms_style else "my_ops")
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    kw = dict(backend=args.backend, include_paths=args.include or None, cflags=args.cflags,
              ldflags=args.ldflags, build_dir=args.cache_dir, debug_mode=args.debug, verbose=args.verbose)
    if args.into is None:
        return _build(args, kw, None)
    from pathlib import Path

    from .fleet.store import filling
    with filling(Path(args.into)) as into:  # refused before compiling, if it is not ours or others can write it
        return _build(args, kw, into)


def _build(args: argparse.Namespace, kw: dict, into) -> int:
    """``build``'s work: the operator (or ``--library``) built, and installed into the store ``into``."""
    from .builder import build_library
    from . import CustomOpBuilder

    deps = []
    if args.library:
        path = build_library(args.name, args.sources, **kw)
    else:
        builder = CustomOpBuilder(args.name, args.sources, **kw)
        path = builder.build()
        # what the operator loads first: nanobind's shared runtime and the core library
        deps = [d for d in (builder.runtime_library(), builder.core_library()) if d is not None]
    if into is not None:
        from pathlib import Path

        from .fleet.store import install
        for extra in deps:
            dep = Path(extra)
            install(dep.parent.parent, dep.parent.name, into, _owner_of(dep.parent.parent))
        lib = Path(path)
        path = str(install(lib.parent.parent, lib.parent.name, into, _owner_of(lib.parent.parent)))
        from .cache.cache_dir import cache_root
        from .tools.probe_cache import share
        share(cache_root(args.cache_dir), into)  # the toolchain facts: a new cache on this node probes nothing
    print(path)
    return 0


def _owner_of(op_dir) -> int:
    """Who owns the operator directory a build came from: the cache (us) or a prebuilt store."""
    return os.lstat(op_dir).st_uid


def _cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .fleet.bundle import export_bundle
    from .cache.cache_dir import cache_root
    from .cache.trust import trusted_root

    root = trusted_root(cache_root(args.cache_dir), create=False)
    members = export_bundle(root, args.names, Path(args.output).absolute())
    print(f"wrote {args.output}: {sum(1 for m in members if m.endswith('.so'))} build(s) of "
          f"{', '.join(args.names)}")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .fleet.bundle import import_bundle
    from .cache.cache_dir import cache_root
    from .fleet.store import filling
    from .cache.trust import trusted_root

    if args.into:
        with filling(Path(args.into)) as store:
            libs = import_bundle(Path(args.bundle), store)
    else:
        libs = import_bundle(Path(args.bundle), trusted_root(cache_root(args.cache_dir)), cache=True)
    for lib in libs:
        print(lib)
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from .cache.cache_dir import cache_root, dir_size, list_operators, remove_operator
    from .cache.trust import trusted_root

    root = cache_root(args.cache_dir)
    if root.exists():
        trusted_root(root, create=False)  # refuse to report on (or delete from) a directory others can write
    ops = list_operators(root, args.name)
    if args.name is not None and not ops:
        print(f"opbuilder: nothing cached for operator '{args.name}' in {root}", file=sys.stderr)
        return 1
    if args.action == "list":
        print(f"cache: {root}")
        for op in ops:
            newest = op.builds[0] if op.builds else None
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(newest["built_at"])) if newest else "-"
            print(f"{op.name:24s} {op.kind:8s} {len(op.builds)} build(s)  newest {when}  {_size(op.size)}")
            for b in op.builds if args.name else op.builds[:1]:
                print(f"    {b['key']}  {b.get('library') or '(no library)'}")
                print(f"        sources: {' '.join(b.get('sources', []))}")
                if b.get("binding"):
                    print(f"        binding: {b['binding']}")
        pch = root / ".pch"
        if args.name is None and pch.is_dir():
            n = sum(1 for d in pch.iterdir() if d.is_dir())
            print(f"precompiled headers: {n}  {_size(dir_size(pch))}")
        if args.name is None:
            print(f"total: {_size(dir_size(root)) if root.exists() else '0 B'}")
        return 0
    # clean
    freed, busy, kept = 0, [], []
    import shutil

    from .cache.lock import try_lock
    # opbuilder's own libraries (nanobind's runtime, the core library, the bridges: "_" names), which every
    # operator's build links and its load preloads, and the shared files go only when no build is running:
    # each lock is looked at first, before anything is removed
    running = False
    for op in ops:
        with try_lock(op.path) as free:
            running = running or not free
    for op in ops:
        if op.name.startswith("_") and running and args.name is None:
            kept.append(op.name)
            continue
        size = op.size
        if remove_operator(op):
            freed += size
            print(f"removed {op.path}")
            sources = root / "inline" / op.name  # the sources load_inline wrote for it
            if args.name is not None and sources.is_dir() and not sources.is_symlink():
                freed += dir_size(sources)
                shutil.rmtree(sources, ignore_errors=True)
                print(f"removed {sources}")
        else:
            busy.append(op.name)
    if args.name is None and root.exists() and not running and not busy:  # a running build reads them
        for extra in (root / ".pch", root / "toolchains.json", root / "inline"):
            if extra.exists():
                freed += dir_size(extra) if extra.is_dir() else extra.stat().st_size
                shutil.rmtree(extra, ignore_errors=True) if extra.is_dir() else extra.unlink(missing_ok=True)
                print(f"removed {extra}")
    print(f"freed {_size(freed)}")
    if busy or kept:
        busy = busy or ["an operator"]
        shared = ", ".join(kept + [".pch", "toolchains.json", "inline"]) if args.name is None else ""
        print(f"opbuilder: skipped {', '.join(busy)}: being built by another process right now"
              + (f"; kept {shared}, which that build uses" if shared else "")
              + "; run the command again when it is done", file=sys.stderr)
        return 1
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .diagnose.doctor import run_checks

    checks = run_checks()
    for c in checks:
        for line in c.lines():
            print(line)
    errors = [c for c in checks if c.status == "error"]
    print(f"{len(errors)} problem(s) found" if errors else "everything a build needs is here")
    return 1 if errors else 0


def wheel_command(pkgdir: str, wheel_dir: str) -> List[str]:
    """The pip command that builds the package in directory ``pkgdir`` into ``wheel_dir``. Both are given to
    pip as absolute paths: a bare relative name (``pkg``) would be read by pip as a project to download from
    the index, not as this directory."""
    from pathlib import Path
    return [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w",
            str(Path(wheel_dir).resolve()), str(Path(pkgdir).resolve())]


def _cmd_wheel(args: argparse.Namespace) -> int:
    """``pip wheel --no-build-isolation --no-deps PKGDIR -w DIR``: the package's build-backend
    (opbuilder.build_meta) compiles its operators into the wheel with this Python and this opbuilder."""
    import subprocess
    from pathlib import Path

    pkg = Path(args.pkgdir)
    if not (pkg / "pyproject.toml").is_file():
        raise FileNotFoundError(f"{pkg} has no pyproject.toml: give the directory of a package whose "
                                f"pyproject.toml names build-backend = \"opbuilder.build_meta\" (docs/shipping.md)")
    out = Path(args.wheel_dir).resolve()
    before = {p: p.stat().st_mtime_ns for p in out.glob("*.whl")} if out.is_dir() else {}
    cmd = wheel_command(args.pkgdir, args.wheel_dir)
    res = subprocess.run(cmd, stdout=None if args.verbose else subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        print(res.stdout or "", end="", file=sys.stderr)
        print(f"opbuilder: error: {' '.join(cmd)} exited with status {res.returncode}", file=sys.stderr)
        return 1
    for wheel in sorted(p for p in out.glob("*.whl") if before.get(p) != p.stat().st_mtime_ns):
        print(f"opbuilder: wrote {wheel}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m opbuilder", description="JIT builder for C++ tensor operators")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("build", help="build an operator into the cache now (prebuild for deployment)")
    b.add_argument("name", metavar="NAME", help="operator (module) name, a Python identifier")
    b.add_argument("sources", metavar="SOURCE", nargs="+", help="C++ (.cpp/.cc/...) or, with GPU, .cu sources")
    b.add_argument("--backend", default="CPU", help="CPU (default) or GPU")
    b.add_argument("-I", "--include", action="append", default=[], metavar="DIR", help="an include path")
    b.add_argument("--cflags", default=None, help="extra compiler flags, one string")
    b.add_argument("--ldflags", default=None, help="extra linker flags, one string")
    b.add_argument("--library", action="store_true", help="a plain shared library (build_library), not a module")
    b.add_argument("--debug", action="store_true", help="-O0 -g instead of -O2")
    b.add_argument("--verbose", action="store_true", help="show the commands")
    b.add_argument("--cache-dir", default=None, help="cache directory (default: $OPBUILDER_CACHE_DIR)")
    b.add_argument("--into", default=None, metavar="DIR",
                   help="also install the build into this prebuilt store (for OPBUILDER_PREBUILT_DIR)")
    b.set_defaults(func=_cmd_build)

    x = sub.add_parser("export", help="write the cache's builds of operators into a bundle (a tar file)")
    x.add_argument("names", metavar="NAME", nargs="+", help="operators (modules and --library builds)")
    x.add_argument("-o", "--output", required=True, metavar="FILE.tar", help="the bundle to write")
    x.add_argument("--cache-dir", default=None, help="cache directory (default: $OPBUILDER_CACHE_DIR)")
    x.set_defaults(func=_cmd_export)

    m = sub.add_parser("import", help="install a bundle's builds into a prebuilt store or the cache")
    m.add_argument("bundle", metavar="FILE.tar")
    m.add_argument("--into", default=None, metavar="DIR", help="a prebuilt store (default: the cache)")
    m.add_argument("--cache-dir", default=None, help="cache directory (default: $OPBUILDER_CACHE_DIR)")
    m.set_defaults(func=_cmd_import)

    c = sub.add_parser("cache", help="list or clean the cache")
    c.add_argument("action", choices=["list", "clean"])
    c.add_argument("name", metavar="NAME", nargs="?", default=None, help="one operator (default: all)")
    c.add_argument("--cache-dir", default=None, help="cache directory (default: $OPBUILDER_CACHE_DIR)")
    c.set_defaults(func=_cmd_cache)

    d = sub.add_parser("doctor", help="check the compiler, ninja, pybind11 and the cache directory")
    d.set_defaults(func=_cmd_doctor)

    w = sub.add_parser("wheel", help="build a package's wheel with its operators compiled in (opbuilder.build_meta)")
    w.add_argument("pkgdir", metavar="PKGDIR", help="the package's directory (its pyproject.toml)")
    w.add_argument("-w", "--wheel-dir", default="dist", metavar="DIR", help="where to write the wheel (default: dist)")
    w.add_argument("--verbose", action="store_true", help="show pip's output")
    w.set_defaults(func=_cmd_wheel)

    e = sub.add_parser("demo", help="build the example operator and take its gradient inside an nn.Cell")
    e.add_argument("--ms-style", action="store_true", help="use the MindSpore-style source (ms_extension.h)")
    e.set_defaults(func=_cmd_demo)
    return p


def _reader_gone() -> int:
    """stdout's reader closed the pipe (``cache list | head``): stop quietly, with the status of a
    command ended by SIGPIPE, and point stdout at /dev/null so the interpreter's last flush does not fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def main(argv: Optional[List[str]] = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        status = args.func(args)
        sys.stdout.flush()  # a reader that went away shows here, not in the flush at exit
        return status
    except BrokenPipeError:
        return _reader_gone()
    except Exception as e:  # a CLI prints the error, not a traceback
        from .errors import BuildError, UnsafeCacheDirError
        if isinstance(e, (BuildError, UnsafeCacheDirError, FileNotFoundError, ValueError, TypeError)):
            print(f"opbuilder: error: {e}", file=sys.stderr)
            return 1
        if isinstance(e, OSError):  # a file that cannot be written (permissions, a full disk): named, no traceback
            print(f"opbuilder: error: {e.strerror or e}: {e.filename}", file=sys.stderr)
            return 1
        raise
