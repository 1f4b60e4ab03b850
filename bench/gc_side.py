"""gcompile's side of the benchmark: build (cold and cached), check the first step against numpy, time
steps through `Model.time_steps` (the timing ABI), read kernels and arena from the manifest, and run the
standalone binary for time to accuracy.
"""
from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

import gcompile as gc

from .report import row, skipped
from .tasks import LR, Recipe, Task, check_loss
from .timing import time_windows

EPOCH_LINE = re.compile(r"epoch\s+(\d+)/\d+.*?val_acc\s+([0-9.]+)")


def precision_kwargs(precision: str) -> tuple[dict, str | None]:
    """gc.compile's keyword for the precision, or the reason it cannot be asked for."""
    if "precision" in inspect.signature(gc.compile).parameters:
        return {"precision": precision}, None
    if precision == "fp32":
        return {}, None  # the only precision there is
    return {}, "gc.compile has no `precision` parameter in this tree (the tf32 path is not merged)"


COLD_BUILDS = 3   # one cold build's time moved by ~0.3 s from run to run (H100 host, the MLP b128: 2.0-2.5 s)


def build(program, target: str, out_dir: Path, precision: str, name: str | None = None):
    """(artifact, cold seconds, cached seconds, every cold build's seconds): COLD_BUILDS builds, each into an
    emptied folder (the figure is their median), then the same call again, which the build cache answers."""
    kwargs, _ = precision_kwargs(precision)
    colds = []
    for _ in range(COLD_BUILDS):
        shutil.rmtree(out_dir, ignore_errors=True)
        t0 = time.perf_counter()
        gc.compile(program, target=target, out_dir=out_dir, name=name, **kwargs)
        colds.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    artifact = gc.compile(program, target=target, out_dir=out_dir, name=name, **kwargs)
    cached = time.perf_counter() - t0
    return artifact, float(np.median(colds)), cached, colds


def memory_fields(manifest: dict) -> dict:
    """Arena bytes, and the part of it beyond the trainable parameters (what torch's peak is compared with)."""
    params = sum(int(np.prod(v["shape"])) * np.dtype(v["dtype"]).itemsize
                 for v in manifest["variables"] if v.get("trainable", True))
    arena = manifest.get("arena_bytes")
    return {"arena_bytes": arena, "mem_bytes": None if arena is None else arena - params}


def kernels_of(manifest: dict, which: str = "train"):
    return (manifest.get("kernels") or {}).get(which)


def binary_help(binary: str) -> str:
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def run_binary(artifact, data_dir: str, epochs: int, batch: int, train_count: int, target: float | None,
               timeout: float, recipe: Recipe | None = None) -> dict:
    """Train with the standalone binary (the recipe's lr and order; without one lr 0.1, shuffled) and read its
    epoch lines as they are printed. Returns per-epoch validation accuracy, training-loop seconds (steps *
    batch / examples_per_s of its --log lines), seconds from process start to each epoch line, and the
    --target-acc line of the log (the binary's own timing) when it wrote one."""
    log = Path(artifact.out_dir) / "bench-train.jsonl"
    log.unlink(missing_ok=True)
    cmd = [artifact.binary, "train", "--data", data_dir, "--epochs", str(epochs),
           "--lr", str(recipe.lr if recipe else LR), "--log", str(log)]
    if recipe is not None and not recipe.shuffle:
        cmd.append("--no-shuffle")
    if target is not None and "--target-acc" in binary_help(artifact.binary):
        cmd += ["--target-acc", str(target)]
    seen, lines = {}, []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
        for line in proc.stdout:
            now = time.perf_counter() - t0
            lines.append(line.rstrip())
            m = EPOCH_LINE.search(line)
            if m:
                seen[int(m.group(1))] = (float(m.group(2)), now)
            if now > timeout:
                proc.kill()
                break
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode not in (0, None) and not seen:
        raise RuntimeError(f"{Path(cmd[0]).name} exited {proc.returncode}: {' / '.join(lines[-3:])}")
    steps = train_count // batch
    entries = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.exists() else []
    epochs_out = []
    for entry in (e for e in entries if "val_acc" in e):  # one line per epoch; --target-acc adds its own
        acc, at = seen.get(entry["epoch"], (entry["val_acc"], None))
        epochs_out.append({"epoch": entry["epoch"], "val_acc": acc, "since_start_s": at,
                           "train_s": steps * batch / entry["examples_per_s"]})
    return {"command": " ".join(cmd), "epochs": epochs_out, "stdout_tail": lines[-4:],
            "target_line": next((e for e in entries if "target_acc" in e), None)}


