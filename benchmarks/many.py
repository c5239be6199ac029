"""Many operators at once (issue 36): load_many against torch.utils.cpp_extension.load_inline.

    python benchmarks/many.py [--rounds 3] [--items 40] [--torch-items 3] [--no-torch] [--no-cuda] [--only-cuda]

Rows, each measured in a new Python process that times only the building calls (the framework is
imported first), interleaved round by round (the order rotated each round), each figure the median of
the rounds with the min-max:
  C++ cold      ``--items`` distinct small inline operators (one function each) built by one
                ``load_many(jobs=2)``, per item: wall time of the call / items. The cache's shared state is
                warm (toolchain probe, nanobind's runtime, the core library, the PCH), as in a harness
                after its first operator; every round's operators are new (a round number in the source).
  torch C++     ``--torch-items`` of the same operators, each a ``load_inline`` (one after the other, as
                it builds), per item; its projection to ``--items`` is per item x items.
  CUDA compile  a vector add in KernelBench's style (a ``__global__`` add and its launcher) compiled for
                ``--cuda-arch`` (default 8.0) with no GPU: ``load_many([Inline(..., cuda_sources=...)])``
                against ``load_inline(cuda_sources=...)`` with ``TORCH_CUDA_ARCH_LIST`` set to the same. The
                launcher takes ``torch::Tensor`` on torch's side, as KernelBench's do; on ours the same kernel
                with a pointer launcher (opbuilder operators do not link libtorch). Both compile for the one
                architecture (``-gencode=arch=compute_80,code=sm_80``): ours at -O2 and C++17, torch's with
                its defaults (no -O, C++20); the rules are printed. torch's CPU wheel leaves
                ``cpp_extension.CUDA_HOME`` None, so its ``load_inline`` refuses CUDA before compiling: the
                child sets it to torch's own ``_find_cuda_home()`` (what a CUDA wheel does), and nothing
                else. Its build then compiles both sources and fails at the link (no ``libc10_cuda``), so
                its time to that failure is a lower bound of its build time, and the ratio against it an
                upper bound of ours (ours counts the link and the import too). CPU time (the process and
                the children it waited for) stands beside the wall time. ``--only-cuda``: these rows alone.
  warm          ``load_many`` of the ``--items`` cached operators of the last round, in a new process (wall, and
                the process's CPU time: on a loaded machine the wall time waits for a core), beside its floor:
                the same libraries imported directly by a new process, after the ones they load first.
Goals (issue 36): C++ cold at most 1.2 s per item; CUDA compile at most 0.2x torch's; warm at most 40 ms (with
its ratio to the floor and the load average on the goal line).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import Report, Stat, ratio  # noqa: E402

COLD_GOAL_S = 1.2  # per item, 40 distinct C++ items, load_many(jobs=2), 2 cores
CUDA_GOAL = 0.2  # opbuilder's CUDA compile over torch's
WARM_GOAL_S = 0.040  # 40 cached items in a new process

# one small inline operator, as a harness generates them; {k} makes each distinct, {r} each round's new
CPP = "double scale_{k}(double x) {{ return {k}.5 * x + {r}; }}\n"

OB_CHILD = """
import json, sys, time
from opbuilder import Inline, load_many
kind, rnd, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
CPP = %r
items = [Inline(f"many_{k}_r{rnd}", CPP.format(k=k, r=rnd), functions=[f"scale_{k}"]) for k in range(n)]
t0, c0 = time.perf_counter(), time.process_time()
results = load_many(items, jobs=2 if kind == "cold" else None)
t1, c1 = time.perf_counter(), time.process_time()
bad = [str(r.error) for r in results if r.error is not None]
assert not bad, bad[0]
assert getattr(results[-1].module, f"scale_{n - 1}")(2.0) == (n - 1 + 0.5) * 2 + rnd
from opbuilder import importer
pre = [str(p) for p in [importer.loaded_runtime(), *importer.loaded_cores()] if p]
print(json.dumps({"seconds": t1 - t0, "cpu": c1 - c0, "libs": [[r.module.__name__, r.module.__file__] for r in results],
                  "preload": pre}))
