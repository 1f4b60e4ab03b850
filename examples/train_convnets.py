"""Train the convolutional examples to their accuracy targets with the compiled trainer and report epochs,
wall time and accuracy (issue 5's acceptance runs; meant for the GPU machine, where it takes a few minutes).

    LeNet-5 style (20/50 channels, batch norm) on MNIST, Adam + cosine, 15 epochs   target: validation >= 0.990
    ResNet-14 (batch norm) on Fashion-MNIST, SGD momentum + cosine, 15 epochs        target: test >= 0.920

Works offline: --mnist-from takes mnist.pkl.gz and --fashion-from the folder of Fashion-MNIST's IDX files
(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz);
each is converted once into the data folder. Both models are compiled at once (nvcc runs in parallel), then
trained one after the other. Builds go to build/convnets/<model>; a JSON summary to
build/convnets/summary.json. Exit code 1 when a target is missed.

    python examples/train_convnets.py --mnist-from FILE --fashion-from DIR [--only lenet|resnet14] [--epochs N]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gcompile as gc
from gcompile.commands.model_file import at_least_one, default_target, load_program
from gcompile.data import prepare_fashion_mnist, prepare_mnist
from gcompile.resources import make_folder

HERE = Path(__file__).resolve().parent
RUNS = {  # name: model file, program() options, dataset, epochs, split the target is measured on, target
    "lenet": ("mnist_lenet.py", dict(batch_size=128, channels=(20, 50), batch_norm=True, optimizer="adam",
                                     lr=2e-3, schedule="cosine"), "mnist", 15, "valid", 0.990),
    "resnet14": ("resnet14.py", dict(batch_size=128, batch_norm=True, optimizer="sgd", lr=0.1, weight_decay=5e-4,
                                     schedule="cosine"), "fashion-mnist", 15, "test", 0.920),
}


def build(name: str, program, target: str, out: Path):
    """(artifact, seconds) of one model; builds run in parallel threads (the compiler is a subprocess)."""
    start = time.perf_counter()
    artifact = gc.compile(program, target=target, out_dir=out / name, source=f"examples/{RUNS[name][0]}")
    return artifact, time.perf_counter() - start


def train(name: str, artifact, compile_seconds: float, data: Path, out: Path, epochs: int | None) -> dict:
    _, options, _, default_epochs, split, goal = RUNS[name]
    epochs = default_epochs if epochs is None else epochs
    log, checkpoint = out / name / "metrics.jsonl", out / name / "trained.ckpt"
    log.unlink(missing_ok=True)
    start = time.perf_counter()
    subprocess.run([artifact.binary, "train", "--data", str(data), "--epochs", str(epochs), "--log", str(log),
                    "--save", str(checkpoint)], check=True)
    train_seconds = time.perf_counter() - start
    history = [json.loads(line) for line in log.read_text().splitlines()]
    accuracy = history[-1]["val_acc"]
    if split == "test":
        done = subprocess.run([artifact.binary, "eval", "--data", str(data), "--load", str(checkpoint), "--split",
                               "test"], check=True, capture_output=True, text=True)
        accuracy = float(re.search(r"test accuracy ([0-9.]+)", done.stdout).group(1))
    return {"model": name, "target": artifact.target, "epochs": epochs,
            "options": {k: str(v) for k, v in options.items()}, "compile_seconds": round(compile_seconds, 2),
            "train_wall_seconds": round(train_seconds, 2), "seconds_per_epoch": [e["seconds"] for e in history],
            "examples_per_second": round(history[-1]["examples_per_s"]), "val_acc": history[-1]["val_acc"],
            "measured_on": split, "accuracy": accuracy, "goal": goal, "reached": accuracy >= goal}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.strip().split("\n\n")[0].split()))
    parser.add_argument("--mnist-from", metavar="FILE", help="mnist.pkl.gz (default: fetch it, needs a network)")
    parser.add_argument("--fashion-from", metavar="DIR", help="folder of the Fashion-MNIST IDX files (default: "
                        "/usr/share/datasets/fashion-mnist)")
    parser.add_argument("--data", metavar="DIR", default="build/convnets/data", help="where the datasets go")
    parser.add_argument("--out", metavar="DIR", default="build/convnets", help="builds, logs and the summary")
    parser.add_argument("--only", choices=sorted(RUNS), action="append", help="run only this model (repeatable)")
    parser.add_argument("--epochs", type=at_least_one("--epochs"), default=None,
                        help="override every run's number of epochs")
    parser.add_argument("--target", choices=("cuda", "cpu"), default=None, help="default: cuda when a GPU is present")
    args = parser.parse_args(argv)
    try:
        results = run(args)
    except gc.GCompileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:   # the trainer printed its error, or (eval) it was captured
        print(f"{e.stderr or ''}error: {' '.join(map(str, e.cmd))} exited with status {e.returncode}", file=sys.stderr)
        return 1
    out = Path(args.out)
    print(f"\n{'model':<10} {'epochs':>6} {'train s':>8} {'compile s':>9} {'examples/s':>10}  accuracy (goal)")
    for r in results:
        print(f"{r['model']:<10} {r['epochs']:>6} {r['train_wall_seconds']:>8.1f} {r['compile_seconds']:>9.1f} "
              f"{r['examples_per_second']:>10}  {r['measured_on']} {r['accuracy']:.4f} (>= {r['goal']}) "
              f"{'reached' if r['reached'] else 'MISSED'}")
    print(f"summary: {out / 'summary.json'}")
    return 0 if all(r["reached"] for r in results) else 1


def run(args) -> list[dict]:
    """The datasets first (a bad --mnist-from / --fashion-from is reported before any compile), then the
    builds, then the training runs; the summary is written after each."""
    out, target = make_folder(args.out, "output"), args.target or default_target()
    prepare = {"mnist": lambda: prepare_mnist(Path(args.data) / "mnist", args.mnist_from),
               "fashion-mnist": lambda: prepare_fashion_mnist(Path(args.data) / "fashion-mnist", args.fashion_from)}
    names = args.only or sorted(RUNS)
    data = {dataset: prepare[dataset]() for dataset in sorted({RUNS[name][2] for name in names})}
    programs = {name: load_program(HERE / RUNS[name][0], settings=RUNS[name][1]) for name in names}
    with ThreadPoolExecutor(len(names)) as pool:
        builds = dict(zip(names, pool.map(lambda name: build(name, programs[name], target, out), names)))
    results = []
    for name in names:
        results.append(train(name, *builds[name], data[RUNS[name][2]], out, args.epochs))
        (out / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    sys.exit(main())
