"""Where a compiled model's training step spends its time: each kernel's place in a steady-state step.

    PYTHONPATH=$PWD python3 -m bench.timeline examples/mnist_mlp.py --batch-size 128 [--precision tf32]
        [--tuning RECORD.json] [--steps 64] [--trace FILE.json] [--trainer DATA_DIR [--epochs 3]]

Needs a GPU and PyTorch (its profiler reads CUPTI's kernel records: every kernel a graph replay runs, with
its device start and end). The model is built for the cuda target as `gcompile build` would (same flags),
`Model.time_steps` runs warm-up steps, then `--steps` steps under the profiler. The middle half of the steps
is kept, each step being the manifest's kernels per step in start order; for each kernel the table gives
the median start and end relative to its step's first kernel, and its duration. A kernel launched early
(programmatic dependent launch) starts before its predecessor ends and waits inside (gc_wait_prior): its
duration includes that wait, so the step's critical path is read from the ends, not by adding durations.
The period is the median distance between consecutive steps' first kernels: the step time under the
profiler (a few percent above `Model.time_steps`' own, printed first).

`--trainer DATA_DIR` places the kernels of the standalone trainer's steps instead — the benchmark's figure:
its steps select their batch from the shuffled dataset on the device (the next batch's rows are computed
beside the step, x is read in place), which the library's steps on one batch leave out. The library's
exported `gc_main` trains `--epochs` epochs in this process (`train --data DATA_DIR`) under the profiler;
the records are cut into steps at each launch of the library step's first kernel, and kernels that run in
fewer than half of the steps (the evaluation between epochs, a graph launch's bookkeeping) are listed with
their count.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path


def short_name(name: str) -> str:
    """A kernel's record name, shortened: `void gc_gemm_pipe_kernel<float, true, ...>(...)` keeps the
    kernel and its tile (the tile tells one GEMM of the step from another), a generated kernel its name."""
    name = name.removeprefix("void ")
    kernel = re.split(r"[<(]", name, maxsplit=1)[0]
    tile = re.search(r"gc_tile<[^>]*>", name)
    return f"{kernel} {tile.group(0)}" if tile else kernel


def kernel_events(trace: dict) -> list[dict]:
    """The kernel records of a Chrome trace (torch.profiler's export): name, start and duration in us,
    in start order."""
    events = [{"name": short_name(e["name"]), "ts": float(e["ts"]), "dur": float(e["dur"])}
              for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and e.get("ph") == "X"]
    return sorted(events, key=lambda e: e["ts"])


def steps_of(events: list[dict], per_step: int) -> list[list[dict]]:
    """The records cut into steps of `per_step` kernels (a step's kernels start after the previous step's
    first), the middle half of them: the first and last steps of a graph launch are not steady."""
    if per_step < 1 or len(events) < per_step:
        raise ValueError(f"{len(events)} kernel records for steps of {per_step} kernels")
    steps = [events[i:i + per_step] for i in range(0, len(events) - per_step + 1, per_step)]
    names = sorted(e["name"] for e in steps[0])
    for i, step in enumerate(steps):
        if sorted(e["name"] for e in step) != names:
            raise ValueError(f"step {i} has kernels {sorted(e['name'] for e in step)}, step 0 {names}: "
                             f"the records are not steps of {per_step} kernels")
    return steps[len(steps) // 4: len(steps) - len(steps) // 4] or steps


def steps_at(events: list[dict], head: str) -> list[list[dict]]:
    """The records cut at each start of the kernel named `head` (a step's first kernel: each step holds the
    records that start from it to the next one), the middle half of the steps; for the trainer's records,
    whose kernels per step are not all the same (the evaluation after an epoch lands in one step)."""
    starts = [i for i, e in enumerate(events) if e["name"] == head]
    if len(starts) < 2:
        raise ValueError(f"{len(starts)} launches of {head}: not enough records to cut into steps")
    steps = [events[a:b] for a, b in zip(starts, starts[1:])]
    return steps[len(steps) // 4: len(steps) - len(steps) // 4]


def summarize(steps: list[list[dict]]) -> dict:
    """{"period": us, "kernels": [{name, start, end, dur}]}: medians over the steps, relative to each step's
    first kernel; kernels in the order of their median start."""
    starts = [step[0]["ts"] for step in steps]
    period = statistics.median(b - a for a, b in zip(starts, starts[1:])) if len(steps) > 1 else None
    by_name: dict[str, list] = {}
    for step in steps:
        t0 = step[0]["ts"]
        for e in step:
            by_name.setdefault(e["name"], []).append((e["ts"] - t0, e["ts"] + e["dur"] - t0, e["dur"]))
    kernels = [{"name": name, "start": statistics.median(s for s, _, _ in v),
                "end": statistics.median(e for _, e, _ in v), "dur": statistics.median(d for _, _, d in v),
                "count": len(v)} for name, v in by_name.items()]
    return {"period": period, "steps": len(steps), "kernels": sorted(kernels, key=lambda k: k["start"])}


def table(summary: dict) -> str:
    """Every step's kernels in start order (the one that ends last marked); then those that ran in fewer than
    half of the steps, with their count of launches."""
    steps = summary["steps"]
    regular = [k for k in summary["kernels"] if 2 * k["count"] >= steps]
    occasional = [k for k in summary["kernels"] if 2 * k["count"] < steps]
    last = max(k["end"] for k in regular)
    lines = [f"{'start us':>9} {'end us':>8} {'dur us':>7}  kernel"]
    for k in regular:
        mark = "  <- ends last" if k["end"] == last else ""
        lines.append(f"{k['start']:9.2f} {k['end']:8.2f} {k['dur']:7.2f}  {k['name']}{mark}")
    for k in occasional:
        lines.append(f"{k['start']:9.2f} {k['end']:8.2f} {k['dur']:7.2f}  {k['name']}  "
                     f"({k['count']} launch{'es' if k['count'] != 1 else ''} in {steps} steps)")
    if summary["period"] is not None:
        lines.append(f"period (first kernel to the next step's first): {summary['period']:.2f} us")
    return "\n".join(lines)


def profile(model, steps: int, trace_path: Path) -> list[dict]:
    """Kernel records of `steps` training steps of a loaded cuda model, after a warm-up."""
    import torch

    torch.zeros(1, device="cuda")   # the profiler's CUDA context is the model's (the primary one)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model.time_steps(steps)
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_path))
    return kernel_events(json.loads(trace_path.read_text()))


def profile_trainer(artifact, data_dir: str, epochs: int, trace_path: Path) -> list[dict]:
    """Kernel records of the standalone trainer's `epochs` epochs (`train --data data_dir`), run in this
    process through the library's gc_main (the binary's entry point), after a warm-up epoch. The library is
    opened at its own path: not the copy gc.load opened for the model (another instance, its own state)."""
    import torch

    from gcompile.loader import ffi

    lib = ffi.dlopen(str(artifact.library))
    def train(n: int) -> None:
        args = [ffi.new("char[]", a.encode()) for a in (artifact.binary, "train", "--data", data_dir,
                                                          "--epochs", str(n))]
        rc = lib.gc_main(len(args), ffi.new("char*[]", args))
        if rc != 0:
            raise RuntimeError(f"{Path(artifact.binary).name} train --data {data_dir} --epochs {n}: exit {rc}")

    torch.zeros(1, device="cuda")
    train(1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        train(epochs)
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_path))
    return kernel_events(json.loads(trace_path.read_text()))


def main(argv=None) -> int:
    import gcompile as gc
    from gcompile.commands.model_file import add_model_arguments, compile_model

    parser = argparse.ArgumentParser(prog="python3 -m bench.timeline", description=__doc__.split("\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=64, help="steps under the profiler (default 64)")
    parser.add_argument("--trace", type=Path, default=None, help="keep the Chrome trace here")
    parser.add_argument("--trainer", metavar="DATA_DIR", default=None,
                        help="place the standalone trainer's steps on this dataset (a folder `gcompile data` wrote) "
                             "instead of the library's")
    parser.add_argument("--epochs", type=int, default=3, help="--trainer: epochs under the profiler (default 3)")
    args = parser.parse_args(argv)
    if args.target == "cpu":
        parser.error("the timeline is of the cuda target's kernels")
    args.target = "cuda"
    try:
        import torch   # noqa: F401 - needed by profile(); say so before building
    except ImportError:
        print("bench.timeline: needs PyTorch (its profiler reads the kernel records)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        try:
            artifact = compile_model(args, out_dir=Path(tmp) / "build")
            model = gc.load(artifact)
            per_step = model.manifest["kernels"]["train"]
            warm = 2000 if per_step < 10 else 200
            model.time_steps(warm)
            timed = [model.time_steps(warm) / warm * 1e6 for _ in range(5)]
        except gc.GCompileError as e:
            print(f"bench.timeline: {e}", file=sys.stderr)
            return 1
        print(f"{artifact.name} ({args.precision}): Model.time_steps {statistics.median(timed):.2f} us a step, "
              f"{per_step} kernels a step")
        trace = args.trace or Path(tmp) / "trace.json"
        events = profile(model, args.steps, trace)
        steps = steps_of(events, per_step)
        if args.trainer:
            head = steps[0][0]["name"]
            try:
                events = profile_trainer(artifact, args.trainer, args.epochs, trace)
            except RuntimeError as e:
                print(f"bench.timeline: {e}", file=sys.stderr)
                return 1
            steps = steps_at(events, head)
            print(f"the trainer's steps, cut at each {head}:")
    print(table(summarize(steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
