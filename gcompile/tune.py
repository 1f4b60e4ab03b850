"""gc.tune: the GEMM tiles of a training step chosen by timing the whole step on the GPU.

`choose_tile` (gemm_tiles.py) picks each GEMM's tile from a sweep that times every GEMM alone. In the step
the GEMMs share the GPU with the other branches, so the fastest tile alone is not always the fastest there
(docs/compiler.md, "A GEMM's tile beside another branch"). Tuning measures instead: it builds the program
with one GEMM's tile replaced by each of its alternatives (`gemm_tiles.alternatives`: the measured fastest
and the cost model's cheapest), times the step (`Model.time_steps`, interleaved with the best so far) and
keeps a replacement that is faster by more than `margin`; one GEMM after the other, the most expensive
first (coordinate descent). A GEMM's twins in the evaluation step (`followers`: the same shape and input, as
the MLP's x @ W1) get its tile with it. The GEMMs that read the image input in place are first also tried
together on each of fp32's tf32-parts tiles (gemm_tiles.TC_PARTS_MIN): those take the input's bytes exactly,
but only where none of the others takes float rows. Every candidate's parameters after a few steps must agree with the default
build's (fp32 tiles change only the order of sums, to 1e-4); under tf32, whose tiles also round operands each
their own way, every candidate's (and the default build's) to the fp32 build's, to 1e-2. Given a dataset
(`data=`), the steps timed are the trainer's (the standalone binary's epochs), which read the batch in place
from the dataset through row indices: what users' training runs, and not always ranked as the library's
steps are (H100, MLP b128, dW1 on 64 x 64 x 16 / 8 x 4 K-group split 2: 21.64 us against 21.27 for the
library, 22.72 against 23.83 for the trainer).

The result is a tuning record, a JSON-able dict:
    {"format": "gcompile-tuning/1", "program": <digest of the simplified graph>, "name", "precision",
     "gpu", "timing": "library" or "trainer",
     "kernels": [{"kernel": "k<index>", "name", "m", "n", "k", "batch", "tile", "split", "default"}],
     "baseline_us",
     "tuned_us", "trials": [...], "seconds"}
`gc.compile(..., tuning=record or path)` builds with its tiles; a record made for another program (graph,
shapes, precision) is refused with the reason. The GPU it was measured on is recorded, not checked: a
record is a measurement of one machine, like the calibration file.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from .errors import GCompileError
from .resources import make_folder, read_json
from .passes.lower import C_TYPES, kernel_key

FORMAT = "gcompile-tuning/1"
DTYPES = {c: d for d, c in C_TYPES.items()}   # a lowered GEMM's C element type -> its dtype


FP32_AGREE = 1e-4        # a fp32 candidate's one-step update against the default tiles' (norm-wise, relative)
TF32_STEP_AGREE = 1e-2   # a tf32 build's one-step update against the fp32 build's: 5 x one GEMM's 2e-3


def disagreeing(got: dict, reference: dict, agree: float) -> list[str]:
    """The variables whose update in `got` differs from `reference`'s by more than `agree` of its norm."""
    return [v for v in reference
            if np.linalg.norm(got[v] - reference[v]) > agree * max(np.linalg.norm(reference[v]), 1e-30)]


def program_digest(simplified: str, precision: str) -> str:
    """What a record is tied to: the graph after simplify (ops, shapes, names) and the precision — not the
    variables' initial values (another learning rate or seed is the same program for the GEMMs' tiles; a
    record made at lr 0.1 was refused at 1.0)."""
    graph = re.sub(r"\binit=[^,}(]*(\([^()]*\))?", "init=", simplified)
    return hashlib.sha256(f"{precision}\n{graph}".encode()).hexdigest()[:20]


