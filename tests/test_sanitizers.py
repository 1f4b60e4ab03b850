"""Sanitizers. On any machine: the cpu target built with sanitize=True (AddressSanitizer + UBSan, every
report fatal) trains, checkpoints, is killed and resumed, stops and skips on bad steps, and reads the fuzz
corpus plus a few hundred mutations of it — with no report. On a GPU machine: compute-sanitizer memcheck and
racecheck on the trainer of every example model, for a few steps."""
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import gcompile as gc
from conftest import EXAMPLES, load_example
from reliability import small_program, synthetic_dataset, write_split

CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"
SANITIZER_ENV = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:exitcode=99",
                 "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=98"}
REPORT = re.compile(r"AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:")


def sanitized(artifact, *args, expect: int, timeout=600) -> subprocess.CompletedProcess:
    proc = subprocess.run([artifact.binary, *map(str, args)], capture_output=True, text=True, errors="replace",
                          timeout=timeout, env={**os.environ, **SANITIZER_ENV})
    assert not REPORT.search(proc.stderr), proc.stderr
    assert proc.returncode == expect, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def mutations(data: bytes, rng: np.random.RandomState, count: int):
    """`count` damaged copies of `data`: cut, extended, or with a few bytes overwritten (mostly the header)."""
    for _ in range(count):
        how = rng.randint(3)
        if how == 0:
            yield data[:rng.randint(len(data))]
        elif how == 1:
            yield data + rng.bytes(rng.randint(1, 16))
        else:
            damaged = bytearray(data)
            for at in rng.randint(0, min(len(data), 160), rng.randint(1, 4)):
                damaged[at] = rng.randint(256)
            yield bytes(damaged)


@pytest.fixture(scope="module")
def asan(tmp_path_factory):
    artifact = gc.compile(small_program(positive=True), target="cpu", sanitize=True,
                          out_dir=tmp_path_factory.mktemp("asan"))
    assert "-fsanitize=address,undefined" in open(artifact.source).read().splitlines()[2]
    runtime = subprocess.run([artifact.binary, "--help"], capture_output=True, text=True,
                             env={**os.environ, "ASAN_OPTIONS": "help=1"})
    assert "Available flags for AddressSanitizer" in runtime.stderr   # the sanitizers are really in there
    return artifact


