"""Command line: ``python -m opbuilder <command>``."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

__all__ = ["main"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    run_demo(source="ms_style_ops.cpp" if args.ms_style else "function_ops.cpp",
             name="ms_ops" if args.ms_style else "my_ops")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m opbuilder", description="JIT builder for C++ tensor operators")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    d = sub.add_parser("demo", help="build the example operator and take its gradient inside an nn.Cell")
    d.add_argument("--ms-style", action="store_true", help="use the MindSpore-style source (ms_extension.h)")
    d.set_defaults(func=_cmd_demo)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as e:  # a CLI prints the error, not a traceback
        from .errors import BuildError, UnsafeCacheDirError
        if isinstance(e, (BuildError, UnsafeCacheDirError, FileNotFoundError, ValueError)):
            print(f"opbuilder: error: {e}", file=sys.stderr)
            return 1
        raise
