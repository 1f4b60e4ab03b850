"""`make tune`: the tuning records `make bench` builds gcompile's MNIST programs with (bench/tuned/).

    python3 -m bench.tune [--data DIR] [--only mnist_mlp:128:fp32,...] [--out bench/tuned]

For each model, batch and precision the benchmark runs (logreg and the MLP at batch 128 and 1000, fp32 and
tf32), gc.tune times the training step's GEMM tiles on this GPU with the benchmark's program (lr 0.1): the
trainer's steps on the dataset (the binary's epochs, the step the benchmark reports), its first batch for
the check of each candidate's update, and writes <out>/<gpu>/<model>_b<batch>_<precision>.json, <gpu> this
GPU's name as a folder's (`nvidia-h100-80gb-hbm3`). A record holds the GPU it was measured on; the
benchmark uses the records of the GPU it runs on, from that GPU's folder (gcompile/tune.py), so records of
several GPUs sit side by side.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gcompile.data import default_data_dir
from gcompile.tune import gpu_name, tune, write_record

from .report import gpu_slug
from .tasks import LR, ROOT, TARGETS, Dataset, Task, load_example, make_program

TUNED = ROOT / "bench" / "tuned"
CONFIGS = [(model, batch, precision) for model in ("mnist_logreg", "mnist_mlp") for batch in (128, 1000)
           for precision in ("fp32", "tf32")]


def record_path(model: str, batch: int, precision: str, gpu: str, root: Path = TUNED) -> Path:
    """Where the record of (model, batch, precision) measured on the GPU named `gpu` lives under root."""
    return root / gpu_slug(gpu) / f"{model}_b{batch}_{precision}.json"


def gpu_record(model: str, batch: int, precision: str, gpu: str,
               root: Path = TUNED) -> tuple[Path | None, dict | None, str | None]:
    """The record of (model, batch, precision) that `make bench` builds with on the GPU named `gpu`: (its path,
    the record, None), or (None, None, why not — another GPU's record only, or one that names another GPU — or
    None where no GPU has a record for it)."""
    from gcompile.tune import read_record

    path = record_path(model, batch, precision, gpu, root)
    if not path.is_file():
        others = sorted(p.parent.name for p in root.glob(f"*/{path.name}"))
        return None, None, (f"{path.name} was tuned on {', '.join(others)}, not on {gpu}: default tiles" if others
                            else None)
    record = read_record(path)
    if record.get("gpu") != gpu:
        return None, None, f"{path} was tuned on {record.get('gpu')}, this GPU is {gpu}: default tiles"
    return path, record, None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="MNIST folder (default: gcompile data's)")
    parser.add_argument("--only", default=None, help="model:batch:precision,... (default: all eight)")
    parser.add_argument("--out", default=str(TUNED), help="where the records go (default bench/tuned)")
    args = parser.parse_args(argv)
    configs = CONFIGS
    if args.only:
        configs = []
        for item in args.only.split(","):
            model, batch, precision = item.split(":")
            configs.append((model, int(batch), precision))
    gpu = gpu_name()
    if gpu is None:
        print("bench.tune: no GPU (nvidia-smi names none): the records are measured on the GPU they are for",
              file=sys.stderr)
        return 2
    data = Dataset.load(args.data or default_data_dir("mnist"))
    out = Path(args.out)
    for model, batch, precision in configs:
        task = Task(model, batch, make_program(load_example(model), batch, LR), data, "mnist", TARGETS[model])
        record = tune(task.program, name=model, precision=precision, inputs=task.batch0(), data=data.path, windows=3,
                      log=lambda line: print(line, flush=True))
        record.update(batch_size=batch, lr=LR)
        path = record_path(model, batch, precision, gpu, out)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_record(record, path)
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
