"""GEMM micro-benchmark: gcompile's gc_gemm (runtime/gc_gemm_cuda.cuh, tiles from gcompile/gemm_tiles.py)
against cuBLAS at every GEMM of the MLP's training step (784-256-100-10, batch 128 and 1000, forward and
backward with their transposes) and at 4096^3. Needs a GPU, nvcc and cuBLAS (the CUDA toolkit's, or the
nvidia-cublas Python package's).

    python3 bench/gemm_bench.py              # table; --json FILE writes the results
    python3 bench/gemm_bench.py --sweep --json S.json --calibrate gcompile/gemm_tiles_sm90.json
        # also every catalogue tile and split at the MLP's and more shapes, and the tile calibration from it
    python3 bench/gemm_bench.py --from S.json --calibrate OUT   # the calibration from saved results

`run(quick=False) -> dict` is what `make bench` calls. Per case: the own kernel (fp32 and tf32, without and
with the fused epilogue the step uses: bias + ReLU forward, the ReLU mask on the backward data gradients)
and cuBLAS (default math and pedantic fp32; tf32 tensor-op math for the tf32 path), each the median of
trials of 20 launches replayed in a CUDA graph; TFLOP/s = 2 M N K / time. Targets (performance.md):
own fp32 >= 85% of cuBLAS at 4096^3; own fp32 with its epilogue >= 1.0x cuBLAS without, at the MLP's shapes.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import git_commit  # noqa: E402
from gcompile import gemm_tiles  # noqa: E402
from gcompile.build import detect_arch, gencode_flags  # noqa: E402
from gcompile.gemm_tiles import candidates, choose_tile  # noqa: E402
from gcompile.resources import package_dir  # noqa: E402

EPILOGUES = {"bias_relu": "ep_bias_relu{aux}", "bias": "ep_bias{aux}", "relu_mask": "ep_relu_mask{aux, %(n)d}",
             "none": "gc_ep_store{}"}


def mlp_gemms(batch: int) -> list[tuple]:
    """(name, m, n, k, trans_a, trans_b, epilogue) of the MLP's training step, in step order."""
    b = batch
    return [
        (f"b{b} fwd  h1 = x @ W1", b, 256, 784, 0, 0, "bias_relu"),
        (f"b{b} fwd  h2 = h1 @ W2", b, 100, 256, 0, 0, "bias_relu"),
        (f"b{b} fwd  logits = h2 @ W3", b, 10, 100, 0, 0, "bias"),
        (f"b{b} bwd  dW3 = h2^T g3", 100, 10, b, 1, 0, "none"),
        (f"b{b} bwd  dh2 = g3 W3^T", b, 100, 10, 0, 1, "relu_mask"),
        (f"b{b} bwd  dW2 = h1^T g2", 256, 100, b, 1, 0, "none"),
        (f"b{b} bwd  dh1 = g2 W2^T", b, 256, 100, 0, 1, "relu_mask"),
        (f"b{b} bwd  dW1 = x^T g1", 784, 256, b, 1, 0, "none"),
    ]


# More shapes for --sweep only: the heuristic is calibrated on these too, not on the MLP alone.
SWEEP_SHAPES = [("512^3", 512, 512, 512, 0, 0), ("2048^3", 2048, 2048, 2048, 0, 0),
                ("64x1024x4096 TB", 64, 1024, 4096, 0, 1), ("4096x64x1024 TA", 4096, 64, 1024, 1, 0),
                ("1024x1024x64", 1024, 1024, 64, 0, 0), ("333x777x555 TA TB", 333, 777, 555, 1, 1)]
SWEEP_NAMES = {s[0] for s in SWEEP_SHAPES}