def read_record(tuning) -> dict:
    """A tuning record from a dict or a JSON file's path, its fields checked; the copy returned carries
    "source" (the file, or "tuning record"), which the later checks' messages name."""
    if isinstance(tuning, (str, Path)):
        path = Path(tuning)
        record, where = read_json(path, "tuning record", "tuning record"), str(path)
    else:
        record, where = tuning, "tuning record"
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise GCompileError(f"{where}: not a tuning record (expected \"format\": \"{FORMAT}\")")
    if not isinstance(record.get("kernels"), list) or not isinstance(record.get("program"), str):
        raise GCompileError(f"{where}: a tuning record needs \"program\" and a \"kernels\" list")
    seen = set()
    for e in record["kernels"]:
        if not isinstance(e, dict) or not {"kernel", "m", "n", "k", "tile", "split"} <= set(e):
            raise GCompileError(f"{where}: kernel entry {e!r} lacks kernel, m, n, k, tile or split")
        wrong = [f for f, kind in (("kernel", str), ("tile", str), ("m", int), ("n", int), ("k", int),
                                   ("split", int))
                 if not isinstance(e[f], kind) or isinstance(e[f], bool)]
        if wrong:
            raise GCompileError(f"{where}: kernel entry {e['kernel']!r}: " + ", ".join(
                f"{f} must be {'a string' if f in ('kernel', 'tile') else 'a whole number'}, not {e[f]!r}"
                for f in wrong))
        if e["kernel"] in seen:
            raise GCompileError(f"{where}: kernel {e['kernel']!r} is listed twice")
        seen.add(e["kernel"])
    return {**record, "source": where}


def record_tiles(record: dict, simplified: str, precision: str) -> dict:
    """{kernel name: (tile name, split, the record's source)} of a record, after checking it was made for this
    program."""
    where = record.get("source", "tuning record")
    if record.get("precision", precision) != precision:
        raise GCompileError(f"{where}: the tuning record was made with precision {record['precision']!r}, this "
                            f"build is {precision!r}: tune again with --precision {precision}")
    if record["program"] != program_digest(simplified, precision):
        raise GCompileError(f"{where}: the tuning record (program {record.get('name', '?')!r}) was made for another "
                            "graph or other shapes than this program's: tune this program (gcompile tune)")
    return {e["kernel"]: (e["tile"], e["split"], where) for e in record["kernels"]}


def check_applied(record: dict, kernels: dict) -> None:
    """Every GEMM a record names is a GEMM of the lowered program, of the recorded shape."""
    gemms = {kernel_key(k.name): k.values for ks in kernels.values() for k in ks if k.kind == "matmul"}
    for e in record["kernels"]:
        v = gemms.get(e["kernel"])
        if v is None or (v["m"], v["n"], v["k"]) != (e["m"], e["n"], e["k"]):
            raise GCompileError(f"{record.get('source', 'tuning record')}: the tuning record names GEMM kernel "
                                f"{e['kernel']} ({e['m']}x{e['n']}x{e['k']}), which this program does not have: "
                                "tune this program again")


def gemm_sites(compiled, step: str = "train") -> list[dict]:
    """A step's GEMM kernels (the training step's by default): name, shape, transposes, batch, whether A is
    read in place."""
    out = []
    for kernel in compiled.kernels.get(step, []):
        if kernel.kind != "matmul":
            continue
        v = kernel.values
        out.append({"kernel": kernel_key(kernel.name), "name": kernel.name, "m": v["m"], "n": v["n"],
                    "k": v["k"], "batch": v["batch"], "trans_a": bool(v["trans_a"]), "trans_b": bool(v["trans_b"]),
                    "rows": bool(v["rows"]), "dtype": DTYPES[v["ctype"]], "tile": v["tile"]})
    return out


SAME_GEMM = ("m", "n", "k", "batch", "trans_a", "trans_b", "rows", "dtype")


