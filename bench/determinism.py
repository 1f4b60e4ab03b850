"""Does a compiled trainer give the same bits every run? The model is built once — on the cuda target with this
GPU's tuning record from bench/tuned/ where there is one, as `make bench` builds it (with its learning rate for
the MNIST models: the records were tuned on those programs) — then its standalone trainer runs N times with the
same arguments, and the checkpoints it saves are compared byte for byte.

    python3 -m bench.determinism examples/mnist_mlp.py --batch-size 1000 --precision tf32 --runs 40

Plain launches (the trainer's --no-graph) unless --graphs: the mode in which the twenty-ninth session's race in
the split-K cluster sum showed most (docs/compiler.md, "A cross-stream nondeterminism"). The race left 1-2 of 30-40
runs different, so a clean result takes many runs: 40 for the b1000 tf32 MLP. Exit status 0 when every run
saved the same checkpoint, 1 when one differs (the tensors that differ are listed), 2 when the build or a run
failed.
"""
from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def outcomes(paths) -> list[list[Path]]:
    """The checkpoint files grouped by their bytes, the most common outcome first."""
    groups: dict[str, list[Path]] = {}
    for path in paths:
        groups.setdefault(hashlib.sha256(Path(path).read_bytes()).hexdigest(), []).append(Path(path))
    return sorted(groups.values(), key=len, reverse=True)


def differences(a: Path, b: Path) -> list[str]:
    """One line a tensor whose values differ between checkpoints a and b: how many elements, the largest
    difference, the step counters where they differ."""
    from gcompile.checkpoint import read_checkpoint

    ca, cb = read_checkpoint(a), read_checkpoint(b)
    lines = []
    for name, x in ca.tensors.items():
        y = cb.tensors.get(name)
        x = np.asarray(x)
        if y is None or np.asarray(y).shape != x.shape:
            lines.append(f"{name}: not in both, or of another shape")
            continue
        y = np.asarray(y)
        same = (x == y) | (np.isnan(x) & np.isnan(y)) if x.dtype.kind == "f" else x == y
        if not same.all():
            d = np.abs(x.astype(np.float64) - y.astype(np.float64))
            lines.append(f"{name}: {int((~same).sum())} of {x.size} elements differ, the largest by {np.nanmax(d):.3g}")
    if (ca.step, ca.epoch) != (cb.step, cb.epoch):
        lines.append(f"step / epoch: {ca.step} / {ca.epoch} against {cb.step} / {cb.epoch}")
    return lines


def report(groups: list[list[Path]], what: str) -> tuple[str, bool]:
    """The summary of outcomes() for `what` (the runs' description) and whether every run agreed."""
    runs = sum(len(g) for g in groups)
    if len(groups) == 1:
        return f"{what}: {runs} runs, one checkpoint: deterministic", True
    counts = ", ".join(str(len(g)) for g in groups)
    lines = [f"{what}: {runs} runs, {len(groups)} different checkpoints (runs each: {counts}); "
             f"{runs - len(groups[0])} differ from the most common"]
    lines += [f"  {line}" for line in differences(groups[0][0], groups[1][0])]
    return "\n".join(lines), False


def build_choice(args) -> tuple[str | None, list[str]]:
    """The tuning record to build with and the model's settings (--set's): --tuning's file (none: default tiles)
    and --set as given; without --tuning, on the cuda target with a GPU, this GPU's record in bench/tuned/ for the
    model, batch and precision, where there is one — and with it, for make bench's MNIST models, make bench's
    learning rate (bench.tasks.LR) unless --set names an lr: those records were tuned on the programs make bench
    builds, and the learning rate is one of the program's constants (with the example's own the record does not
    fit)."""
    settings = list(args.set)
    if args.tuning is not None:
        return (None if args.tuning == "none" else args.tuning), settings
    from gcompile.commands.model_file import default_target
    from gcompile.tune import gpu_name
    from .tasks import LR, TARGETS
    from .tune import gpu_record

    here = gpu_name()
    if (args.target or default_target()) != "cuda" or here is None or args.batch_size is None:
        return None, settings
    model = Path(args.model).stem
    path, _, _ = gpu_record(model, args.batch_size, args.precision, here)
    if path is None:
        return None, settings
    if model in TARGETS and not any(s.startswith("lr=") for s in settings):
        settings.append(f"lr={LR}")
    return str(path), settings


def main(argv=None) -> int:
    import gcompile as gc
    from gcompile.commands.model_file import add_model_arguments, compile_model
    from gcompile.data import default_data_dir

    summary = " ".join(__doc__.split("\n\n")[0].split())   # the first paragraph, as one
    parser = argparse.ArgumentParser(prog="python3 -m bench.determinism", description=summary)
    add_model_arguments(parser)
    parser.add_argument("--runs", type=int, default=20, help="trainer runs (default 20)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs a run (default 2)")
    parser.add_argument("--graphs", action="store_true", help="replay CUDA graphs (default: plain launches)")
    parser.add_argument("--data", default=None, help="the dataset folder (default: gcompile data mnist's)")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the build and checkpoints here")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs: at least 2 runs to compare")
    data = args.data or str(default_data_dir("mnist"))
    with tempfile.TemporaryDirectory(prefix="determinism_") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        args.tuning, args.set = build_choice(args)
        try:
            artifact = compile_model(args, out_dir=work / "build")
        except gc.GCompileError as e:
            print(f"bench.determinism: {e}", file=sys.stderr)
            return 2
        mode = "CUDA graphs" if args.graphs else "plain launches"
        what = (f"{artifact.name} ({args.precision}, {Path(args.tuning).name if args.tuning else 'default tiles'}, "
                f"{''.join(s + ', ' for s in args.set)}{args.epochs} epochs, {mode})")
        paths = []
        for i in range(args.runs):
            path = work / f"run{i}.ckpt"
            cmd = [artifact.binary, "train", "--data", data, "--epochs", str(args.epochs), "--save", str(path)]
            if not args.graphs:
                cmd.append("--no-graph")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                print(f"bench.determinism: run {i + 1} of {what} exited {proc.returncode}: {' / '.join(tail)}",
                      file=sys.stderr)
                return 2
            paths.append(path)
        text, same = report(outcomes(paths), what)
    print(text)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