def accuracy_fields(run: dict, target: float) -> dict:
    """Training-loop seconds to the first epoch at the target (the binary's own sum when its --target-acc
    line is there), and seconds from starting the process to that epoch's line."""
    total = 0.0
    for e in run["epochs"]:
        total += e["train_s"]
        if e["val_acc"] >= target:
            fields = {"tta_s": total, "tta_epochs": e["epoch"], "tta_acc": e["val_acc"],
                      "start_to_target_s": e["since_start_s"]}
            line = run.get("target_line")
            if line and line.get("epoch") == e["epoch"]:
                fields.update(tta_s=line["train_seconds"], binary_since_start_s=line["since_start_seconds"])
            return fields
    last = run["epochs"][-1]["val_acc"] if run["epochs"] else None
    return {"tta_s": None, "tta_epochs": len(run["epochs"]), "tta_acc": last,
            "tta_note": f"target {target} not reached (last {last})"}


def tuned_artifact(task: Task, target: str, precision: str, work_dir: Path):
    """(artifact, note): the program built with its tuning record from bench/tuned/<this GPU>/ (make tune)
    where there is one, else (None, why not, or None when no GPU has a record for it)."""
    from gcompile.tune import gpu_name
    from .tune import gpu_record

    here = gpu_name()
    if target != "cuda" or here is None:
        return None, None
    path, record, why_not = gpu_record(task.model, task.batch, precision, here)
    if path is None:
        return None, why_not
    kwargs, _ = precision_kwargs(precision)
    try:
        artifact = gc.compile(task.program, target=target, out_dir=work_dir / f"{task.model}-b{task.batch}-"
                              f"{precision}-tuned", tuning=record, **kwargs)
    except gc.GCompileError as e:
        return None, f"{path.name} not used ({e}): default tiles"
    return artifact, f"tiles tuned ({path.name}: {len(record['kernels'])} GEMM kernels retiled)"


def trainer_step(fields: dict, run: dict, steps: int) -> list:
    """Make the row's step the trainer's: the binary's epochs (training seconds / steps: the batch's selection
    from the shuffled dataset on the device included, as it is in every peer's step), median and min-max over
    the epochs; the library's step (Model.time_steps: the same program on one batch already in its input
    buffer) stays beside it as library_step_s. Returns the notes to add."""
    per_step = [e["train_s"] / steps for e in run["epochs"]]
    if not per_step:
        return [f"the binary finished no epoch ({' / '.join(run['stdout_tail'])}): step = Model.time_steps"]
    library = fields.pop("step_s")
    fields.update(step_s=float(np.median(per_step)), p10_s=min(per_step), p90_s=max(per_step),
                  library_step_s=library, library_p10_s=fields.pop("p10_s", None),
                  library_p90_s=fields.pop("p90_s", None), trainer_epochs=len(per_step),
                  timing="trainer: the binary's epochs, training seconds / steps (min-max over the epochs)")
    return [f"library step {library * 1e6:.2f} us (Model.time_steps, one batch in its input buffer)"]