def followers(compiled) -> dict[str, list[dict]]:
    """{training step GEMM kernel: the evaluation step's GEMMs of the same shape, transposes and input (its
    x @ W1 is the training step's)}: a tile tuned for the one goes to the others. What matters most is the
    image input read in place: its rows are floats for every reader where one reader's tile takes float rows
    only (GC_X_FLOAT), so the evaluation's copy of a GEMM must not keep a float-rows tile that its tuned
    training twin left."""
    evals = gemm_sites(compiled, "eval")
    return {s["kernel"]: [e for e in evals if all(e[f] == s[f] for f in SAME_GEMM)] for s in gemm_sites(compiled)}


def trainer_step_us(binary: str, data: str, batch: int, epochs: int = 3) -> list[float]:
    """Microseconds a step of the standalone trainer (`binary train --data DIR`), one figure per epoch after
    the first, from its log (`--log`: examples_per_s): its training loop selects each batch from the
    shuffled dataset on the device, which the library's Model.time_steps (one batch already in its input
    buffer) leaves out."""
    import subprocess
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.jsonl"
        run = subprocess.run([binary, "train", "--data", data, "--epochs", str(epochs), "--log", str(log)],
                             capture_output=True, text=True, timeout=600)
        entries = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.exists() else []
    rates = [e["examples_per_s"] for e in entries if "val_acc" in e and e["epoch"] > 1]
    if run.returncode or not rates:
        tail = " / ".join((run.stdout + run.stderr).strip().splitlines()[-3:])
        raise GCompileError(f"tune: {Path(binary).name} train --data {data} gave no epoch times "
                            f"(exit {run.returncode}): {tail}")
    return [batch / r * 1e6 for r in rates]