def bench_cases(quick: bool = False, sweep: bool = False, tiles: list[str] | None = None,
                precisions: tuple = ("fp32", "tf32")) -> list[dict]:
    """The cases to time; with `tiles` (catalogue tile names) the sweep's candidates are those tiles only, at
    the MLP's shapes only (a partial sweep, for calibrate's merge)."""
    shapes = mlp_gemms(1000) if quick else mlp_gemms(128) + mlp_gemms(1000)
    if not tiles:
        shapes = shapes + [("4096^3", 4096, 4096, 4096, 0, 0, "none")]
    if sweep and not tiles:
        shapes += [(*shape, "none") for shape in SWEEP_SHAPES]
    out = []
    for name, m, n, k, ta, tb, ep in shapes:
        for precision in precisions:
            tile = choose_tile(m, n, k, ta, tb, precision)
            for epilogue in dict.fromkeys(["none", ep]):
                out.append(dict(name=name, m=m, n=n, k=k, ta=ta, tb=tb, precision=precision, epilogue=epilogue,
                                tile=tile, chosen=True))
            if sweep:   # every other candidate tile, for calibration, as the step runs it (with its epilogue)
                for _, t, split in candidates(m, n, k, precision):
                    text = t.c_type(split, m, n, k)
                    if text != tile and (not tiles or t.name in tiles) and t.fits(bool(ta), bool(tb)):
                        out.append(dict(name=name, m=m, n=n, k=k, ta=ta, tb=tb, precision=precision,
                                        epilogue=ep, tile=text, chosen=False))
    return out


def find_cublas() -> tuple[list[str], list[str]]:
    """(include flags, link flags) for cuBLAS: the CUDA toolkit's, else the nvidia-cublas wheel's."""
    nvcc = shutil.which("nvcc")
    if nvcc:
        home = Path(nvcc).resolve().parent.parent
        for lib in (home / "lib64", home / "targets" / "x86_64-linux" / "lib"):
            if list(lib.glob("libcublas.so*")) and (home / "include" / "cublas_v2.h").exists():
                return [], ["-lcublas"]
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}
    for root in sorted(r for r in roots if r and os.path.isdir(r)):
        for header in glob.glob(os.path.join(root, "nvidia", "**", "cublas_v2.h"), recursive=True):
            base = Path(header).parent.parent
            libs = sorted(glob.glob(str(base / "lib" / "libcublas.so*")))
            if libs:
                lib = Path(libs[0])
                return ["-I", str(base / "include")], [f"-L{lib.parent}", f"-l:{lib.name}",
                                                       f"-Xlinker=-rpath,{lib.parent}"]
    raise RuntimeError("cuBLAS not found: neither the CUDA toolkit next to nvcc nor the nvidia-cublas package has it")


def case_source(cases: list[dict], first: int) -> str:
    """A translation unit with one function per case: the gc_gemm call the generated program would make."""
    lines = ['#include "gemm_bench.h"']
    for i, c in enumerate(cases, first):
        ta, tb = ("true" if c[key] else "false" for key in ("ta", "tb"))
        ep = EPILOGUES[c["epilogue"]] % {"n": c["n"]}
        lines.append(f"int gc_bench_{i}(const float* A, const float* B, float* C, const float* aux) {{\n"
                     f"    (void)aux;\n"
                     f"    return gc_gemm<float, {ta}, {tb}, {c['tile']}>(A, B, C, {c['m']}, {c['n']}, {c['k']}, {ep});\n}}")
    return "\n".join(lines) + "\n"


def table_source(cases: list[dict], trials: int) -> str:
    lines = [f"#define GC_BENCH_TRIALS {trials}"]
    lines += [f"int gc_bench_{i}(const float* A, const float* B, float* C, const float* aux);" for i in range(len(cases))]
    lines.append("static const gc_bench_case GC_BENCH_CASES[] = {")
    for i, c in enumerate(cases):
        lines.append(f'    {{"{c["name"]}", {c["m"]}, {c["n"]}, {c["k"]}, {c["ta"]}, {c["tb"]}, "{c["precision"]}", '
                     f'"{c["epilogue"]}", "{c["tile"]}", gc_bench_{i}}},')
    lines.append("};")
    return "\n".join(lines) + "\n"


