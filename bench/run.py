"""`make bench`: gcompile against PyTorch and JAX in one run; one table, JSON (and a PNG) in bench/results/.

    python3 -m bench.run [--quick] [--only mnist,conv,eltwise,gemm,floors] [--device cuda|cpu] [--data DIR]
                         [--fashion DIR] [--impls gcompile,torch-eager,...] [--results-dir DIR]

Sections: mnist (logreg and MLP at batch 128 and 1000: gcompile fp32/tf32, PyTorch eager, torch.compile,
PyTorch CUDA graph, JAX jit step, JAX scanned epoch; time to accuracy at batch 128), conv (LeNet and
ResNet-14 at batch 128: gcompile vs PyTorch eager and CUDA graph), eltwise (a fused elementwise chain on
256 MB vs a device copy), gemm (bench/gemm_bench.py's run(), when that file exists), floors (bench/floors.py:
what a phase boundary and pulling a block's bytes from L2 cost on this GPU, and x @ W1's K steps pulled as its
kernel pulls them). A missing peer or example is a row that says why it was skipped. torch.compile runs last,
while the time budget allows.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from gcompile.build import detect_arch
from gcompile.data import default_data_dir
from gcompile.errors import GCompileError

from . import floors, gc_side, jax_peers, torch_peers
from .report import (LEGEND, SECTIONS, add_ratios, check_targets, environment, failed, format_table, format_targets,
                     row, skipped, write_json)
from .tasks import LR, RECIPE_BATCH, RECIPES, ROOT, TARGETS, Dataset, Task, load_example, make_program
from .timing import Budget, Settings

IMPL_ORDER = ("gcompile", "torch-eager", "torch-compile", "torch-graph", "jax-jit", "jax-scan", "torch copy_")
IMPLS = IMPL_ORDER[:-1]   # what --impls selects (the eltwise section's copy reference always runs)
ELTWISE_BYTES = {"cuda": 256 << 20, "cpu": 32 << 20}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m bench.run", description=__doc__.strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer windows and epochs (a smoke test, not results)")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {','.join(SECTIONS)}")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="default: cuda when nvidia-smi sees a GPU (gcompile target and peers follow)")
    p.add_argument("--data", default=None, help=f"MNIST folder (default {default_data_dir('mnist')})")
    p.add_argument("--fashion", default=None, help=f"Fashion-MNIST folder for ResNet-14 "
                                                    f"(default {default_data_dir('fashion-mnist')})")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated implementations of {','.join(IMPLS)}")
    p.add_argument("--batches", default="128,1000", help="batch sizes of the mnist section")
    p.add_argument("--results-dir", default=str(ROOT / "bench" / "results"))
    p.add_argument("--work-dir", default=str(ROOT / "build" / "bench"), help="builds and caches (emptied first)")
    p.add_argument("--budget-s", type=float, default=420, help="optional work is skipped past this (seconds)")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.only = [s for s in args.only.split(",") if s]
    unknown = set(args.only) - set(SECTIONS)
    if unknown:
        p.error(f"--only: unknown section(s) {sorted(unknown)}; choose from {list(SECTIONS)}")
    args.impls = {i for i in args.impls.split(",") if i}
    unknown = args.impls - set(IMPLS)
    if unknown:   # (a misspelt name ran nothing of it, silently)
        p.error(f"--impls: unknown implementation(s) {sorted(unknown)}; choose from {list(IMPLS)}")
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.device is None:
        args.device = "cuda" if detect_arch() else "cpu"
    return args


class Bench:
    def __init__(self, args):
        self.args = args
        self.settings = Settings(args.quick)
        self.budget = Budget(args.budget_s)
        self.target = args.device  # gcompile's target is named like the device
        self.work = Path(args.work_dir)
        self.rows, self.deferred, self.extra = [], [], {}

    def wanted(self, impls):
        return [i for i in impls if i in self.args.impls]

    def gcompile(self, task, precision, with_accuracy):
        if "gcompile" not in self.args.impls:
            return
        try:
            self.rows.append(gc_side.gcompile_row(task, self.target, precision, self.settings, self.work,
                                                  with_accuracy))
        except Exception as e:  # a build or run failure is a result to report, not the end of the benchmark
            self.rows.append(failed(task.section, task.model, task.batch, "gcompile", e, precision=precision))

    def peers(self, task, impls, precision, with_accuracy):
        kw = dict(settings=self.settings, budget=self.budget, device=self.args.device, with_accuracy=with_accuracy)
        torch_impls = self.wanted([i for i in impls if i.startswith("torch")])
        jax_impls = self.wanted([i for i in impls if i.startswith("jax")])
        if torch_impls:
            self.rows += torch_peers.torch_rows(task, torch_impls, precision, **kw)
        if jax_impls:
            self.rows += jax_peers.jax_rows(task, jax_impls, precision, **kw)

    def mnist(self):
        """gcompile's rows for every task first, then the peers' (the table sorts the rows): gcompile's cold
        builds run nvcc beside this process, and after PyTorch and JAX had run in it they took ~0.9 s longer
        (H100, 3a7b441: the MLP b128 cold build 3.28 s in a full run, 2.38 s with --impls gcompile, 2.0-2.7 s
        in a process of its own)."""
        data = self.dataset(self.args.data or default_data_dir("mnist"), "mnist")
        tasks = []
        for model in ("mnist_logreg", "mnist_mlp"):
            example = load_example(model)
            for batch in self.args.batches:
                if data is None:
                    self.rows.append(skipped("mnist", model, batch, "all", self.extra["mnist_data"]))
                    continue
                tasks.append(Task(model, batch, make_program(example, batch, LR), data, "mnist", TARGETS[model],
                                  RECIPES.get(batch)))
        for task in tasks:
            print(f"== {task.model} batch {task.batch}: gcompile", flush=True)
            self.gcompile(task, "fp32", task.recipe is not None)
            self.gcompile(task, "tf32", False)
        for task in tasks:
            recipe = task.recipe is not None
            print(f"== {task.model} batch {task.batch}: peers", flush=True)
            self.peers(task, ("torch-eager", "torch-graph", "jax-jit", "jax-scan"), "fp32", recipe)
            if task.model == "mnist_mlp":  # the fastest peers with tensor cores, for the tf32 comparison
                self.peers(task, ("torch-graph", "jax-scan"), "tf32", False)
            self.deferred.append((task, recipe))

    def torch_compile(self):
        """torch.compile last: its compile time is the largest and least important cost of the run."""
        for task, recipe in sorted(self.deferred, key=lambda d: d[0].batch):
            print(f"== {task.model} batch {task.batch}: torch.compile", flush=True)
            self.peers(task, ("torch-compile",), "fp32", recipe)

    def conv(self):
        mnist = self.dataset(self.args.data or default_data_dir("mnist"), "mnist")
        fashion = self.dataset(self.args.fashion or default_data_dir("fashion-mnist"), "fashion")
        for model, data, note in (("mnist_lenet", mnist, ""),
                                  ("resnet14", fashion or mnist, "" if fashion else
                                   f"Fashion-MNIST missing ({self.extra.get('fashion_data')}): timed on MNIST")):
            example = load_example(model)
            reason = (f"examples/{model}.py is not in this tree (helper conv)" if example is None else
                      None if data is not None else self.extra.get("mnist_data"))
            if reason:
                for impl in self.wanted(("gcompile", "torch-eager", "torch-graph")):
                    self.rows.append(skipped("conv", model, RECIPE_BATCH, impl, reason))
                continue
            print(f"== {model} batch {RECIPE_BATCH}", flush=True)
            task = Task(model, RECIPE_BATCH, make_program(example, RECIPE_BATCH), data, "conv")
            first = len(self.rows)
            self.gcompile(task, "fp32", False)
            self.peers(task, ("torch-eager", "torch-graph"), "fp32", False)
            for r in self.rows[first:]:
                r["note"] = "; ".join(x for x in (r.get("note"), note) if x)

    def eltwise(self):
        n = ELTWISE_BYTES[self.args.device] // 4
        name = f"eltwise {n * 4 >> 20}MB"
        print(f"== {name}", flush=True)
        ours = []
        if "gcompile" in self.args.impls:
            for kind in gc_side.BANDWIDTH_PROGRAMS:
                try:
                    ours.append(gc_side.bandwidth_row(kind, n, self.target, self.settings, self.work))
                except Exception as e:
                    ours.append(failed("eltwise", f"{kind} {n * 4 >> 20}MB", None, "gcompile", e))
            self.rows += ours
        copy = torch_peers.copy_row(name, n, self.settings, self.args.device)
        self.rows.append(copy)
        for gc_row in ours:
            if gc_row.get("bandwidth_Bps") and copy.get("bandwidth_Bps"):
                gc_row["fraction_of_copy"] = gc_row["bandwidth_Bps"] / copy["bandwidth_Bps"]
                moved = "bytes read + written" if gc_row["bytes_moved"] == copy["bytes_moved"] else \
                    "bytes read against the copy's read + written"
                gc_row["note"] = "; ".join(x for x in (gc_row.get("note"), (
                    f"{100 * gc_row['fraction_of_copy']:.1f}% of copy bandwidth ({gc_row['bandwidth_Bps'] / 1e9:.0f} "
                    f"vs {copy['bandwidth_Bps'] / 1e9:.0f} GB/s, {moved})")) if x)

    def gemm(self):
        if not (ROOT / "bench" / "gemm_bench.py").exists():
            self.rows.append(skipped("gemm", "gemm_bench", None, "-", "bench/gemm_bench.py is not in this tree "
                                                                      "(helper gemm)"))
            return

        def run():
            from . import gemm_bench
            return gemm_bench.run(quick=self.args.quick, workdir=str(self.work / "gemm"))
        self.micro("gemm", "gemm_bench", 60, "gemm micro-benchmark (bench/gemm_bench.py)", run, gemm_rows)

    def floors(self):
        self.micro("floors", "floors", 30, "floors (bench/floors.py)", lambda: floors.run(str(self.work / "floors")),
                   floors.table_rows)

    def micro(self, section, name, estimate_s, title, run, to_rows):
        """A GPU micro-benchmark's section: skipped, with the reason, past the time budget or without a GPU;
        run()'s result kept in the JSON under extra[section], to_rows(result) its table rows."""
        reason = self.budget.allows(estimate_s) or (None if self.args.device == "cuda" else "it needs a GPU")
        if reason:
            self.rows.append(skipped(section, name, None, "-", reason))
            return
        print(f"== {title}", flush=True)
        try:
            result = run()
        except Exception as e:
            self.rows.append(failed(section, name, None, "-", e))
            return
        self.extra[section] = result
        try:
            self.rows += to_rows(result)
        except (KeyError, TypeError) as e:
            self.rows.append(skipped(section, name, None, "-", f"unexpected result of {name}'s run(): {e!r} (kept in "
                                                               f"the JSON under extra.{section})"))

    def dataset(self, path, key):
        try:
            return Dataset.load(path)
        except (GCompileError, OSError) as e:
            self.extra[f"{key}_data"] = str(e)
            return None