def tune(program, name: str | None = None, precision: str = "fp32", arch: str | None = None, count: int = 8,
         margin: float = 0.005, windows: int = 7, steps: int | None = None, inputs=None, workdir=None,
         data: str | None = None, log=print) -> dict:
    """Tune the GEMM tiles of `program`'s training step on this machine's GPU (cuda target); returns the
    tuning record (module docstring). count: alternatives tried per GEMM; margin: how much faster (relative)
    a replacement must be to be kept; windows: timed windows of `steps` steps (default: about 30 ms each)
    per comparison; inputs: the batch the step is timed on, as train_step takes it (default: random floats
    in [0, 1) and integers 0 and 1 — a real batch is better: the time of some steps depends on the data);
    data: a dataset folder for the program's trainer — then the steps timed are the trainer's
    (trainer_step_us: `windows` runs of 3 epochs a build, interleaved), which read the batch in place from
    the dataset, as users' training does, instead of the library's; workdir: where the candidate builds go
    (default: a temporary folder)."""
    from .build import build, compile_flags, detect_arch, header_commands
    from .gemm_tiles import Tile, alternatives, check_precision, cost, tile_by_name
    from .loader import load
    from .pipeline import compile_program

    check_precision(precision)
    if not detect_arch():
        raise GCompileError("tune: no GPU answers on this machine; tuning times the step on the GPU it is for")
    name = name or getattr(program, "name", None) or "model"
    if not getattr(program, "train_outputs", None):
        raise GCompileError("tune: the program has no training step to time")
    started = time.perf_counter()
    compiler, flags, _ = compile_flags("cuda", arch)
    command = header_commands("cuda", compiler, flags)
    base = compile_program(program, "cuda", name, precision=precision, build_command=command)
    sites = gemm_sites(base)
    twins = followers(base)
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gcompile-tune-"))
    built = {}

    def model_for(tiles: dict):
        key = json.dumps(sorted(tiles.items()))
        if key not in built:
            cs = compile_program(program, "cuda", name, precision=precision, build_command=command, tiles=tiles)
            built[key] = load(build(cs, root / f"c{len(built)}", arch))
        return built[key]

    def update_of(model):
        """What one step from the initial values changes in each variable."""
        model.load(str(root / "init.ckpt"))
        model.train_step(*feeds)
        return {v: model.get(v).astype(np.float64) - start[v] for v in model.variables}

    def timed(models):
        """Median step time (us) of each model, windows interleaved: the library's steps, or with data the
        trainer's."""
        times = [[] for _ in models]
        if data is not None:
            for _ in range(windows):
                for i, m in enumerate(models):
                    times[i] += trainer_step_us(m.manifest["artifact"]["binary"], str(data), m.manifest["batch_size"])
            return [statistics.median(t) for t in times]
        for m in models:
            m.time_steps(n)
        for _ in range(windows):
            for i, m in enumerate(models):
                times[i].append(m.time_steps(n) / n * 1e6)
        return [statistics.median(t) for t in times]

    best_tiles = {}
    best = model_for(best_tiles)
    best.save(str(root / "init.ckpt"))
    start = {v: best.get(v).astype(np.float64) for v in best.variables}
    feeds = list(inputs) if inputs is not None else sample_inputs(best.manifest["train_inputs"])
    # fp32 tiles change the order of sums only: a candidate's update agrees with the default build's to 1e-4.
    # tf32 tiles also round operands, each kind its own way (register-staged: to nearest; pipelined mma.sync
    # and wgmma: truncated, 2^-10), and the rounding composes along the step (dW1 depends on every GEMM before
    # it): two valid tf32 builds of the MLP at batch 1000 differ by 4.3e-3 in W1's update, each within 3.5e-3
    # of the fp32 build's (H100).
    # So tf32 candidates are held to the fp32 build's update at TF32_STEP_AGREE instead.
    if precision == "tf32":
        with load(build(compile_program(program, "cuda", name, precision="fp32", build_command=command),
                        root / "fp32", arch)) as fp32:
            reference, agree = update_of(fp32), TF32_STEP_AGREE
        off = disagreeing(update_of(best), reference, agree)
        if off:
            raise GCompileError(f"tune: the default tf32 build updates {', '.join(off)} otherwise than the fp32 "
                                f"build does (beyond {agree:g} norm-wise): a GEMM tile is wrong")
    else:
        reference, agree = update_of(best), FP32_AGREE
    probe = best.time_steps(50) / 50
    n = steps or max(50, min(5000, int(0.03 / max(probe, 1e-7))))
    best_us = timed([best])[0]
    baseline_us = best_us
    log(f"tune {name} ({precision}): default tiles {baseline_us:.2f} us a step ("
        f"{'the trainer on ' + str(data) if data is not None else 'the library'}); {len(sites)} GEMMs, up to "
        f"{count} alternatives each")
    order = sorted(sites, key=lambda s: -cost(*Tile.parse(s["tile"]), s["m"], s["n"], s["k"], s["batch"]))
    options = {site["kernel"]: alternatives(site["m"], site["n"], site["k"], site["trans_a"], site["trans_b"],
                                            precision, site["batch"], site["dtype"], site["rows"], count)
               for site in sites}
    trials = []

    def retiled(tiles: dict, site: dict, tile, split: int) -> dict:
        """tiles with the site's GEMM (and its evaluation twins) on this tile."""
        return {**tiles, **{s["kernel"]: (tile.name, split) for s in [site, *twins[site["kernel"]]]}}

    def trial(tiles: dict, what: str, label: str, entry: dict) -> None:
        """Time the build with these tiles against the best so far; keep it if faster by the margin."""
        nonlocal best_tiles, best, best_us
        model = model_for(tiles)
        off = disagreeing(update_of(model), reference, agree)
        if off:
            against = "the fp32 build does" if precision == "tf32" else "the default tiles do"
            raise GCompileError(f"tune: {what} updates {', '.join(off)} otherwise than {against} (beyond "
                                f"{agree:g} norm-wise): a GEMM tile is wrong")
        best_us, us = timed([best, model])
        kept = us < best_us * (1 - margin)
        trials.append({**entry, "us": round(us, 3), "best_us": round(best_us, 3), "kept": kept})
        log(f"  {label:<57}: {us:7.2f} us (best {best_us:7.2f})" + ("  kept" if kept else ""))
        if kept:
            best_tiles, best, best_us = tiles, model, us

    # The GEMMs that read the image input in place read it in one format: floats wherever one of them has
    # a float-rows-only tile (GC_X_FLOAT), else its bytes, which fp32's tf32-parts tiles take exactly (two
    # mma a product instead of three). One such GEMM retiled alone still gets floats from the others, so
    # first each tf32-parts tile goes to all of them at once (each at its split nearest a block an SM).
    readers = [site for site in order if site["rows"]]
    for tile in {t: None for site in readers for t, _ in options[site["kernel"]] if t.tf32 == 3}:
        splits = [next((s for t, s in options[site["kernel"]] if t == tile), None) for site in readers]
        if None in splits:
            continue
        tiles = dict(best_tiles)
        for site, split in zip(readers, splits):
            tiles = retiled(tiles, site, tile, split)
        trial(tiles, f"the image input's GEMMs ({', '.join(s['kernel'] for s in readers)}) on tile {tile.name}",
              f"{'+'.join(s['name'] for s in readers)[:27]:<28} {tile.name:<28} (together)",
              {"kernel": "+".join(s["kernel"] for s in readers), "tile": tile.name, "splits": splits})
    for site in order:
        for tile, split in options[site["kernel"]]:
            now = best_tiles.get(site["kernel"])   # the site's tile in the best build so far
            text = tile_by_name(now[0]).c_type(now[1], site["m"], site["n"], site["k"]) if now else site["tile"]
            if tile.c_type(split, site["m"], site["n"], site["k"]) == text:
                continue
            trial(retiled(best_tiles, site, tile, split),
                  f"kernel {site['kernel']} on tile {tile.name} split {split}",
                  f"{site['name']:<28} {tile.name:<28} split {split}",
                  {"kernel": site["kernel"], "tile": tile.name, "split": split})
    tuned_us, baseline_us = timed([best, model_for({})])
    kernels = []
    for site in sites + [twin for site in sites for twin in twins[site["kernel"]]]:
        if site["kernel"] in best_tiles:
            tile, split = best_tiles[site["kernel"]]
            kernels.append({k: site[k] for k in ("kernel", "name", "m", "n", "k", "batch")} |
                           {"tile": tile, "split": split, "default": site["tile"]})
    for model in built.values():
        model.close()
    record = {"format": FORMAT, "program": program_digest(base.stages["simplify"], precision), "name": name,
              "precision": precision, "gpu": gpu_name(), "timing": "trainer" if data is not None else "library",
              "kernels": kernels, "baseline_us": round(baseline_us, 3),
              "tuned_us": round(tuned_us, 3), "trials": trials, "seconds": round(time.perf_counter() - started, 1)}
    retiled_sites = sum(site["kernel"] in best_tiles for site in sites)
    log(f"tune {name}: {baseline_us:.2f} -> {tuned_us:.2f} us a step, {retiled_sites} of {len(sites)} GEMMs "
        f"retiled, {len(trials)} builds timed in {record['seconds']:.0f} s")
    return record


def write_record(record: dict, path) -> None:
    """The record as JSON at path, whole or not at all: an earlier record there is not left half-written."""
    path = Path(path)
    make_folder(path.parent, "tuning record's")
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, path)


def sample_inputs(specs) -> list[np.ndarray]:
    """A batch for train_step (manifest["train_inputs"]): floats in [0, 1), integers 0 and 1 (valid class
    labels, indices)."""
    rng = np.random.RandomState(0)
    return [rng.rand(*s["shape"]).astype(s["dtype"]) if np.dtype(s["dtype"]).kind == "f"
            else rng.randint(0, 2, s["shape"]).astype(s["dtype"]) for s in specs]


def gpu_name() -> str | None:
    """The GPU's name (nvidia-smi), for the record: of the first device CUDA_VISIBLE_DEVICES lets the
    program see (an index or a UUID, as nvidia-smi -i takes them), else of device 0."""
    import shutil
    import subprocess
    if shutil.which("nvidia-smi") is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", visible or "0"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0].strip() if out else None
