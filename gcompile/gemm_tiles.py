"""gemm_tiles: the tile configuration of each GEMM (the `Tile` argument of gc_gemm, runtime/gc_gemm.h).

`choose_tile(m, n, k, trans_a, trans_b, precision, batch)` returns the C text of the tile type,
`gc_tile<BM, BN, BK, TM, TN, TF32, SPLIT, M, N, K>`: the block's tile of C, the per-thread (fp32) or per-warp
(tf32) tile, the K split over a thread-block cluster, and the static shape the kernel is specialized for.

The choice is a small cost model of one H100/H200 (132 SMs), evaluated for every tile of a fixed catalogue
and every split in (1, 2, 4, 8); the cheapest wins. For each candidate it estimates, in SM clock cycles:
  * compute: the work of the busiest SM (its share of blocks x BM x BN x K per split) over the SM's rate,
    scaled by the tile's efficiency (bigger register blocks reach more of the peak) and by how well the
    resident warps hide latency (few warps, lower rate);
  * a floor per K step: a block cannot step faster than a global load's latency, which is what limits
    small tiles with long K (the weight gradients: M x N small, K = the batch);
  * memory: every block reads its A and B panels through L2;
  * split-K: the reduction over the cluster's shared memories, and the extra blocks.
Large square problems come out at 128 x 128 tiles (8 x 8 per thread); the MLP's small GEMMs at small tiles
or with K split, so that they fill the 132 SMs. The constants were set from a sweep of every catalogue
tile over the MLP's GEMMs on an H100 (bench/gemm_bench.py --sweep).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import GCompileError

PRECISIONS = ("fp32", "tf32")
SMS = 132                   # streaming multiprocessors of an H100 / H200 (SXM)
SPLITS = (1, 2, 4, 8)       # cluster sizes for split-K (8: the portable maximum)
SMEM_LIMIT = 48 * 1024      # static shared memory of one block
FMA_PER_CLK = {0: 128, 1: 1024}   # per SM: fp32 FFMA; tf32 tensor-core multiply-adds (dense rate)
LATENCY = 700               # clocks of a K step's global loads that a block cannot hide behind less work
L2_BYTES_PER_CLK = 3000     # L2 -> SM bandwidth of the whole GPU
LAUNCH_SPLIT = 400          # extra clocks of a cluster launch and its reduction's barriers


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    tf32: int = 0
    efficiency: float = 1.0   # fraction of the SM's peak this register block reaches with enough warps

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn) * (32 if self.tf32 else 1)

    def smem_bytes(self, split: int = 1) -> int:
        pipeline = 2 * self.bk * (self.bm + 8 + self.bn + 8) * 4
        return max(pipeline, self.bm * self.bn * 4 if split > 1 else 0)

    def splits(self) -> list[int]:
        """The splits this tile supports: the cluster's ranks share out its rows, the tile fits in smem."""
        return [s for s in SPLITS if self.bm % s == 0 and self.smem_bytes(s) <= SMEM_LIMIT]

    def c_type(self, split: int = 1, m: int = 0, n: int = 0, k: int = 0) -> str:
        return (f"gc_tile<{self.bm}, {self.bn}, {self.bk}, {self.tm}, {self.tn}, {self.tf32}, {split}, "
                f"{m}, {n}, {k}>")