def gemm_rows(result: dict) -> list:
    """gemm_bench.run()'s result as table rows: each case the heuristic chose (own kernel, with or without
    its epilogue), timed against cuBLAS at the same precision; peer/gc is cuBLAS time / own time."""
    rows = []
    for r in result["rows"]:
        if not r.get("chosen") or "own_us" not in r:
            continue
        ref = "cublas" if r["precision"] == "fp32" else "cublas_tf32"
        epilogue = "" if r["epilogue"] == "none" else f"+{r['epilogue']}"
        flops = 2 * r["m"] * r["n"] * r["k"]
        rows.append(row("gemm", r["name"], None, f"gc_gemm{epilogue}", precision=r["precision"],
                        step_s=r["own_us"] * 1e-6, peer_over_gc=r[f"{ref}_us"] / r["own_us"],
                        note=f"{r['m']}x{r['n']}x{r['k']} {r['tile']}: {flops / r['own_us'] * 1e-6:.1f} TFLOP/s, "
                             f"{ref} {r[f'{ref}_us']:.2f} us"))
    return rows


def gemm_targets(summary: dict) -> list:
    """The GEMM targets of issue 4 from gemm_bench's summary, in check_targets' form."""
    checks = [("own fp32 GEMM 4096^3, of cuBLAS", summary.get("fp32_4096_vs_cublas"), 0.85, 100, "%"),
              ("own fp32 GEMM + epilogue / cuBLAS, worst MLP shape", summary.get("fused_vs_cublas_min"), 1.0, 1, "x")]
    return [{"label": label, "value": value * scale, "limit": limit * scale, "unit": unit, "ok": value >= limit,
             "kind": ">="} for label, value, limit, scale, unit in checks if value is not None]