""" % CPP
# the floor of a warm load_many: the same libraries imported directly, after the ones they load first
FLOOR_CHILD = """
import ctypes, importlib.machinery, importlib.util, json, sys, time
import opbuilder
libs, pre = json.loads(sys.argv[1]), json.loads(sys.argv[2])
t0, c0 = time.perf_counter(), time.process_time()
for lib in pre:
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
for name, path in libs:
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    m = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(name, loader, origin=path))
    loader.exec_module(m)
t1, c1 = time.perf_counter(), time.process_time()
print(json.dumps({"seconds": t1 - t0, "cpu": c1 - c0}))
"""

TORCH_CHILD = """
import json, sys, time
import torch
from torch.utils import cpp_extension
rnd, n, build = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
CPP = %r
SAME_FLAGS = ["-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic"]  # opbuilder's optimisation flags
t0 = time.perf_counter()
for k in range(n):
    d = f"{build}/t{k}"
    import os; os.makedirs(d, exist_ok=True)
    m = cpp_extension.load_inline(f"tmany_{k}_r{rnd}", CPP.format(k=k, r=rnd), functions=[f"scale_{k}"],
                                  build_directory=d, extra_cflags=SAME_FLAGS, verbose=False)
t1 = time.perf_counter()
assert getattr(m, f"scale_{n - 1}")(2.0) == (n - 1 + 0.5) * 2 + rnd
print(json.dumps({"seconds": (t1 - t0) / n}))
""" % CPP

# a vector add in KernelBench's style (its samples pair a __global__ kernel with a torch::Tensor launcher),
# written here: what a harness hands torch's load_inline
KB_CUDA = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void vector_add_kernel(const float *a, const float *b, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b) {
  auto out = torch::empty_like(a);
  int n = static_cast<int>(a.numel());
  int threads = 256, blocks = (n + threads - 1) / threads;
  vector_add_kernel<<<blocks, threads>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
  return out;
}
"""
KB_CPP = "torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b);"
# the same kernel, its launcher on raw device pointers (opbuilder operators do not link libtorch)
OB_CUDA = """
#include <cstdint>
#include <cuda_runtime.h>

__global__ void vector_add_kernel(const float *a, const float *b, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

void elementwise_add_cuda(std::uintptr_t a, std::uintptr_t b, std::uintptr_t out, int n) {
  int threads = 256, blocks = (n + threads - 1) / threads;
  vector_add_kernel<<<blocks, threads>>>(reinterpret_cast<const float *>(a), reinterpret_cast<const float *>(b),
                                         reinterpret_cast<float *>(out), n);
}
"""
OB_CUDA_CPP = ("#include <cstdint>\n"
               "void elementwise_add_cuda(std::uintptr_t a, std::uintptr_t b, std::uintptr_t out, int size);")

# CPU of a process and of every child it waited for (ninja, and the compilers ninja waited for)
CPU_NOW = ("import resource, time\n"
           "def cpu_now():\n"
           "    c = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
           "    return time.process_time() + c.ru_utime + c.ru_stime\n")

OB_CUDA_CHILD = CPU_NOW + """
import json, sys, time
from opbuilder import Inline, load_many
rnd, arch = int(sys.argv[1]), sys.argv[2]
CUDA, CPP = %r, %r
t0, c0 = time.perf_counter(), cpu_now()
[r] = load_many([Inline(f"vadd_r{rnd}", CPP, functions=["elementwise_add_cuda"],
                        cuda_sources=CUDA + f"// round {rnd}\\n", cuda_arch=arch)])
t1, c1 = time.perf_counter(), cpu_now()
assert r.error is None, str(r.error)
assert r.module.__file__, "imported"
print(json.dumps({"seconds": t1 - t0, "cpu": c1 - c0}))
""" % (OB_CUDA, OB_CUDA_CPP)

