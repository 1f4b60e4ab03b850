"""What a bench run produces: rows of measurements, one printed table, one JSON file.

A row is a plain dict (JSON as it is). Every measurement is optional: a row that could not be measured
carries `skipped` with the reason, and the table prints it. Times are seconds in the rows and in the JSON;
the table shows per-step times in microseconds.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np

SECTIONS = ("mnist", "conv", "eltwise", "gemm", "floors")


def row(section: str, model: str, batch, impl: str, **fields) -> dict:
    return dict(section=section, model=model, batch=batch, impl=impl, **fields)


def skipped(section: str, model: str, batch, impl: str, reason: str, **fields) -> dict:
    print(f"  skip {model} b{batch} {impl}: {reason}", flush=True)
    return row(section, model, batch, impl, skipped=reason, **fields)


def failed(section: str, model: str, batch, impl: str, error: Exception, **fields) -> dict:
    """A row for an implementation that raised: the traceback goes to stderr, the first line to the table."""
    traceback.print_exception(error, file=sys.stderr)
    text = str(error).strip()
    return skipped(section, model, batch, impl, f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}",
                   **fields)


def step_stats(seconds_per_step) -> dict:
    """Median and spread (10th and 90th percentile) of per-step times, one value per timed window."""
    t = np.asarray(seconds_per_step, dtype=np.float64)
    return {"step_s": float(np.median(t)), "p10_s": float(np.percentile(t, 10)),
            "p90_s": float(np.percentile(t, 90)), "windows": int(t.size)}


def add_ratios(rows: list) -> None:
    """peer_over_gc = the row's per-step time / gcompile's fp32 per-step time for the same model and batch
    (> 1: gcompile is faster). gcompile rows of another precision get the same ratio against fp32."""
    base = {(r["model"], r["batch"]): r["step_s"] for r in rows
            if r["impl"] == "gcompile" and r.get("precision") == "fp32" and r.get("step_s")}
    for r in rows:
        ref = base.get((r["model"], r["batch"]))
        if ref and r.get("step_s") and not (r["impl"] == "gcompile" and r.get("precision") == "fp32"):
            r["peer_over_gc"] = r["step_s"] / ref


def _fmt(value, scale=1.0, digits=1, suffix=""):
    if value is None:
        return "-"
    v = value * scale
    return f"{v:.{digits}f}{suffix}" if abs(v) < 10 ** 7 else f"{v:.3g}{suffix}"


COLUMNS = [  # header, how to print a row's cell
    ("model", lambda r: f"{r['model']}" + (f" b{r['batch']}" if r.get("batch") else "")),
    ("impl", lambda r: r["impl"]),
    ("prec", lambda r: r.get("precision") or "-"),
    ("step us", lambda r: _fmt(r.get("step_s"), 1e6, 1 if (r.get("step_s") or 1) < 1e-3 else 0)),
    ("p10-p90 us", lambda r: "-" if r.get("p10_s") is None else f"{_fmt(r['p10_s'], 1e6)}-{_fmt(r['p90_s'], 1e6)}"),
    ("peer/gc", lambda r: _fmt(r.get("peer_over_gc"), 1, 2, "x")),
    ("to-acc s", lambda r: "-" if r.get("tta_s") is None and r.get("tta_epochs") is None else
        (f"{_fmt(r.get('tta_s'), 1, 3)} ({r.get('tta_epochs')}ep)" if r.get("tta_s") is not None else
         f"no ({r.get('tta_epochs')}ep)")),
    ("start->acc s", lambda r: _fmt(r.get("start_to_target_s"), 1, 3)),
    ("compile s", lambda r: "-" if r.get("compile_cold_s") is None else
        f"{_fmt(r['compile_cold_s'], 1, 2)}/{_fmt(r.get('compile_cached_s'), 1, 3)}"),
    ("mem MB", lambda r: _fmt(r.get("mem_bytes"), 1e-6, 2)),
    ("kernels", lambda r: "-" if r.get("kernels") is None else str(r["kernels"])),
    ("note", lambda r: ("SKIPPED: " + r["skipped"]) if r.get("skipped") else (r.get("note") or "")),
]


def format_table(rows: list) -> str:
    """One table over every section; a section's rows follow its title line. Columns are as wide as their
    widest cell (the note, last, is not padded)."""
    cells = [[f(r) for _, f in COLUMNS] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(COLUMNS)]

    def line(values):
        return " | ".join(v if i == len(values) - 1 else v.ljust(widths[i]) for i, v in enumerate(values)).rstrip()
    out = [line([h for h, _ in COLUMNS])]
    out.append("-" * len(out[0]))
    for section in SECTIONS + tuple(sorted({r["section"] for r in rows} - set(SECTIONS))):
        members = [c for r, c in zip(rows, cells) if r["section"] == section]
        if members:
            out.append(f"[{section}]")
            out += [line(c) for c in members]
    return "\n".join(out)


LEGEND = """\
step us: per-step time (forward + backward + update, the batch's selection from the shuffled dataset on the
  device included; eltwise: one evaluation), median over timed windows after warm-up, p10-p90 their spread.
  gcompile's: its trainer's (the binary's epochs: training seconds / steps, min-max over the epochs), with
  the GEMM tiles of its tuning record (bench/tuned/<gpu>/, make tune) where one was measured on this GPU; the
  library's step on one batch in its input buffer (Model.time_steps) and the default tiles' in the note.
  peer/gc: this row's step / gcompile fp32 step (> 1: gcompile faster).
to-acc s: training-loop seconds until validation accuracy >= target (MLP 0.97, logreg 0.92), checked after
  every epoch; evaluation time excluded for every impl. Plain SGD from the program's initial values; batch 128:
  lr 0.1, shuffled every epoch; batch 1000: the reference experiment's lr 1.0 in the file's order.
start->acc s: gcompile binary, process start to the epoch line that reaches the target.
compile s: cold / cached. mem MB: device memory one step needs beyond parameters and data.
kernels: kernel launches per training step (gcompile: manifest; torch: profiler; JAX: HLO estimate)."""


# The targets of issue 4 (shared/performance.md) and issue 5, checked on the rows of one run:
# (label, (model, batch, impl, precision), what, limit, unit scale, unit). what is a row field (the limit is
# a maximum), "min:<field>" (a minimum), "ratio:<impl>" (that impl's fp32 step / this row's step, same model
# and batch: a minimum) or "over:<impl>" (this row's step / that impl's: a maximum).
TARGETS = [
    ("MLP step, batch 128, fp32", ("mnist_mlp", 128, "gcompile", "fp32"), "step_s", 15e-6, 1e6, "us"),
    ("MLP step, batch 1000, fp32", ("mnist_mlp", 1000, "gcompile", "fp32"), "step_s", 40e-6, 1e6, "us"),
    ("MLP step, batch 1000, tf32", ("mnist_mlp", 1000, "gcompile", "tf32"), "step_s", 20e-6, 1e6, "us"),
    ("logreg step, batch 128, fp32", ("mnist_logreg", 128, "gcompile", "fp32"), "step_s", 8e-6, 1e6, "us"),
    ("MLP b128: JAX scan fp32 / gcompile", ("mnist_mlp", 128, "gcompile", "fp32"), "ratio:jax-scan", 2.5, 1, "x"),
    ("MLP b1000: JAX scan fp32 / gcompile", ("mnist_mlp", 1000, "gcompile", "fp32"), "ratio:jax-scan", 2.5, 1, "x"),
    ("MLP b128: PyTorch CUDA graph / gcompile", ("mnist_mlp", 128, "gcompile", "fp32"), "ratio:torch-graph", 4.0, 1,
     "x"),
    ("MLP time to 97% (training loop), b128 lr 0.1 shuffled", ("mnist_mlp", 128, "gcompile", "fp32"), "tta_s",
     0.040, 1e3, "ms"),
    ("MLP time to 97% (training loop), b1000 lr 1.0 file order (the reference)", ("mnist_mlp", 1000, "gcompile",
                                                                                  "fp32"), "tta_s", 0.040, 1e3, "ms"),
    ("MLP process start to 97% printed, b128", ("mnist_mlp", 128, "gcompile", "fp32"), "start_to_target_s", 1.0, 1,
     "s"),
    ("MLP process start to 97% printed, b1000", ("mnist_mlp", 1000, "gcompile", "fp32"), "start_to_target_s", 1.0,
     1, "s"),
    ("MLP compile, cold", ("mnist_mlp", 128, "gcompile", "fp32"), "compile_cold_s", 3.0, 1, "s"),
    ("MLP compile, cached", ("mnist_mlp", 128, "gcompile", "fp32"), "compile_cached_s", 0.2, 1, "s"),
    ("MLP b1000 memory beyond params", ("mnist_mlp", 1000, "gcompile", "fp32"), "mem_bytes", 4e6, 1e-6, "MB"),
    ("LeNet: gcompile / PyTorch CUDA graph", ("mnist_lenet", 128, "gcompile", "fp32"), "over:torch-graph", 1.0, 1, "x"),
    ("ResNet-14: gcompile / PyTorch CUDA graph", ("resnet14", 128, "gcompile", "fp32"), "over:torch-graph", 1.0, 1,
     "x"),
    ("fused elementwise, of copy bandwidth", ("eltwise 256MB", None, "gcompile", "fp32"), "min:fraction_of_copy", 0.85,
     100, "%"),
]


def check_targets(rows: list) -> list:
    """[{label, value, limit, unit, ok}] for every target whose rows were measured in this run."""
    def find(model, batch, impl, precision):
        return next((r for r in rows if (r["model"], r["batch"], r["impl"], r.get("precision")) ==
                     (model, batch, impl, precision) and r.get("step_s")), None)
    out = []
    for label, key, what, limit, scale, unit in TARGETS:
        r = find(*key)
        if r is None:
            continue
        kind, _, name = what.rpartition(":")
        if kind in ("ratio", "over"):
            other = find(key[0], key[1], name, "fp32")
            value = None if other is None else (other["step_s"] / r["step_s"] if kind == "ratio" else
                                                r["step_s"] / other["step_s"])
        else:
            value = r.get(name)
        if value is None:
            continue
        at_least = kind in ("ratio", "min")
        out.append({"label": label, "value": value * scale, "limit": limit * scale, "unit": unit,
                    "ok": bool(value >= limit if at_least else value <= limit), "kind": ">=" if at_least else "<="})
    return out


def format_targets(checks: list) -> str:
    return "\n".join(f"  {'ok  ' if c['ok'] else 'MISS'} {c['label']}: {c['value']:.3g} {c['unit']} "
                     f"(target {c['kind']} {c['limit']:.3g} {c['unit']})" for c in checks)


def _run(cmd) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def git_commit(root: Path) -> str:
    """The commit the bench ran at: $GCOMPILE_COMMIT (the Makefile's COMMIT), else git's HEAD, '-dirty' added
    where the tracked files differ from it (a copy of the tree may carry a .git of an older commit: its files
    then differ), else 'unknown'."""
    commit = os.environ.get("GCOMPILE_COMMIT", "").strip()
    if commit:
        return commit
    commit = _run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"])
    if commit and _run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"]):
        commit += "-dirty"
    return commit or "unknown"


def environment(root: Path, device: str) -> dict:
    """GPU, commit, date and the versions of everything measured. torch/jax versions are filled by the
    peers that import them (an import here would cost seconds when they are skipped)."""
    gpu = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    nvcc = _run(["nvcc", "--version"]).splitlines()
    import gcompile
    cpu = f"cpu ({platform.processor() or platform.machine()})"
    return {
        "gpu": gpu.split(",")[0].strip() if device == "cuda" and gpu else cpu,
        "nvidia_smi": gpu or None,
        "commit": git_commit(root),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "versions": {"python": sys.version.split()[0], "numpy": np.__version__, "gcompile": gcompile.__version__,
                     "nvcc": nvcc[-2].strip() if len(nvcc) >= 2 else None},
    }


def gpu_slug(gpu: str) -> str:
    """A GPU's name as a file name's part: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()


def results_name(meta: dict) -> str:
    return f"{gpu_slug(meta['gpu'])}-{meta['commit']}.json"


def write_json(results: dict, out_dir) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / results_name(results["meta"])
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return path