def sort_rows(rows: list) -> list:
    first_seen = {}
    for r in rows:
        first_seen.setdefault((r["section"], r["model"], r["batch"]), len(first_seen))

    def key(r):
        impl = IMPL_ORDER.index(r["impl"]) if r["impl"] in IMPL_ORDER else len(IMPL_ORDER)
        return (SECTIONS.index(r["section"]) if r["section"] in SECTIONS else len(SECTIONS),
                first_seen[(r["section"], r["model"], r["batch"])], impl, r.get("precision") or "")
    return sorted(rows, key=key)


def save(bench: Bench, meta: dict, args, complete: bool):
    """Write the JSON with every row measured so far; (results, path)."""
    rows = sort_rows(bench.rows)
    add_ratios(rows)
    for name, module in (("torch", torch_peers), ("jax", jax_peers)):
        if name in sys.modules:
            meta["versions"].update(module.versions())
    meta.update(elapsed_s=bench.budget.elapsed(), complete=complete, methodology=LEGEND)
    targets = check_targets(rows) + gemm_targets((bench.extra.get("gemm") or {}).get("summary") or {})
    results = {"meta": meta, "rows": rows, "targets": targets, "extra": bench.extra}
    return results, write_json(results, args.results_dir)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with PyTorch
    if args.device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    work = Path(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)  # cold builds start from an empty folder
    work.mkdir(parents=True)
    meta = environment(ROOT, args.device)
    meta["args"] = {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()}
    print(f"bench: {meta['gpu']} at {meta['commit']}, sections {args.only}{' (quick)' if args.quick else ''}",
          flush=True)
    bench = Bench(args)
    try:
        jax_peers.setup(work / "jax-cache")  # before anything compiles
    except ImportError:
        pass
    for section in args.only:
        getattr(bench, section)()
        save(bench, meta, args, complete=False)  # a run stopped by a time limit keeps what it measured
    if "mnist" in args.only:
        bench.torch_compile()
    results, path = save(bench, meta, args, complete=True)
    print()
    print(format_table(results["rows"]))
    print(LEGEND)
    if results["targets"]:
        print("targets (issues 4 and 5, measured in this run):")
        print(format_targets(results["targets"]))
    print(f"wrote {path} ({meta['elapsed_s']:.0f} s)")
    if not args.no_plot:
        try:
            from .plot import plot
            print(f"wrote {plot(results, path.with_suffix('.png'))}")
        except ImportError as e:
            print(f"no PNG ({e}): run `python3 bench/plot.py {path}` where matplotlib is installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