def build(cases: list[dict], workdir: Path, trials: int, arch: str | None = None) -> Path:
    """Compile the case functions (in parallel, a few per unit) and the driver; link with cuBLAS."""
    gencode = gencode_flags(arch or detect_arch() or "sm_90")   # sm_90: sm_90a machine code (wgmma tiles)
    include, link = find_cublas()
    flags = ["-O3", "-std=c++17", *gencode, "--default-stream", "per-thread",
             "-I", str(package_dir("runtime")), "-I", str(Path(__file__).resolve().parent), "-I", str(workdir),
             *include]
    (workdir / "gemm_cases.h").write_text(table_source(cases, trials))
    units = max(1, min(os.cpu_count() or 1, 32))
    per = -(-len(cases) // units)
    commands, objects = [], []
    for u, first in enumerate(range(0, len(cases), per)):
        src = workdir / f"cases{u}.cu"
        src.write_text(case_source(cases[first:first + per], first))
        objects.append(workdir / f"cases{u}.o")
        commands.append(["nvcc", *flags, "-c", str(src), "-o", str(objects[-1])])
    objects.append(workdir / "driver.o")
    commands.append(["nvcc", *flags, "-c", str(Path(__file__).resolve().parent / "gemm_bench.cu"), "-o",
                     str(objects[-1])])
    with ThreadPoolExecutor(units + 1) as pool:
        results = list(pool.map(lambda cmd: subprocess.run(cmd, capture_output=True, text=True), commands))
    for cmd, r in zip(commands, results):
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}\n{r.stderr[-4000:]}")
    exe = workdir / "gemm_bench"
    r = subprocess.run(["nvcc", *gencode, *map(str, objects), "-o", str(exe), *link],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"linking the GEMM benchmark failed:\n{r.stderr[-4000:]}")
    return exe


def tflops(c: dict, key: str) -> float | None:
    us = c.get(f"{key}_us")
    return 2 * c["m"] * c["n"] * c["k"] / us / 1e6 if us else None


def summarize(rows: list[dict]) -> dict:
    """The targets' ratios: cuBLAS time / own time (> 1: own is faster)."""
    chosen = [r for r in rows if r["chosen"] and r["name"] not in SWEEP_NAMES]
    big = next(r for r in chosen if r["name"] == "4096^3" and r["precision"] == "fp32")
    big_tf32 = next(r for r in chosen if r["name"] == "4096^3" and r["precision"] == "tf32")
    fused = [r for r in chosen if r["name"] != "4096^3" and r["precision"] == "fp32" and r["epilogue"] != "none"]
    plain = [r for r in chosen if r["name"] != "4096^3" and r["precision"] == "fp32" and r["epilogue"] == "none"]
    tf32 = [r for r in chosen if r["name"] != "4096^3" and r["precision"] == "tf32" and r["epilogue"] == "none"]
    mlp_sum = lambda rs, key: sum(r[f"{key}_us"] for r in rs)  # noqa: E731
    out = {
        "fp32_4096_vs_cublas": big["cublas_us"] / big["own_us"],
        "fp32_4096_tflops": tflops(big, "own"), "cublas_4096_tflops": tflops(big, "cublas"),
        "tf32_4096_vs_cublas_tf32": big_tf32["cublas_tf32_us"] / big_tf32["own_us"],
        "tf32_4096_tflops": tflops(big_tf32, "own"), "cublas_tf32_4096_tflops": tflops(big_tf32, "cublas_tf32"),
        "fused_vs_cublas_min": min(r["cublas_us"] / r["own_us"] for r in fused),
        "fused_vs_cublas_each": {r["name"]: r["cublas_us"] / r["own_us"] for r in fused},
        "mlp_gemms_us": {b: {"own_fp32": mlp_sum([r for r in plain if r["name"].startswith(f"b{b} ")], "own"),
                              "cublas_fp32": mlp_sum([r for r in plain if r["name"].startswith(f"b{b} ")], "cublas"),
                              "own_tf32": mlp_sum([r for r in tf32 if r["name"].startswith(f"b{b} ")], "own"),
                              "cublas_tf32": mlp_sum([r for r in tf32 if r["name"].startswith(f"b{b} ")],
                                                     "cublas_tf32")}
                         for b in sorted({int(r["name"].split()[0][1:]) for r in plain})},
        "max_rel_err": {p: max(r["rel_err"] for r in rows if r["precision"] == p) for p in ("fp32", "tf32")},
    }
    out["targets_met"] = {"fp32_4096_at_least_85pct": out["fp32_4096_vs_cublas"] >= 0.85,
                          "fused_at_least_1x": out["fused_vs_cublas_min"] >= 1.0}
    return out