# The catalogue: every tile any GEMM may get (tests compile each one with nvcc).
TILES = {
    "fp32": [
        Tile(128, 128, 8, 8, 8, 0, 0.85),
        Tile(128, 128, 16, 8, 8, 0, 0.85),
        Tile(128, 64, 8, 8, 4, 0, 0.75),
        Tile(128, 64, 16, 8, 4, 0, 0.75),
        Tile(64, 128, 8, 4, 8, 0, 0.75),
        Tile(64, 64, 16, 8, 4, 0, 0.65),
        Tile(64, 64, 32, 8, 4, 0, 0.65),
        Tile(64, 64, 16, 4, 4, 0, 0.6),
        Tile(64, 32, 16, 4, 4, 0, 0.55),
        Tile(64, 32, 32, 4, 4, 0, 0.55),
        Tile(32, 64, 16, 4, 4, 0, 0.55),
        Tile(32, 64, 32, 4, 4, 0, 0.55),
        Tile(32, 32, 16, 4, 4, 0, 0.5),
        Tile(32, 32, 32, 4, 4, 0, 0.5),
        Tile(64, 16, 16, 4, 4, 0, 0.45),
        Tile(16, 64, 16, 4, 4, 0, 0.45),
    ],
    "tf32": [
        Tile(128, 128, 16, 64, 32, 1, 0.5),
        Tile(128, 64, 16, 32, 32, 1, 0.45),
        Tile(64, 64, 16, 32, 32, 1, 0.4),
        Tile(64, 64, 32, 32, 32, 1, 0.4),
        Tile(64, 32, 16, 32, 16, 1, 0.3),
        Tile(64, 32, 32, 32, 16, 1, 0.3),
        Tile(32, 64, 16, 16, 32, 1, 0.3),
        Tile(32, 64, 32, 16, 32, 1, 0.3),
        Tile(32, 32, 16, 16, 16, 1, 0.25),
        Tile(32, 32, 32, 16, 16, 1, 0.25),
        Tile(32, 32, 64, 16, 16, 1, 0.25),
        Tile(64, 16, 16, 16, 16, 1, 0.2),
        Tile(16, 64, 16, 16, 16, 1, 0.2),
        Tile(16, 64, 32, 16, 16, 1, 0.2),
    ],
}


def occupancy(tile: Tile, split: int) -> int:
    """Blocks one SM holds at once: threads (2048), registers (the kernel caps itself at 128 a thread)
    and shared memory (228 KB, 1 KB reserved per block)."""
    by_threads = 2048 // tile.threads
    by_registers = 65536 // (128 * tile.threads)
    by_smem = (228 * 1024) // (tile.smem_bytes(split) + 1024)
    return max(1, min(32, by_threads, by_registers, by_smem))


def cost(tile: Tile, split: int, m: int, n: int, k: int, batch: int = 1) -> float:
    """Estimated clocks of one GEMM with this tile and split (see the module docstring)."""
    tiles = math.ceil(m / tile.bm) * math.ceil(n / tile.bn) * batch
    blocks = tiles * split
    k_split = math.ceil(math.ceil(k / split) / tile.bk) * tile.bk
    steps = max(1, k_split // tile.bk)
    per_sm = math.ceil(blocks / SMS)                     # blocks the busiest SM runs
    resident = min(per_sm, occupancy(tile, split))
    rounds = math.ceil(per_sm / resident)
    warps = resident * tile.threads // 32
    hiding = min(1.0, 0.3 + 0.7 * warps / 16)            # latency hidden by the resident warps
    rate = FMA_PER_CLK[tile.tf32] * tile.efficiency * hiding
    step = max(resident * tile.bm * tile.bn * tile.bk / rate, LATENCY)
    compute = rounds * steps * step
    memory = blocks * (tile.bm + tile.bn) * k_split * 4 / L2_BYTES_PER_CLK
    reduce = 0.0
    if split > 1:
        reduce = LAUNCH_SPLIT + rounds * split * tile.bm * tile.bn / tile.threads * 4
    return max(compute, memory) + reduce


def candidates(m: int, n: int, k: int, precision: str, batch: int = 1):
    """(cost, tile, split) for every catalogue tile and usable split, cheapest first."""
    out = []
    for tile in TILES[precision]:
        for split in tile.splits():
            if split > 1 and (k < 2 * split * tile.bk or batch * split > 65535):
                continue   # each split must keep at least two K steps
            out.append((cost(tile, split, m, n, k, batch), tile, split))
    out.sort(key=lambda c: (c[0], -c[1].bm * c[1].bn, c[2]))
    return out


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise GCompileError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    return precision


def choose_tile(m: int, n: int, k: int, trans_a: bool, trans_b: bool, precision: str, batch: int = 1) -> str:
    """C text of the tile type for C (m, n) = op(A) (m, k) @ op(B) (k, n), `batch` times.

    The transposes do not change the choice: every case stages both operands k-major in shared memory.
    precision "tf32" picks a tensor-core tile (float GEMMs only; the caller passes "fp32" for others)."""
    check_precision(precision)
    if min(m, n, k, batch) < 0:
        raise GCompileError(f"choose_tile: negative size m={m} n={n} k={k} batch={batch}")
    _, tile, split = candidates(max(m, 1), max(n, 1), max(k, 1), precision, max(batch, 1))[0]
    return tile.c_type(split, m, n, k)
