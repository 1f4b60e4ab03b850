"""Write the fuzzing seed corpus (tests/fuzz_corpus/): the bad dataset files and bad checkpoints whose messages
test_validation.py and test_checkpoint.py check, and good ones, all for tests/reliability.py's small_program.

    PYTHONPATH=. python3 tests/fuzz_corpus/make_corpus.py

Run it again when small_program or the checkpoint format changes (test_fuzz.py's test_corpus_is_current
says so). Names say what a seed is: ok-* must be accepted, bad-* refused.
"""
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import gcompile as gc  # noqa: E402
from reliability import (BAD_CHECKPOINTS, DATASET_CASES, IMAGES, LABELS, as_version_2, damaged_dataset,  # noqa: E402
                         idx_bytes, small_program, write_split)

DATASET_FILES = ("train_images.npy", "train_labels.npy")


def slug(name: str) -> str:
    return name.replace(" ", "-")


def write_datasets(out: Path) -> None:
    for case, (files, _) in DATASET_CASES.items():
        if any(not isinstance(content, bytes) for content in files.values()):
            continue  # a missing file or a folder: not something a file corpus holds
        damaged_dataset(out / f"bad-{slug(case)}", case)
    write_split(out / "ok-uint8", "train", IMAGES, LABELS)
    write_split(out / "ok-float32", "train", IMAGES.astype(np.float32) / 256, LABELS.astype(np.int32))
    write_split(out / "ok-idx", "train", IMAGES, LABELS.astype(np.int64))
    (out / "ok-idx" / "train_images.npy").write_bytes(idx_bytes(IMAGES))   # the reader tells IDX by content
    for folder in out.iterdir():   # only the train split is fuzzed
        for path in folder.iterdir():
            if path.name not in DATASET_FILES:
                path.unlink()


def write_checkpoints(out: Path, work: Path) -> None:
    artifact = gc.compile(small_program(), target="cpu", out_dir=work)
    with gc.load(artifact) as model:
        shutil.copyfile(artifact.init, out / "ok-initial.ckpt")
        r = np.random.RandomState(0)
        for _ in range(3):
            model.train_step(r.uniform(0, 1, (4, 6)).astype(np.float32), r.randint(0, 3, 4).astype(np.int32))
        model.save(out / "ok-trained.ckpt")
        (out / "ok-version-2.ckpt").write_bytes(as_version_2((out / "ok-trained.ckpt").read_bytes()))
        for case, (make, _) in BAD_CHECKPOINTS.items():
            (out / f"bad-{slug(case)}.ckpt").write_bytes(make(model))


def main() -> None:
    for sub in ("datasets", "checkpoints"):
        shutil.rmtree(HERE / sub, ignore_errors=True)
        (HERE / sub).mkdir()
    write_datasets(HERE / "datasets")
    with tempfile.TemporaryDirectory() as work:
        write_checkpoints(HERE / "checkpoints", Path(work))
    print(f"wrote {len(list((HERE / 'datasets').iterdir()))} dataset seeds and "
          f"{len(list((HERE / 'checkpoints').iterdir()))} checkpoint seeds under {HERE}")


if __name__ == "__main__":
    main()