def sweep_summary(rows: list[dict]) -> list[dict]:
    """Per shape and precision: the fastest tile measured (with the step's epilogue), and the heuristic's
    choice against it."""
    out = []
    keys = dict.fromkeys((r["name"], r["precision"]) for r in rows)
    for name, precision in keys:
        group = [r for r in rows if r["name"] == name and r["precision"] == precision]
        if any(r["epilogue"] != "none" for r in group):
            group = [r for r in group if r["epilogue"] != "none"]
        best = min(group, key=lambda r: r["own_us"])
        chosen = next(r for r in group if r["chosen"])
        out.append({"name": name, "precision": precision, "best_tile": best["tile"], "best_us": best["own_us"],
                    "chosen_tile": chosen["tile"], "chosen_us": chosen["own_us"],
                    "all": sorted([(r["tile"], round(r["own_us"], 3)) for r in group], key=lambda t: t[1])})
    return out


def run(quick: bool = False, sweep: bool = False, workdir: str | None = None, tiles: list[str] | None = None,
        precisions: tuple = ("fp32", "tf32")) -> dict:
    """Build and run the benchmark on the present GPU; returns the rows, the summary and the machine."""
    cases = bench_cases(quick, sweep, tiles, precisions)
    with tempfile.TemporaryDirectory(prefix="gemm_bench_") as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        exe = build(cases, work, trials=5 if quick else 9)
        with open(work / "raw.jsonl", "w") as raw:   # line by line as cases finish (kept with --workdir)
            # GC_NO_PDL: back-to-back launches of one GEMM must not overlap their launches (cuBLAS's do not)
            proc = subprocess.run([str(exe)], stdout=raw, stderr=subprocess.PIPE, text=True, timeout=1800,
                                  env=dict(os.environ, GC_NO_PDL="1"))
        stdout = (work / "raw.jsonl").read_text()
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or len(lines) != len(cases) + 1 or any("error" in r for r in lines):
        errors = [r for r in lines if "error" in r][:5]
        raise RuntimeError(f"the GEMM benchmark failed (exit {proc.returncode}, {len(lines) - 1} of {len(cases)} "
                           f"cases ran): {errors}\n{proc.stderr[-4000:]}")
    machine, rows = lines[0], lines[1:]
    for row, case in zip(rows, cases):
        row["chosen"] = case["chosen"]
    result = {"gpu": machine["gpu"], "sms": machine["sms"], "commit": git_commit(ROOT), "rows": rows,
              "summary": summarize(rows) if not tiles and len(precisions) == 2 else {}}
    if sweep:
        result["sweep"] = sweep_summary(rows)
    return result


def calibrate(result: dict, base: dict | None = None) -> dict:
    """gemm_tiles_sm90.json from a --sweep result: the fastest catalogue tile measured for each swept
    (shape, precision) with the epilogue the step fuses into it (every candidate was timed so), and the cost
    model's constants fitted to those timings by non-negative least squares on relative error (see
    gcompile/gemm_tiles.py). base: a calibration to merge a partial sweep (--tiles) into: its fastest tiles
    of the (shape, precision) pairs swept are replaced by this run's (which timed the old choice too), the
    rest and its model's constants kept; tiles it has no constants for get theirs fitted, the shared
    constants held."""
    import numpy as np
    fused = {(r["name"], r["precision"]) for r in result["rows"] if r["epilogue"] != "none"}
    rows = []
    for r in result["rows"]:
        if (r["epilogue"] != "none") != ((r["name"], r["precision"]) in fused) or "own_us" not in r:
            continue
        tile, split = gemm_tiles.Tile.parse(r["tile"])
        if tile in gemm_tiles.TILES[r["precision"]]:
            rows.append((r, tile, split))
    if base is not None:
        return merge(base, rows, result)
    names = [t.name for ts in gemm_tiles.TILES.values() for t in ts]
    X, y = [], []
    for r, tile, split in rows:
        f = gemm_tiles.features(tile, split, r["m"], r["n"], r["k"])
        x = np.zeros(2 * len(names) + 4)
        x[names.index(tile.name)] = f["latency_steps"]
        x[len(names) + names.index(tile.name)] = f["throughput_steps"]
        x[-4:] = [1, f["per_sm"], f["split"], f["split_size"]]
        X.append(x / r["own_us"])
        y.append(1.0)
    coef = [round(float(c), 4) for c in nonneg_fit(np.array(X), np.array(y))]
    model = {"f0": coef[-4], "per_block": coef[-3], "split0": coef[-2], "split1": coef[-1],
             "tiles": {name: [coef[i], coef[len(names) + i]] for i, name in enumerate(names)}}
    return {"gpu": result["gpu"], "commit": result["commit"], "source": "bench/gemm_bench.py --sweep",
            "model": model, "measured": list(fastest(rows).values())}