TORCH_CUDA_CHILD = CPU_NOW + """
import json, sys, time
import torch
from torch.utils import cpp_extension
rnd, build = int(sys.argv[1]), sys.argv[2]
CUDA, CPP = %r, %r
home_set = None
if cpp_extension.CUDA_HOME is None and not torch.version.cuda:
    # a CPU wheel leaves CUDA_HOME None whatever the environment says, so load_inline refuses cuda_sources
    # before compiling anything. Set it as a CUDA wheel does (torch's own finder: $CUDA_HOME, else nvcc's
    # directory); nothing else of torch changes, and its build then fails only at the link (no libc10_cuda)
    cpp_extension.CUDA_HOME = home_set = cpp_extension._find_cuda_home()
t0, c0 = time.perf_counter(), cpu_now()
try:
    cpp_extension.load_inline(f"tvadd_r{rnd}", CPP, cuda_sources=CUDA + f"// round {rnd}\\n",
                              functions=["elementwise_add_cuda"], build_directory=build, verbose=False)
    failed = None
except Exception as e:
    text = str(e)
    lines = [ln for ln in text.splitlines() if "error" in ln.lower() or "cannot find" in ln]
    failed = (type(e).__name__ + ": " + (lines[-1] if lines else text.splitlines()[0] if text else "")).strip()[:300]
t1, c1 = time.perf_counter(), cpu_now()
objects = [p for p in __import__("os").listdir(build) if p.endswith(".o")]
nvcc = [ln.strip() for ln in open(build + "/build.ninja") if ln.startswith("cuda_cflags")]
print(json.dumps({"seconds": t1 - t0, "cpu": c1 - c0, "failed": failed, "objects": sorted(objects),
                  "torch": torch.__version__, "torch_cuda": torch.version.cuda, "home_set": home_set,
                  "nvcc": nvcc[:1]}))
""" % (KB_CUDA, KB_CPP)


def _env(cache: Path, **extra: str) -> Dict[str, str]:
    env = timing.child_env(OPBUILDER_CACHE_DIR=str(cache), **extra)
    env.pop("OPBUILDER_VERBOSE", None)
    # as in an activated virtual environment: torch runs `ninja` from PATH (builder.py does the same)
    env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), env.get("PATH", "")) if p)
    return env