def gcompile_row(task: Task, target: str, precision: str, settings, work_dir: Path, with_accuracy: bool) -> dict:
    """Build, check and time one task; with_accuracy also trains the binary to the task's target."""
    name = task.model
    _, reason = precision_kwargs(precision)
    if reason:
        return skipped(task.section, name, task.batch, "gcompile", reason, precision=precision)
    artifact, cold, cached, colds = build(task.program, target, work_dir / f"{name}-b{task.batch}-{precision}",
                                          precision)
    manifest = json.loads(Path(artifact.manifest).read_text())
    fields = dict(precision=precision, compile_cold_s=cold, compile_cold_builds_s=colds, compile_cached_s=cached,
                  kernels=kernels_of(manifest), **memory_fields(manifest))
    notes = []
    tuned, note = tuned_artifact(task, target, precision, work_dir)
    notes += [note] if note else []
    with gc.load(artifact) as model:
        xb, yb = task.batch0()
        note = check_loss(model.train_step(xb, yb), task.reference_loss, precision)
        notes += [note] if note else []
        if hasattr(model, "time_steps"):
            fields.update(time_windows(lambda n: model.time_steps(n), settings))
            fields["timing"] = "Model.time_steps (the library's step on one batch, replayed in graphs as the trainer replays its steps)"
    if tuned is not None:   # the row is the tuned build's (its time, launches, memory: a record's tiles may add
        # workspaces, lower.py's mirror_variables); the default tiles' time stays beside it
        tuned_manifest = json.loads(Path(tuned.manifest).read_text())
        fields.update(kernels=kernels_of(tuned_manifest), **memory_fields(tuned_manifest))
        with gc.load(tuned) as model:
            note = check_loss(model.train_step(xb, yb), task.reference_loss, precision)
            notes += [f"tuned: {note}"] if note else []
            untuned = {k: fields.pop(k) for k in ("step_s", "p10_s", "p90_s") if k in fields}
            fields.update(time_windows(lambda n: model.time_steps(n), settings),
                          untuned_step_s=untuned.get("step_s"))
            if untuned.get("step_s"):
                notes.append(f"default tiles {untuned['step_s'] * 1e6:.2f} us (library step)")
        artifact = tuned
    if "step_s" not in fields:  # the timing ABI is not in this tree: fall back to the binary's epoch log
        run = run_binary(artifact, task.data.path, 2 if settings.quick else 3, task.batch, len(task.data.train_y),
                         None, timeout=120)
        per_step = [e["train_s"] / (len(task.data.train_y) // task.batch) for e in run["epochs"]]
        if not per_step:
            return skipped(task.section, name, task.batch, "gcompile", "no Model.time_steps, and the binary "
                           f"finished no epoch in 120 s: {' / '.join(run['stdout_tail'])}", **fields)
        fields.update(step_s=float(np.median(per_step)), p10_s=min(per_step), p90_s=max(per_step),
                      windows=len(per_step), timing="binary epoch log (train seconds / steps)")
        notes.append("no Model.time_steps: step = binary's epoch train time / steps")
    library_timed = fields.get("timing", "").startswith("Model.time_steps")   # else the binary's epochs, above
    run = None
    if with_accuracy and task.target is not None and task.recipe is not None:
        run = run_binary(artifact, task.data.path, settings.max_epochs, task.batch, len(task.data.train_y),
                         task.target, timeout=120, recipe=task.recipe)
        fields.update(accuracy_fields(run, task.target), binary_run=run, recipe=task.recipe.label)
        if not task.recipe.shuffle:
            run = None   # the step is timed on shuffled batches (the legend's), as every peer's is
    if library_timed and run is None:
        run = run_binary(artifact, task.data.path, 2 if settings.quick else 3, task.batch, len(task.data.train_y),
                         None, timeout=120)
    if library_timed:
        notes += trainer_step(fields, run, len(task.data.train_y) // task.batch)
    if fields.get("kernels") is None:
        notes.append("manifest has no 'kernels'")
    return row(task.section, name, task.batch, "gcompile", note="; ".join(notes), **fields)


def eltwise_program(n: int):
    """A long elementwise chain over n float32 values (eltwise_reference is its numpy twin); a fused kernel
    reads x once and writes y once."""
    x = gc.placeholder("x", (n,))
    t = gc.relu(x * 1.5 + 0.25) * 0.75
    t = gc.maximum(t - x * 0.5, x * 0.125) + 1.0
    return x, gc.relu(t * t * 0.5 - 0.0625) + x * 0.25


def eltwise_reference(v: np.ndarray) -> np.ndarray:
    f = np.float32
    t = np.maximum(v * f(1.5) + f(0.25), 0) * f(0.75)
    t = np.maximum(t - v * f(0.5), v * f(0.125)) + f(1.0)
    return np.maximum(t * t * f(0.5) - f(0.0625), 0) + v * f(0.25)


def reduce_program(n: int):
    """A mean squared difference over a whole (n / 1024, 1024) matrix: one value from n (the loss of a
    regression): a reduction over one long slice, which the fuse pass splits into many."""
    x = gc.placeholder("x", (n // 1024, 1024))
    return x, gc.reduce_mean((x - 0.5) * (x - 0.5))


def reduce_reference(v: np.ndarray) -> np.ndarray:
    return np.mean((v.astype(np.float64) - 0.5) ** 2)


# name -> (program, numpy twin, tolerance, bytes moved for n values: read + written)
BANDWIDTH_PROGRAMS = {"eltwise": (eltwise_program, eltwise_reference, 1e-5, lambda n: 2 * 4 * n),
                      "reduce": (reduce_program, reduce_reference, 1e-4, lambda n: 4 * n)}


def bandwidth_row(kind: str, n: int, target: str, settings, work_dir: Path) -> dict:
    """Build BANDWIDTH_PROGRAMS[kind] as an evaluation program over n float32 values, check it against
    numpy, time `time_steps(which="eval")`. bandwidth = the bytes its kernel must move / time."""
    program, reference, rtol, moved = BANDWIDTH_PROGRAMS[kind]
    model_name = f"{kind} {n * 4 >> 20}MB"
    x, y = program(n)
    artifact, cold, cached, colds = build([y], target, work_dir / kind, "fp32", name=kind)
    manifest = json.loads(Path(artifact.manifest).read_text())
    fields = dict(precision="fp32", compile_cold_s=cold, compile_cold_builds_s=colds, compile_cached_s=cached,
                  kernels=kernels_of(manifest, "eval"),
                  arena_bytes=manifest.get("arena_bytes"), bytes_moved=moved(n))
    v = np.random.RandomState(0).uniform(-2, 2, x.shape).astype(np.float32)
    with gc.load(artifact) as model:
        out = model.predict(v)
        bad = ~np.isclose(out, reference(v), rtol=rtol, atol=1e-6)
        note = f"CHECK FAILED: {int(bad.sum())} values differ from numpy" if bad.any() else ""
        del out
        if not hasattr(model, "time_steps"):
            return skipped("eltwise", model_name, None, "gcompile", "no Model.time_steps in this tree", **fields)
        fields.update(time_windows(lambda k: model.time_steps(k, which="eval"), settings, warmup=3))
    fields["bandwidth_Bps"] = fields["bytes_moved"] / fields["step_s"]
    return row("eltwise", model_name, None, "gcompile", note=note, **fields)