def nonneg_fit(X, y):
    """The non-negative least-squares solution of X c = y (scipy's nnls; without scipy, plain least squares
    with negative constants clipped)."""
    import numpy as np
    try:
        from scipy.optimize import nnls
        return nnls(X, y, maxiter=20000)[0]
    except ImportError:
        return np.clip(np.linalg.lstsq(X, y, rcond=None)[0], 0, None)


def fastest(rows) -> dict:
    """(m, n, k, ta, tb, precision) -> the calibration entry of the fastest of rows [(row, tile, split)]."""
    best = {}
    for r, tile, split in rows:
        key = (r["m"], r["n"], r["k"], r["ta"], r["tb"], r["precision"])
        if key not in best or r["own_us"] < best[key]["us"]:
            best[key] = {"m": r["m"], "n": r["n"], "k": r["k"], "trans_a": bool(r["ta"]), "trans_b": bool(r["tb"]),
                         "precision": r["precision"], "batch": 1, "tile": tile.name, "split": split,
                         "us": round(r["own_us"], 3), "name": r["name"]}
    return best


def merge(base: dict, rows, result: dict) -> dict:
    """calibrate's merge of a partial sweep into base (see there)."""
    import numpy as np
    model = json.loads(json.dumps(base["model"]))
    shared = lambda f: (model["f0"] + model["per_block"] * f["per_sm"] + model["split0"] * f["split"]  # noqa: E731
                        + model["split1"] * f["split_size"])
    for name in dict.fromkeys(t.name for ts in gemm_tiles.TILES.values() for t in ts):
        if name in model["tiles"]:
            continue
        own = [(r, split) for r, tile, split in rows if tile.name == name]
        fs = [(gemm_tiles.features(gemm_tiles.tile_by_name(name), split, r["m"], r["n"], r["k"]), r["own_us"])
              for r, split in own]
        if not fs:
            raise ValueError(f"calibrate: catalogue tile {name} has no constants and was not timed")
        X = np.array([[f["latency_steps"] / us, f["throughput_steps"] / us] for f, us in fs])
        y = np.array([max(us - shared(f), 0.0) / us for f, us in fs])
        model["tiles"][name] = [round(float(c), 4) for c in nonneg_fit(X, y)]
    best = fastest(rows)
    measured = []
    for e in base["measured"]:
        key = (e["m"], e["n"], e["k"], int(e["trans_a"]), int(e["trans_b"]), e["precision"])
        measured.append(best.pop(key, e))
    measured += best.values()
    return {"gpu": base["gpu"], "commit": f"{base['commit']}; merged: {result['commit']} on {result['gpu']}",
            "source": base["source"] + " + --sweep --tiles", "model": model, "measured": measured}