def _child(code: str, args: List[str], env: Dict[str, str], what: str) -> Dict[str, object]:
    res = timing.run_child([sys.executable, "-c", code, *args], env=env, timeout=3600, what=what)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _wait_for_pch(cache: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not list(cache.glob(".pch/*/pch.h.gch")):
        if time.monotonic() > deadline:
            raise timing.Unmeasured(f"the precompiled header never appeared under {cache}/.pch")
        time.sleep(0.1)


def _has_torch() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--torch-items", type=int, default=3)
    ap.add_argument("--cuda-arch", default="8.0")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-cuda", action="store_true")
    ap.add_argument("--only-cuda", action="store_true", help="the CUDA rows alone (torch's takes minutes a round)")
    ap.add_argument("--threads", type=int, default=1, help="(pinned by timing.py)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args(argv)
    use_torch = not args.no_torch and _has_torch()
    nvcc = shutil.which("nvcc")
    use_cuda = not args.no_cuda and nvcc is not None
    timing.header("load_many: many operators at once (benchmarks/many.py)", args.rounds)
    if not use_torch:
        print("torch not installed: the torch columns and ratios are skipped" if not args.no_torch else
              "--no-torch: the torch columns and ratios are skipped")
    if not use_cuda:
        print("nvcc not on PATH: the CUDA rows are skipped" if not args.no_cuda else "--no-cuda: CUDA rows skipped")
    report = Report()
    work = Path(tempfile.mkdtemp(prefix="opbuilder-many-bench-"))
    cache = work / "cache"
    env = _env(cache, TORCH_CUDA_ARCH_LIST=args.cuda_arch)
    if nvcc and not env.get("CUDA_HOME"):  # torch looks for the toolkit there (nvcc's is found by PATH)
        root = Path(nvcc).resolve().parent.parent
        env["CUDA_HOME"] = str(root if (root / "include" / "cuda_runtime.h").is_file() else Path("/usr/local/cuda"))
    try:
        # the shared state of a harness after its first operator: toolchain, runtime, core library, PCH
        _child(OB_CHILD, ["cold", "0", "1"], env, "opbuilder warm-up")  # round 0: the warm-up
        _wait_for_pch(cache)
        if use_torch and not args.only_cuda:  # torch's first build pays for nothing later ones skip; run one
            _child(TORCH_CHILD, ["0", "1", str(work / "torch-warmup")], env, "torch warm-up")
        samples: Dict[str, List[float]] = {k: [] for k in ("ob", "torch", "ob_cuda", "torch_cuda", "ob_cuda_cpu",
                                                           "torch_cuda_cpu", "warm", "warm_cpu", "floor", "floor_cpu")}
        torch_cuda_failed: Optional[str] = None
        torch_cuda_objects: List[str] = []
        torch_version = ""
        torch_home_set: Optional[str] = None
        torch_nvcc: List[str] = []
        for r in range(1, args.rounds + 1):
            steps = ["ob_cuda", "torch_cuda"] if args.only_cuda else ["ob", "torch", "ob_cuda", "torch_cuda"]
            steps = steps[r % len(steps):] + steps[:r % len(steps)]
            for step in steps:
                if step == "ob":
                    out = _child(OB_CHILD, ["cold", str(r), str(args.items)], env, "opbuilder load_many")
                    samples["ob"].append(out["seconds"] / args.items)
                elif step == "torch" and use_torch:
                    out = _child(TORCH_CHILD, [str(r), str(args.torch_items), str(work / f"torch-{r}")], env,
                                 "torch load_inline")
                    samples["torch"].append(out["seconds"])
                elif step == "ob_cuda" and use_cuda:
                    out = _child(OB_CUDA_CHILD, [str(r), args.cuda_arch], env, "opbuilder CUDA load_many")
                    samples["ob_cuda"].append(out["seconds"])
                    samples["ob_cuda_cpu"].append(out["cpu"])
                    print(f"round {r}: CUDA opbuilder {out['seconds']:.2f} s, CPU {out['cpu']:.2f} s "
                          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
                elif step == "torch_cuda" and use_cuda and use_torch:
                    d = work / f"torch-cuda-{r}"
                    d.mkdir()
                    out = _child(TORCH_CUDA_CHILD, [str(r), str(d)], env, "torch CUDA load_inline")
                    samples["torch_cuda"].append(out["seconds"])
                    samples["torch_cuda_cpu"].append(out["cpu"])
                    torch_home_set, torch_nvcc = out["home_set"], out["nvcc"]
                    print(f"round {r}: CUDA torch {out['seconds']:.2f} s, CPU {out['cpu']:.2f} s, "
                          f"{'failed: ' + out['failed'] if out['failed'] else 'built'}, objects {out['objects']} "
                          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
                    torch_cuda_failed = out["failed"] or torch_cuda_failed
                    torch_cuda_objects = out["objects"]
                    torch_version = f"torch {out['torch']} (CUDA {out['torch_cuda'] or 'none: a CPU build'})"
            if args.only_cuda:
                print(f"round {r}: load average {os.getloadavg()[0]:.1f}", flush=True)
                continue
            # warm: the round's cached items, loaded by a new process; and their floor, the same libraries
            # imported directly by another (first one, then the other: the order turns each round)
            _child(OB_CHILD, ["warm", str(r), str(args.items)], env, "opbuilder warm load_many")  # writes records
            out = _child(OB_CHILD, ["warm", str(r), str(args.items)], env, "opbuilder warm load_many")
            for side in (("warm", "floor") if r % 2 else ("floor", "warm")):
                if side == "warm":
                    got = _child(OB_CHILD, ["warm", str(r), str(args.items)], env, "opbuilder warm load_many")
                else:
                    got = _child(FLOOR_CHILD, [json.dumps(out["libs"]), json.dumps(out["preload"])], env,
                                 "the warm floor")
                samples[side].append(got["seconds"])
                samples[side + "_cpu"].append(got["cpu"])
        st = {k: Stat(v) for k, v in samples.items() if v}
        print()
        rows = [[f"C++ cold, {args.items} items, load_many(jobs=2), per item", st["ob"].fmt("s")]] if "ob" in st else []
        if "torch" in st:
            rows.append([f"torch load_inline, {args.torch_items} items one by one, per item", st["torch"].fmt("s")])
        if "ob_cuda" in st:
            rows.append([f"CUDA vector-add, arch {args.cuda_arch}, no GPU: opbuilder load_many (build + import)",
                         st["ob_cuda"].fmt("s") + f"; CPU {st['ob_cuda_cpu'].fmt('s')}"])
        # torch's time counts only if it compiled the CUDA source (built, or failed after that: at the link)
        cuda_compiled = not torch_cuda_failed or any("cuda" in o for o in torch_cuda_objects)
        if "torch_cuda" in st and cuda_compiled:
            label = "torch load_inline(cuda_sources)" + (" (failed at the link: time to it)"
                                                         if torch_cuda_failed else "")
            rows.append([f"CUDA vector-add, arch {args.cuda_arch}, no GPU: {label}",
                         st["torch_cuda"].fmt("s") + f"; CPU {st['torch_cuda_cpu'].fmt('s')}"])
        if "warm" in st:
            rows.append([f"warm: load_many of {args.items} cached items, new process", st["warm"].fmt("ms")
                         + f"; CPU {st['warm_cpu'].fmt('ms')}"])
            rows.append([f"warm floor: the same {args.items} libraries imported directly, new process",
                         st["floor"].fmt("ms") + f"; CPU {st['floor_cpu'].fmt('ms')}"])
        timing.table(["row", "time"], rows)
        print()
        if "torch" in st:
            per = ratio(st["ob"], st["torch"])
            print(f"opbuilder per item over torch per item: {per.fmt('x')}; projected for {args.items} items: "
                  f"opbuilder {st['ob'].median * args.items:.1f} s vs torch {st['torch'].median * args.items:.1f} s")
        if torch_home_set:
            print(f"torch's CPU wheel leaves cpp_extension.CUDA_HOME None; set to {torch_home_set} (its own "
                  f"_find_cuda_home(), as a CUDA wheel does) so that load_inline compiles the CUDA source")
        if torch_nvcc:
            print(f"torch's nvcc flags: {torch_nvcc[0]}")
        if torch_cuda_failed and cuda_compiled:
            print(f"torch load_inline(cuda_sources), {torch_version}, failed after compiling the CUDA source: "
                  f"{torch_cuda_failed}; its time is a lower bound of a torch build, the ratio an upper bound of ours")
        elif torch_cuda_failed:
            print(f"torch load_inline(cuda_sources) cannot build here, {torch_version}: {torch_cuda_failed} "
                  f"(in {st['torch_cuda'].fmt('s')}, before compiling anything); torch's CPU wheel sets no "
                  f"CUDA_HOME whatever the environment says, so there is no torch time to compare with")
        if "ob" in st:
            report.goal(f"C++ cold, {args.items} distinct items, load_many(jobs=2): at most {COLD_GOAL_S} s per item",
                        st["ob"].median <= COLD_GOAL_S, st["ob"].fmt("s"))
        if "ob_cuda" in st and "torch_cuda" in st and cuda_compiled:
            cr = ratio(st["ob_cuda"], st["torch_cuda"])
            report.goal(f"CUDA vector-add compile with no GPU: at most {CUDA_GOAL}x torch's"
                        + (" (torch failed at the link: against its time to the failure)" if torch_cuda_failed else "")
                        + f" (load average {os.getloadavg()[0]:.1f}; CPU "
                        f"{ratio(st['ob_cuda_cpu'], st['torch_cuda_cpu']).fmt('x', 3)})",
                        cr.median <= CUDA_GOAL, cr.fmt("x", 3))
        else:
            why = ("--no-cuda" if args.no_cuda else "no nvcc" if not use_cuda else "torch not measured" if not use_torch else
                   f"{torch_version} cannot build cuda_sources: {torch_cuda_failed}")
            print(f"goal: CUDA vector-add compile with no GPU: at most {CUDA_GOAL}x torch's: NOT JUDGED ({why})")
        if "warm" in st:
            report.goal(f"warm: load_many of {args.items} cached items in a new process: at most "
                        f"{WARM_GOAL_S * 1e3:.0f} ms (load average {os.getloadavg()[0]:.1f}; "
                        f"{ratio(st['warm'], st['floor']).fmt('x')} its floor, CPU "
                        f"{ratio(st['warm_cpu'], st['floor_cpu']).fmt('x')})", st["warm"].median <= WARM_GOAL_S,
                        st["warm"].fmt("ms"))
    except timing.Unmeasured as e:
        report.fail("many", e)
    finally:
        print(f"load average at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