@pytest.mark.slow
def test_training_checkpoints_and_resume_under_asan_and_ubsan(asan, tmp_path):
    data = synthetic_dataset(tmp_path / "data", n_train=40, n_valid=10)   # 10 steps per epoch, a partial batch
    ckpt, log = tmp_path / "run.ckpt", tmp_path / "log.jsonl"
    sanitized(asan, "train", "--data", data, "--epochs", 2, "--save", ckpt, "--save-every", 3, "--log", log,
              expect=0)
    sanitized(asan, "train", "--resume", ckpt, "--data", data, "--epochs", 3, expect=0)
    sanitized(asan, "eval", "--data", data, "--load", ckpt, expect=0)

    # the kill test's path: SIGKILL a long run after a few checkpoints, then resume it
    ckpt = tmp_path / "killed.ckpt"
    proc = subprocess.Popen([asan.binary, "train", "--data", str(data), "--epochs", "1000", "--save", str(ckpt),
                             "--save-every", "7"], env={**os.environ, **SANITIZER_ENV},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (ckpt.exists() and gc.read_checkpoint(ckpt).step >= 50) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    killed = gc.read_checkpoint(ckpt)
    assert killed.step >= 50
    sanitized(asan, "train", "--resume", ckpt, "--data", data, "--epochs", killed.epoch + 2, "--save-every", 7,
              expect=0)
    assert gc.read_checkpoint(ckpt).epoch == killed.epoch + 2

    # the guard, stopping and skipping, on an example of 3e38s
    images = np.load(data / "train_images.npy").astype(np.float32) / 256
    images[13] = 3e38
    write_split(tmp_path / "poisoned", "train", images, np.load(data / "train_labels.npy"))
    write_split(tmp_path / "poisoned", "valid", images[:10], np.load(data / "valid_labels.npy"))
    proc = sanitized(asan, "train", "--data", tmp_path / "poisoned", "--no-shuffle", "--save", tmp_path / "p.ckpt",
                     "--save-every", 2, expect=3)
    assert "non-finite loss at step 4 of the run" in proc.stderr
    sanitized(asan, "train", "--data", tmp_path / "poisoned", "--epochs", 2, "--on-nonfinite", "skip", expect=0)

    for args in (["train", "--data", data, "--epochs", "-1"], ["train", "--data", data, "--lr", "x"],
                 ["train", "--data", data, "--bogus"], ["check", "nonsense", "f"]):
        sanitized(asan, *args, expect=2)


@pytest.mark.slow
def test_fuzz_corpus_and_mutations_under_asan_and_ubsan(asan, tmp_path):
    seeds = sorted((CORPUS / "datasets").iterdir())
    proc = sanitized(asan, "check", "train", *seeds, expect=1)
    assert len(proc.stdout.splitlines()) == len(seeds)
    checkpoints = sorted((CORPUS / "checkpoints").glob("*.ckpt"))
    sanitized(asan, "check", "checkpoint", *checkpoints, expect=1)   # the corpus's program is not asan's

    rng = np.random.RandomState(0)
    folders = []
    for i, seed in enumerate(seeds):
        for j, images in enumerate(mutations((seed / "train_images.npy").read_bytes(), rng, 10)):
            folder = tmp_path / f"d{i}-{j}"
            folder.mkdir()
            (folder / "train_images.npy").write_bytes(images)
            shutil.copyfile(seed / "train_labels.npy", folder / "train_labels.npy")
            folders.append(folder)
    proc = sanitized(asan, "check", "train", *folders, expect=1)
    assert len(proc.stdout.splitlines()) == len(folders)

    sanitized(asan, "train", "--data", synthetic_dataset(tmp_path / "d"), "--epochs", 1, "--save",
              tmp_path / "own.ckpt", expect=0)
    own = (tmp_path / "own.ckpt").read_bytes()
    paths = []
    for j, damaged in enumerate(mutations(own, rng, 300)):
        paths.append(tmp_path / f"c{j}.ckpt")
        paths[-1].write_bytes(damaged)
    proc = sanitized(asan, "check", "checkpoint", tmp_path / "own.ckpt", *paths, expect=1)
    assert proc.stdout.splitlines()[0].endswith(": ok") and len(proc.stdout.splitlines()) == 301


# --- on a GPU machine: compute-sanitizer on every example's trainer (make gpu-test) ------------------------
def compute_sanitizer() -> str:
    found = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(found):
        pytest.skip("compute-sanitizer is not installed (it comes with the CUDA toolkit)")
    return found


def few_steps_dataset(manifest, folder: Path, batch: int) -> Path:
    """Random uint8 data shaped like the program's input: 4 training steps, 1.5 batches of validation."""
    x = next(i for i in manifest["train_inputs"] if i["dtype"] == "float32")
    classes = next(o for o in manifest["outputs"] if o["name"] == "logits")["shape"][1]
    row = int(np.prod(x["shape"][1:]))
    r = np.random.RandomState(0)
    for split, n in (("train", 4 * batch), ("valid", batch + batch // 2)):
        write_split(folder, split, r.randint(0, 256, (n, row)).astype(np.uint8),
                    r.randint(0, classes, n).astype(np.uint8))
    return folder


# every example that is a model file (defines program()); scripts such as train_convnets.py are not
MODEL_FILES = sorted(p.stem for p in EXAMPLES.glob("*.py") if "\ndef program(" in p.read_text())

# tool: (extra options, its summary line with every count in a group); initcheck and synccheck would be rows
# like memcheck's
TOOLS = {
    "memcheck": (["--leak-check", "full"], r"ERROR SUMMARY: (\d+) errors?"),
    "racecheck": ([], r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("tool", sorted(TOOLS))
@pytest.mark.parametrize("example", MODEL_FILES)
def test_compute_sanitizer_on_the_trainer(example, tool, tmp_path):
    """A few training steps (with a save point and a partial validation batch) of every example model under
    compute-sanitizer: 0 errors, 0 hazards. New examples (the conv nets) are picked up by the glob."""
    sanitizer = compute_sanitizer()
    make = load_example(example).program
    program = make(batch_size=16) if "batch_size" in inspect.signature(make).parameters else make()
    artifact = gc.compile(program, target="cuda", out_dir=tmp_path / "build")
    manifest = json.loads(Path(artifact.manifest).read_text())
    if not manifest["has_trainer"]:
        pytest.skip(f"{example} has no standalone trainer")
    data = few_steps_dataset(manifest, tmp_path / "data", manifest["batch_size"])
    options, summary = TOOLS[tool]
    proc = subprocess.run([sanitizer, "--tool", tool, *options, "--error-exitcode", "1", artifact.binary, "train",
                           "--data", str(data), "--epochs", "1", "--save", str(tmp_path / "run.ckpt"),
                           "--save-every", "2"], capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    print(f"{example} {tool}: " + " | ".join(line.strip("= ") for line in output.splitlines() if "SUMMARY" in line))
    counts = re.findall(summary, output)
    errors = re.findall(r"ERROR SUMMARY: (\d+) errors?", output)
    assert proc.returncode == 0 and counts, output[-4000:]
    assert all(int(n) == 0 for row in counts for n in (row if isinstance(row, tuple) else (row,))), output[-4000:]
    assert all(int(n) == 0 for n in errors), output[-4000:]
