"""What a phase of a training step cannot go below on this GPU: bench/floors.cu, built with nvcc and run.

    python3 -m bench.floors          # the table; --json FILE writes the result

Two measurements (each explained in floors.cu's header): `boundary` — what a phase boundary costs as a
kernel boundary in a CUDA graph (plain or programmatic launch) and as a grid-wide barrier inside one
persistent kernel, with 0, 16 or 64 KB pulled a block a phase; `pull` — how fast every block of a grid pulls
its own L2-resident bytes by 16-byte loads into registers, cp.async, TMA bulk copies of 16 KB, and TMA bulk
copies of 256 or 128 bytes (one gathered row a copy), at the grids and bytes a block of the MLP's batch-1000
tf32 step's two large GEMMs (x @ W1, dW1) have; `operands` — x @ W1's K steps pulled as its kernel pulls them
(B by one TMA tensor copy a step, A's gathered rows by cp.async, as floats or as uint8 bytes), each alone and
together. docs/compiler.md reads the step's timeline against them.
`run()` is what `make bench` calls (the `floors` section); needs a GPU of compute capability 9.0 and nvcc.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gcompile.build import gencode_flags  # noqa: E402

SOURCE = Path(__file__).resolve().parent / "floors.cu"


def build(workdir: Path) -> Path:
    """floors.cu as an executable in workdir: sm_90a machine code and compute_90 PTX (its kernels use
    programmatic launch and TMA bulk copies, Hopper's)."""
    exe = workdir / "floors"
    cmd = ["nvcc", "-O3", "-std=c++17", *gencode_flags("sm_90,compute_90"), str(SOURCE), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-4000:]}")
    return exe


def parse(stdout: str) -> dict:
    """floors' JSON lines as {"gpu", "sms", "rows"}; an error line (a CUDA call that failed, a GPU without
    sm_90's instructions) or no GPU line raises, naming it."""
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    errors = [r["error"] for r in lines if "error" in r]
    if errors:
        raise RuntimeError(f"bench/floors.cu: {errors[0]}")
    if not lines or "gpu" not in lines[0]:
        raise RuntimeError(f"bench/floors.cu printed no GPU line: {stdout[:400]!r}")
    return {"gpu": lines[0]["gpu"], "sms": lines[0]["sms"], "rows": lines[1:]}


def run(workdir: str | None = None) -> dict:
    """Build and run floors.cu on the present GPU (a few seconds); parse()'s result."""
    with tempfile.TemporaryDirectory(prefix="floors_") as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        exe = build(work)
        proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    result = parse(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"bench/floors.cu exited with {proc.returncode}: {proc.stderr[-2000:]}")
    return result


def table_rows(result: dict) -> list[dict]:
    """run()'s result as rows of bench/report.py's table (section "floors"): the step column holds a phase's
    time (boundary) or the pull's time beyond an empty launch (pull, operands: a launch's K steps)."""
    from .report import row, skipped
    rows = []
    for r in result["rows"]:
        if r["kind"] == "boundary":
            model = f"phase boundary {r['blocks']}x{r['threads']}, {r['kb']} KB a block"
            note = "a phase: kernel boundary in one graph" if r["form"] != "persistent" else \
                "a phase: grid-wide barrier in one kernel"
        else:
            rate = (f"{r['tb_per_s']:.2f} TB/s ({r['bytes'] / 1e6:.1f} MB) beyond an empty launch "
                    f"({r['empty_us']:.2f} us)") if "us" in r else ""
            if r["kind"] == "operands":
                model = f"x @ W1 operands {r['blocks']}x{r['threads']}, {r.get('steps', '?')} K steps"
                note = f"{r['ns_per_step']:.0f} ns a K step, {rate}" if "us" in r else ""
            else:
                model = f"L2 pull {r['blocks']}x{r['threads']}, {r['kb']} KB a block"
                note = rate
        if "skipped" in r:
            rows.append(skipped("floors", model, None, r["form"], r["skipped"]))
        else:
            rows.append(row("floors", model, None, r["form"], step_s=r["us"] * 1e-6, note=note))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.floors", description=__doc__.strip().splitlines()[0])
    p.add_argument("--json", help="write the result here")
    p.add_argument("--workdir", help="build here (kept) instead of a temporary folder")
    args = p.parse_args(argv)
    from .report import format_table
    result = run(args.workdir)
    print(f"{result['gpu']} ({result['sms']} SMs)")
    print(format_table(table_rows(result)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
