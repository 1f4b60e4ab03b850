"""Bar chart of a bench results JSON: per-step time of every implementation, grouped by model and batch,
log scale, p10-p90 as error bars. Needs only json and matplotlib (the optional extra `bench`), so it runs
anywhere:

    python3 bench/plot.py bench/results/<gpu>-<commit>.json [-o chart.png]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def plot(results: dict, path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if r["section"] in ("mnist", "conv") and r.get("step_s")]
    groups = list(dict.fromkeys(f"{r['model']}\nbatch {r['batch']}" for r in rows))
    series = list(dict.fromkeys((r["impl"], r.get("precision") or "") for r in rows))
    fig, ax = plt.subplots(figsize=(max(8.0, 1.5 * len(groups)), 5.5))
    width = 0.85 / max(1, len(series))
    for j, (impl, precision) in enumerate(series):
        xs, heights, low, high = [], [], [], []
        for r in rows:
            if (r["impl"], r.get("precision") or "") != (impl, precision):
                continue
            us = r["step_s"] * 1e6
            xs.append(groups.index(f"{r['model']}\nbatch {r['batch']}") + (j - (len(series) - 1) / 2) * width)
            heights.append(us)
            low.append(us - r.get("p10_s", r["step_s"]) * 1e6)
            high.append(r.get("p90_s", r["step_s"]) * 1e6 - us)
        ax.bar(xs, heights, width, yerr=[low, high], capsize=2, label=f"{impl} {precision}".strip(),
               color="black" if impl == "gcompile" and precision == "fp32" else None)
    ax.set_yscale("log")
    ax.set_ylabel("time per training step (us, log scale)")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.legend(fontsize=7, ncol=3)
    meta = results["meta"]
    ax.set_title(f"gcompile vs PyTorch and JAX: {meta['gpu']}, commit {meta['commit']}, {meta['date'][:10]}",
                 fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="bar chart of a bench results JSON")
    p.add_argument("results")
    p.add_argument("-o", "--out", default=None, help="PNG path (default: the JSON's path with .png)")
    args = p.parse_args(argv)
    results = json.loads(Path(args.results).read_text())
    print(plot(results, args.out or Path(args.results).with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