def table(result: dict) -> str:
    head = (f"{'GEMM':<28} {'M x N x K':>16} {'prec':>4} {'epilogue':>9}  {'own us':>8} {'TFLOP/s':>7}  "
            f"{'cuBLAS us':>9} {'TFLOP/s':>7} {'ratio':>6}  {'pedantic':>8}  {'rel err':>8}  tile")
    lines = [f"GEMM micro-benchmark on {result['gpu']} ({result['sms']} SMs), commit {result['commit']}", head]
    for r in result["rows"]:
        if not r["chosen"] or r["name"] in SWEEP_NAMES:
            continue
        ref = "cublas" if r["precision"] == "fp32" else "cublas_tf32"
        ratio = r[f"{ref}_us"] / r["own_us"]
        pedantic = f"{r['cublas_pedantic_us']:8.2f}" if "cublas_pedantic_us" in r else " " * 8
        lines.append(f"{r['name']:<28} {r['m']:>5}x{r['n']:>4}x{r['k']:>5} {r['precision']:>4} {r['epilogue']:>9}  "
                     f"{r['own_us']:8.2f} {tflops(r, 'own'):7.2f}  {r[f'{ref}_us']:9.2f} {tflops(r, ref):7.2f} "
                     f"{ratio:6.2f}  {pedantic}  {r['rel_err']:8.1e}  {r['tile']}")
    s = result["summary"]
    if s:   # (a partial sweep, --tiles or --precision, has none)
        lines.append(f"4096^3 fp32: own {s['fp32_4096_tflops']:.1f} TFLOP/s, cuBLAS {s['cublas_4096_tflops']:.1f} "
                     f"({s['fp32_4096_vs_cublas']:.0%} of cuBLAS; target >= 85%)")
        lines.append(f"4096^3 tf32: own {s['tf32_4096_tflops']:.1f} TFLOP/s, cuBLAS tf32 {s['cublas_tf32_4096_tflops']:.1f} "
                     f"({s['tf32_4096_vs_cublas_tf32']:.0%})")
        lines.append(f"MLP shapes, own fp32 with fused epilogue vs cuBLAS fp32 without: worst {s['fused_vs_cublas_min']:.2f}x "
                     f"(target >= 1.0x)")
        for b, t in s["mlp_gemms_us"].items():
            lines.append(f"MLP batch {b}, sum of the step's 8 GEMMs: own fp32 {t['own_fp32']:.1f} us vs cuBLAS "
                         f"{t['cublas_fp32']:.1f} us; own tf32 {t['own_tf32']:.1f} us vs cuBLAS tf32 {t['cublas_tf32']:.1f} us")
    for sw in result.get("sweep", []):
        lines.append(f"sweep {sw['name']:<28} {sw['precision']}: chosen {sw['chosen_us']:7.2f} us {sw['chosen_tile']}; "
                     f"best {sw['best_us']:7.2f} us {sw['best_tile']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 1000 and 4096^3 only, fewer trials")
    parser.add_argument("--sweep", action="store_true", help="also time every catalogue tile at the MLP's shapes")
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument("--workdir", default=None, help="keep the generated sources and binary here")
    parser.add_argument("--calibrate", metavar="OUT", default=None,
                        help="with --sweep (or --from): write the tile calibration (gcompile/gemm_tiles_sm90.json)")
    parser.add_argument("--from", dest="source", metavar="JSON", default=None,
                        help="use the results in this file (from --json) instead of running")
    parser.add_argument("--tiles", default=None, help="with --sweep: only these catalogue tiles (names, comma-"
                        "separated), at the MLP's shapes; --calibrate then merges into the present calibration")
    parser.add_argument("--precision", choices=("fp32", "tf32"), default=None, help="only this precision")
    args = parser.parse_args(argv)
    tiles = args.tiles.split(",") if args.tiles else None
    for name in tiles or []:
        gemm_tiles.tile_by_name(name)   # (raises for a name not in the catalogue)
    precisions = (args.precision,) if args.precision else ("fp32", "tf32")
    result = (json.loads(Path(args.source).read_text()) if args.source
              else run(args.quick, args.sweep, args.workdir, tiles, precisions))
    if args.calibrate:
        base = json.loads(gemm_tiles.CALIBRATION.read_text()) if tiles else None
        Path(args.calibrate).write_text(json.dumps(calibrate(result, base), indent=1) + "\n")
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
