"""gemm_tiles: the tile configuration of each GEMM (the `Tile` argument of gc_gemm, runtime/gc_gemm.h).

`choose_tile(m, n, k, trans_a, trans_b, precision, batch, dtype)` returns the C text of the tile type,
`gc_tile<BM, BN, BK, TM, TN, TF32, SPLIT, M, N, K>`: the block's tile of C, the per-thread (fp32) or per-warp
(tf32) tile, the K split over a thread-block cluster, and the static shape the kernel is specialized for
(pipelined tiles add an eleventh argument, STAGES: gc_gemm_pipe_kernel).

The choice:
  0. large float32 fp32 problems (`is_large`: every side >= 1024, a block for at least 7/8 of the SMs) get
     LARGE_TILE, the pipelined kernel's (gc_gemm_pipe_kernel); large float32 tf32 problems get
     TC_LARGE_TILE, the tensor-core pipeline's (gc_gemm_tc_kernel) — where A is not read in place;
  0b. rules read off the whole step's time, not a GEMM's alone (each above its function): `short_k_choice` puts
     the GEMMs over a short batch on short-K tensor-core tiles, `tensor_core_choice` the larger x @ W reading
     the image input in place and fp32 weight gradients on tensor-core tiles;
otherwise, among the catalogue TILES and the splits (1, 2, 4, 8) each tile supports:
  1. measured: a float32 GEMM whose (m, n, k, transposes, precision, batch) was timed by the sweep
     (`bench/gemm_bench.py --sweep`, every candidate of every swept shape on one GPU, with the epilogue the
     MLP's step fuses into it) gets the fastest tile measured — every GEMM of the MLP's training step at
     batch 128 and 1000 is there;
  2. otherwise the cheapest register-staged tile by a cost model fitted to the same sweep (pipelined
     catalogue tiles only where measured: one the model preferred made logreg's batch-1000 step slower).
     The busiest of the 132 SMs (H100, H200) runs `per_sm = ceil(blocks / 132)` blocks,
     `rounds = ceil(per_sm / occupancy)` at a time, each `steps = ceil(K / split / BK)` steps; estimated
     microseconds:
        F0 + PER_BLOCK * per_sm + steps * (latency[tile] * rounds + throughput[tile] * per_sm)
        + (split > 1) * (SPLIT0 + SPLIT1 * split * BM * BN / 4096)
     latency[tile]: a step's time when the block has its SM to itself (load latency, barrier); throughput:
     what each more block sharing the SM adds (its arithmetic); the split terms: the cluster's reduction.
     Fitted by non-negative least squares on relative error. On the sweep's 46 (shape, precision) pairs
     the model alone picks a tile within 10% of the fastest measured (pipelined ones included) on 30,
     within 30% on 44, at worst 48% slower (calibration file: gemm_tiles_sm90.json, which records the GPU
     and commit it was measured on: an H100 sweep of this tree).
Large problems get 128 x 256 tiles (8 x 16 fp32 per thread, pipelined); the MLP's small GEMMs small tiles
and K splits that spread them over the SMs.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import GCompileError

PRECISIONS = ("fp32", "tf32")
SMS = 132                   # streaming multiprocessors of an H100 / H200 (SXM)
SPLITS = (1, 2, 4, 8)       # cluster sizes for split-K (8: the portable maximum)
SMEM_LIMIT = 48 * 1024      # static shared memory of one block
DYNAMIC_SMEM_LIMIT = 227 * 1024   # dynamic shared memory of one block (pipelined tiles)
CALIBRATION = Path(__file__).resolve().parent / "gemm_tiles_sm90.json"


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    tf32: int = 0     # 1: mma.sync tensor cores (a warp's TM x TN); 2: wgmma (sm_90a, a warpgroup's 64 x TN);
    #                   3: mma.sync on tf32 parts, to fp32 accuracy (an fp32 tile: X3 of gc_gemm_tc_kernel);
    #                   4: wgmma on tf32 parts (an fp32 tile, A transposed and B not only: gc_gemm_wg_kernel)
    #                   5: as 3, a short K slice staged whole (gc_gemm_sk_kernel: `stages` groups of bk k, all in
    #                      flight at once; a warp's TM x TN tile)
    #                   6: as 2, warp-specialized (gc_gemm_ws_kernel: bm / 64 consumer warpgroups of 64 x bn and two
    #                      producer warpgroups; bk 32; A not transposed only)
    #                   7: as 5, plain tf32 (a tf32 tile: one mma a product, the operands truncated by the tensor
    #                      cores as the mma.sync pipeline's)
    stages: int = 0   # > 0: the pipelined kernel (cp.async, `stages` K steps deep), for large problems
    kw: int = 1       # fp32 pipelined tiles: groups of threads sharing out each K step's k (KW of gc_tile)

    @property
    def threads(self) -> int:
        return ((self.bm // self.tm) * (self.bn // self.tn) * (128 if self.wgmma else 32 if self.tf32 else 1) * self.kw
                + 256 * (self.tf32 == 6))   # (the two producer warpgroups)

    @property
    def wgmma(self) -> bool:
        return self.tf32 in (2, 4, 6)

    @property
    def short_k(self) -> bool:
        """A short K slice staged whole (gc_gemm_sk_kernel): TF32 = 5 (tf32 parts, an fp32 tile) and 7 (tf32)."""
        return self.tf32 in (5, 7)

    @property
    def parts(self) -> bool:
        """fp32 on tensor cores: each operand as tf32 parts (TF32 = 3 and 5, mma.sync; 4, wgmma)."""
        return self.tf32 in (3, 4, 5)

    @property
    def uncalibrated(self) -> bool:
        """Tiles the calibration has no figures for: fp32 on tensor cores (tf32 parts), the warp-specialized wgmma
        ones and the plain tf32 short-K ones. Tuning tries them (alternatives); choose_tile gives them only
        through its rules (short_k_choice: the short-K ones at a small batch; tensor_core_choice)."""
        return self.parts or self.tf32 in (6, 7)

    def fits(self, trans_a: bool, trans_b: bool) -> bool:
        """Whether this tile computes a GEMM of these transposes: all of them, but the wgmma tf32-parts tiles
        only A^T B (a weight gradient: B's steps pass through registers, where its parts are made), the
        warp-specialized ones A not transposed only (its rows are copied into the layout as they lie)."""
        if self.tf32 == 6:
            return not trans_a
        return self.tf32 != 4 or (trans_a and not trans_b)

    @property
    def float_rows_only(self) -> bool:
        """Whether the kernel copies the image rows it reads in place straight into shared memory (cp.async),
        so float rows only: the fp32 pipelined, the tf32 wgmma and the short-K (TF32 = 5 and 7) kernels.
        The mma.sync pipeline (tf32 and tf32 parts), the wgmma tf32-parts tiles (A transposed: its rows copied as
        bytes, converted as its fragments are read) and the register-staged kernel take uint8 rows too."""
        return self.stages > 0 and self.tf32 not in (1, 3, 4)

    @property
    def name(self) -> str:
        kind = {0: "fp32", 1: "tf32", 2: "wgmma", 3: "3xtf32", 4: "3xwgmma", 5: "3xtf32sk", 6: "wgmma-ws",
                7: "tf32sk"}[self.tf32]
        return (f"{self.bm}x{self.bn}x{self.bk}/{self.tm}x{self.tn}/{kind}"
                + (f"/cp{self.stages}" if self.stages else "") + (f"/kw{self.kw}" if self.kw > 1 else ""))

    def smem_bytes(self, split: int = 1, itemsize: int = 4) -> int:
        """Shared memory of a block, for elements of `itemsize` bytes (8: a float64 GEMM, on the
        register-staged kernel: the other kernels are float32 only)."""
        if itemsize != 4 and (self.stages or self.tf32):
            raise GCompileError(f"tile {self.name}: for float32 GEMMs only, not {itemsize}-byte elements")
        if self.short_k:   # gc_sk_smem: KC = bk x stages k of each operand, rows padded (the larger layout)
            kc = self.bk * self.stages
            side = lambda x: max(kc * (x + 8), x * (kc + 4))  # noqa: E731
            return max(side(self.bm) + side(self.bn), (split > 1) * self.bm * self.bn) * 4
        if self.tf32 == 6:   # gc_ws_smem: the steps' 128-byte lines, the staging slots (B not k-contiguous), the
            # mbarriers, the row indices, 1024 bytes to align the start
            slots = 4 * min(self.stages, 4) * 32 * (self.bn // 4 + 4) * 4
            steps = self.stages * (self.bm + self.bn) * 128
            return max(steps, (split > 1) * self.bm * self.bn * 4) + slots + 16 * self.stages + 4 * self.bm + 1024
        if self.wgmma:   # gc_gemm_wg_kernel: 8-row groups of 32 BK + 16 bytes (gc_wg_layout), or one side as
            layout = lambda x: x // 8 * (32 * self.bk + 16)  # noqa: E731 - stored rows of x + 8 (gc_wg_rows)
            rows = lambda x: self.bk * (x + 8) * 4  # noqa: E731 - (the larger of the transposes' kinds)
            pipeline = self.stages * max(layout(self.bm) + layout(self.bn), layout(self.bm) + rows(self.bn),
                                         rows(self.bm) + layout(self.bn) * (2 if self.tf32 == 4 else 1))
        elif self.tf32 and self.stages:   # gc_gemm_tc_kernel: k-major rows of X + 4 or x-major of BK + 8 words
            side = lambda x: max(self.bk * (x + 4), x * (self.bk + 8))  # noqa: E731 - the larger of the two
            pipeline = self.stages * (side(self.bm) + side(self.bn)) * 4
        else:
            pad = 8 if self.tf32 else 4   # words a shared-memory row is padded by (LDA, LDB of both kernels)
            pipeline = max(2, self.stages) * self.bk * (self.bm + pad + self.bn + pad) * itemsize
        # then the partial tiles: K groups 1..kw-1's, the split's sum (gc_pipe_smem)
        return max(pipeline, max(self.kw - 1, split > 1) * self.bm * self.bn * itemsize)

    def blocks(self, split: int, m: int, n: int, batch: int = 1) -> int:
        """The grid's blocks for C (m, n), `batch` times, split `split` ways."""
        return math.ceil(m / self.bm) * math.ceil(n / self.bn) * batch * split

    def splits(self, itemsize: int = 4) -> list[int]:
        """The splits this tile supports: the cluster's ranks share out its rows, the tile fits in smem
        (pipelined tiles: dynamic shared memory) with elements of `itemsize` bytes (a tile of none: [])."""
        if itemsize != 4 and (self.stages or self.tf32):
            return []
        limit = DYNAMIC_SMEM_LIMIT if self.stages else SMEM_LIMIT
        return [s for s in SPLITS if self.bm % s == 0 and self.smem_bytes(s, itemsize) <= limit]

    def occupancy(self, split: int = 1) -> int:
        """Blocks one SM holds at once: threads (2048), registers (the kernel's cap: 128 a thread for 256
        threads, about 170 for fewer; pipelined tiles: 8 x 4 or smaller blocks use under 128, larger ones
        up to 255) and shared memory (228 KB, 1 KB reserved per block)."""
        if self.stages:
            cap = 128 if self.tm * self.tn <= 64 else 255
        else:
            cap = 128 if self.threads >= 256 else 65536 // ((384 // self.threads) * self.threads)
        by_smem = (228 * 1024) // (self.smem_bytes(split) + 1024)
        return max(1, min(32, 2048 // self.threads, 65536 // (cap * self.threads), by_smem))

    @staticmethod
    def parse(text: str) -> tuple["Tile", int]:
        """(tile, split) of a `c_type` text."""
        v = [int(x) for x in text.strip().removeprefix("gc_tile<").removesuffix(">").split(",")]
        return Tile(*v[:6], stages=v[10] if len(v) > 10 else 0, kw=v[11] if len(v) > 11 else 1), v[6] if len(v) > 6 else 1

    def c_type(self, split: int = 1, m: int = 0, n: int = 0, k: int = 0) -> str:
        tail = f", {self.stages}" if self.stages or self.kw > 1 else ""
        return (f"gc_tile<{self.bm}, {self.bn}, {self.bk}, {self.tm}, {self.tn}, {self.tf32}, {split}, "
                f"{m}, {n}, {k}{tail}{f', {self.kw}' if self.kw > 1 else ''}>")


# The catalogue: every tile any GEMM may get (tests compile each one with nvcc and check it has no spills).
# It keeps the tiles that were fastest, or nearly, on some swept shape. Five are pipelined (gc_gemm_pipe_kernel;
# H100, one run, against the register-staged tile the sweep had chosen: b1000 x @ W1 18.07 -> 16.85 us, dW1
# 18.33 -> 16.83, dW2 6.95 -> 5.95 with the first two; later, against those, with the step's epilogue:
# 64 x 64 x 32 b1000 x @ W1 15.85 -> 15.70, 64 x 64 x 16 / 8 x 8 dW1 17.13 -> 16.45, 32 x 32 x 16 dh1 b1000
# 4.67 -> 4.58 and b128 3.63 -> 3.40). Tiles of 256 threads, for more warps an SM (64 x 64 / 4 x 4 register-
# staged and pipelined, 128 x 64 / 8 x 4 pipelined), were slower at every MLP shape (H100, one sweep at 7aefa5a,
# best of them against the chosen: b128 x @ W1 7.57 vs 6.85 us, dW1 5.46 vs 4.22; b1000 x @ W1 18.82 vs 15.84,
# dW1 17.24 vs 16.87): not kept. Nor four or eight K groups (32 x 32 x 16 / 4 x 4 and 32 x 32 x 32 / 4 x 4
# kw4, kw8, 32 x 64 and 64 x 64 kw4, the copies made by the threads a step needs; H100, one sweep at 794a4f4):
# slower at every MLP shape (best of them, b128 x @ W1 7.31 vs 6.67 us, dW1 4.46 vs 4.23; b1000 x @ W1 27.1
# vs 16.4).
TILES = {
    "fp32": [Tile(128, 128, 8, 8, 8), Tile(64, 64, 16, 8, 4), Tile(64, 64, 32, 8, 4), Tile(64, 32, 16, 4, 4),
             Tile(32, 64, 16, 4, 4), Tile(32, 64, 32, 4, 4), Tile(32, 32, 16, 4, 4), Tile(32, 32, 32, 4, 4),
             Tile(64, 16, 16, 4, 4), Tile(16, 64, 16, 4, 4), Tile(64, 64, 16, 8, 4, stages=4),
             Tile(64, 16, 16, 4, 4, stages=4), Tile(64, 64, 32, 8, 4, stages=3), Tile(64, 64, 16, 8, 8, stages=4),
             Tile(32, 32, 16, 4, 4, stages=4),
             # the same with two K groups (KW = 2: twice the warps, each on every other k of a step)
             Tile(64, 64, 16, 8, 4, stages=4, kw=2), Tile(64, 64, 32, 8, 4, stages=3, kw=2),
             Tile(64, 64, 16, 8, 8, stages=4, kw=2), Tile(32, 32, 16, 4, 4, stages=4, kw=2),
             # fp32 on tensor cores (TF32 = 3): the tensor-core pipeline's tiles, each operand as two tf32
             # parts (TC_PARTS); not in the calibration: tuning tries them on the large GEMMs, and
             # tensor_core_choice gives 64 x 32 and 64 x 64 to the larger ones
             Tile(64, 64, 32, 32, 32, 3, stages=4), Tile(64, 32, 32, 32, 16, 3, stages=4),
             Tile(32, 32, 32, 16, 16, 3, stages=4), Tile(64, 64, 64, 32, 32, 3, stages=3),
             Tile(64, 32, 64, 32, 16, 3, stages=3), Tile(64, 128, 32, 32, 32, 3, stages=3),
             # the same on wgmma (TF32 = 4, A^T B only: the weight gradients), B's parts made as its steps are
             # stored in shared memory, not by each warp at each fragment (64 x 128 took 255 registers and
             # spilled)
             Tile(64, 64, 32, 64, 64, 4, stages=4),
             # tf32 parts on a short K slice staged whole (TF32 = 5, gc_gemm_sk.cuh: 128 k in flight at once),
             # 16 x 16 a warp: the small-batch weight gradients and split x @ W (docs/compiler.md); not in the
             # calibration: short_k_choice gives them, tuning tries them
             Tile(32, 64, 64, 16, 16, 5, stages=2), Tile(32, 64, 56, 16, 16, 5, stages=2),
             Tile(32, 32, 64, 16, 16, 5, stages=2)],
    "tf32": [Tile(128, 128, 16, 64, 32, 1), Tile(64, 64, 16, 32, 32, 1), Tile(64, 64, 32, 32, 32, 1),
             Tile(64, 32, 16, 32, 16, 1), Tile(64, 32, 32, 32, 16, 1), Tile(32, 64, 16, 16, 32, 1),
             Tile(32, 64, 32, 16, 32, 1), Tile(32, 32, 16, 16, 16, 1), Tile(32, 32, 32, 16, 16, 1),
             Tile(32, 32, 64, 16, 16, 1), Tile(64, 16, 16, 16, 16, 1), Tile(16, 64, 16, 16, 16, 1),
             Tile(16, 64, 32, 16, 16, 1),
             # the tensor-core pipeline's mid tiles (gc_gemm_tc_kernel: 4 warps, cp.async 3-4 K steps deep)
             Tile(64, 64, 32, 32, 32, 1, stages=4), Tile(64, 32, 32, 32, 16, 1, stages=4),
             Tile(32, 32, 32, 16, 16, 1, stages=4), Tile(64, 64, 64, 32, 32, 1, stages=3),
             # wgmma (gc_gemm_wg_kernel, sm_90a): a warpgroup a TM x TN tile, cp.async STAGES - 2 steps ahead
             Tile(64, 64, 32, 64, 64, 2, stages=4), Tile(64, 128, 32, 64, 128, 2, stages=4),
             Tile(128, 64, 32, 128, 64, 2, stages=4), Tile(128, 128, 32, 64, 128, 2, stages=3),
             Tile(64, 128, 16, 64, 128, 2, stages=6), Tile(128, 64, 16, 128, 64, 2, stages=6),
             # warp-specialized wgmma (gc_gemm_ws_kernel, sm_90a, A not transposed): consumer warpgroups of 64 x
             # bn, two producer warpgroups; not in the calibration: tuning tries them on the large GEMMs, and
             # tensor_core_choice gives 64 x 64 at 5 stages to the larger x @ W reading the input. 64 x 64 at
             # 5 stages too: 16 KB less shared memory a block than at 6, so that a block of the MLP's b1000 tf32
             # chain (~144 KB) fits beside one while it ends (streams.early_copies; docs/compiler.md)
             Tile(64, 128, 32, 64, 128, 6, stages=4), Tile(128, 64, 32, 64, 64, 6, stages=4),
             Tile(64, 64, 32, 64, 64, 6, stages=6), Tile(64, 64, 32, 64, 64, 6, stages=5),
             # the short-K tiles of the fp32 catalogue as plain tf32 (TF32 = 7: one mma a product): the
             # small-batch weight gradients and split x @ W; not in the calibration: tuning tries them, and
             # short_k_choice gives them (as the fp32 ones, above)
             Tile(32, 64, 64, 16, 16, 7, stages=2), Tile(32, 64, 56, 16, 16, 7, stages=2),
             Tile(32, 32, 64, 16, 16, 7, stages=2)],
}


# Large problems: the pipelined kernel's tile (gc_gemm_pipe_kernel: cp.async 3 K steps deep, 8 x 16 fp32 per
# thread, one block of 256 threads per SM), for float GEMMs whose sides are all at least LARGE and whose grid
# gives at least 7/8 of the SMs a block. Measured on an H100 (one run, % of cuBLAS): 4096^3 93% (the 128 x 128
# x 8 tile 82%), 2048^3 91% (83%), 3000 x 2500 x 1999 A and B transposed 88% (81%), 4096 x 4096 x 1024 B
# transposed 85% (83%); at 1024^3 (too few blocks) 64 x 64 tiles are faster. Kept out of the cost model and the
# sweep's candidates: the MLP's and the other small GEMMs never get it.
LARGE_TILE = Tile(128, 256, 32, 8, 16, stages=3)
LARGE = 1024


# tf32: the tensor-core pipeline (gc_gemm_tc_kernel, runtime/gc_gemm_tc.cuh: mma.sync tf32 fed by cp.async,
# STAGES K steps deep) for large problems (is_large): 128 x 128 x 32 tiles, 64 x 64 per warp, 3 stages, two
# blocks an SM. H100, one run: 4096^3 999 us, the register-staged 128 x 128 tf32 tile 1403 us (cuBLAS tf32
# 348 us). The MLP's GEMMs get the catalogue's 4-warp tensor-core tiles where the sweep measured them faster
# (b1000 x @ W1, h1 @ W2, dW2, dh1; not dW1), like any other catalogue tile (docs/compiler.md).
TC_LARGE_TILE = Tile(128, 128, 32, 64, 64, 1, stages=3)


# fp32 tiles on tensor cores (tf32 = 3, gc_gemm_tc_kernel's X3: each operand two tf32 parts, three mma a
# product, two where A is the uint8 image input): fp32's accuracy (an operand's parts hold it to 2^-21; the
# mma's products are exact, their sums fp32) at two or three times the tf32 tile's tensor-core work. Tuning
# tries them on GEMMs of TC_PARTS_MIN multiply-adds or more (the MLP's batch-1000 x @ W1 and dW1, 2e8, dW2,
# 2.6e7; at batch 128 x @ W1 and dW1, 2.6e7); the calibration has no figures for them (docs/compiler.md).
TC_PARTS_MIN = 1 << 24


def is_large(m: int, n: int, k: int, batch: int = 1) -> bool:
    return min(m, n, k) >= LARGE and LARGE_TILE.blocks(1, m, n, batch) >= SMS * 7 // 8


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise GCompileError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    return precision


def tile_by_name(name: str) -> Tile:
    for tiles in TILES.values():
        for tile in tiles:
            if tile.name == name:
                return tile
    if name == LARGE_TILE.name:
        return LARGE_TILE
    if name == TC_LARGE_TILE.name:
        return TC_LARGE_TILE
    raise GCompileError(f"gemm_tiles: {name!r} is not a catalogue tile")


@functools.lru_cache(maxsize=None)
def calibration() -> dict:
    """The fitted model constants and the measured fastest tiles (gemm_tiles_sm90.json)."""
    data = json.loads(CALIBRATION.read_text())
    data["measured_index"] = {measured_key(e["m"], e["n"], e["k"], e["trans_a"], e["trans_b"], e["precision"],
                                           e["batch"]): (tile_by_name(e["tile"]), e["split"])
                              for e in data["measured"]}
    return data


def measured_key(m, n, k, trans_a, trans_b, precision, batch) -> tuple:
    return (int(m), int(n), int(k), bool(trans_a), bool(trans_b), precision, int(batch))


def features(tile: Tile, split: int, m: int, n: int, k: int, batch: int = 1) -> dict:
    """The quantities the cost model is linear in."""
    per_sm = math.ceil(tile.blocks(split, m, n, batch) / SMS)
    steps = max(1, math.ceil(math.ceil(k / split) / tile.bk))
    rounds = math.ceil(per_sm / min(per_sm, tile.occupancy(split)))
    return {"per_sm": per_sm, "latency_steps": steps * rounds, "throughput_steps": steps * per_sm,
            "split": split > 1, "split_size": (split > 1) * split * tile.bm * tile.bn / 4096}


def cost(tile: Tile, split: int, m: int, n: int, k: int, batch: int = 1) -> float:
    """Estimated microseconds of one GEMM with this tile and split (see the module docstring)."""
    model = calibration()["model"]
    if tile.name not in model["tiles"]:
        return math.inf   # a tile the calibration has not measured yet (the sweep times it all the same)
    f = features(tile, split, m, n, k, batch)
    latency, throughput = model["tiles"][tile.name]
    return (model["f0"] + model["per_block"] * f["per_sm"] + latency * f["latency_steps"]
            + throughput * f["throughput_steps"] + model["split0"] * f["split"] + model["split1"] * f["split_size"])


def candidates(m: int, n: int, k: int, precision: str, batch: int = 1, pipelined: bool = True, itemsize: int = 4):
    """(cost, tile, split) for every catalogue tile (pipelined ones too, or not) and usable split, cheapest
    first; elements of `itemsize` bytes (8: float64, whose register-staged tiles take twice the shared memory)."""
    out = []
    for tile in TILES[precision]:
        if tile.stages and not pipelined:
            continue
        for split in tile.splits(itemsize):
            if split_fits(tile, split, k, batch):
                out.append((cost(tile, split, m, n, k, batch), tile, split))
    out.sort(key=lambda c: (c[0], -c[1].bm * c[1].bn, c[2]))
    return out


def split_fits(tile: Tile, split: int, k: int, batch: int = 1) -> bool:
    """Whether a GEMM of K = k, `batch` times, can be split `split` ways on this tile: each split keeps at least
    two K steps (a short-K tile, TF32 = 5 or 7, one group of bk k: it stages them all at once), and the grid's third
    dimension (batch x split) stays under its limit."""
    steps = 1 if tile.short_k else 2
    return split == 1 or (k >= steps * split * tile.bk and batch * split <= 65535)


def rows_fit(tile: Tile, split: int, rows: bool, k: int = 0, trans_a: bool = False) -> bool:
    """Whether the trainer's launches of a GEMM that reads the image input in place can run this tile: the
    pipelined and wgmma ones read the rows themselves (fp32: float rows, which the trainer gives them,
    GC_X_FLOAT; tf32: uint8 or float); the register-staged ones (fp32 and mma.sync tf32 without stages,
    gc_gemm_kernel) keep their block's row indices in static shared memory beside their two buffers, 48 KB in
    all: BM indices, or with A transposed (a weight gradient, K the batch) as many as the split's share of K
    (a tile that fit at batch 3584 needed 49 KB at 3585: nvcc's static_assert stopped the build)."""
    if not rows or tile.stages or tile.tf32 not in (0, 1, 3):
        return True
    indices = math.ceil(math.ceil(k / split) / tile.bk) * tile.bk if trans_a else tile.bm   # (the C side's IDX)
    return tile.smem_bytes(split) + 4 * indices <= SMEM_LIMIT


def tuned_tile(name: str, split: int, m: int, n: int, k: int, precision: str, batch: int = 1,
               dtype: str = "float32", rows: bool = False, trans_a: bool = False, trans_b: bool = False) -> str:
    """C text of a tile a tuning record chose (gcompile/tune.py), checked as choose_tile's own choices are:
    a catalogue tile of the GEMM's precision, a split it supports, usable where A is read in place."""
    check_precision(precision)
    tile = tile_by_name(name)
    if dtype != "float32":
        raise GCompileError(f"tuned tile {name}: only float32 GEMMs are tuned, this one is {dtype}")
    if tile not in TILES[precision]:
        raise GCompileError(f"tuned tile {name} is not a {precision} catalogue tile")
    if not tile.fits(trans_a, trans_b):
        what = "A not transposed only" if tile.tf32 == 6 else "A^T B only (a weight gradient)"
        raise GCompileError(f"tuned tile {name} computes {what}, and this GEMM is "
                            f"{'A^T' if trans_a else 'A'} {'B^T' if trans_b else 'B'}")
    if split not in tile.splits() or not split_fits(tile, split, k, batch):
        raise GCompileError(f"tuned tile {name}: split {split} does not fit it at K={k} (its splits: "
                            f"{tile.splits()})")
    if not rows_fit(tile, split, rows, k, trans_a):
        raise GCompileError(f"tuned tile {name}: too large for the register-staged kernel that reads the image "
                            "input in place (its row indices beside its buffers)")
    return tile.c_type(split, m, n, k)


def sm_distance(tile: Tile, split: int, m: int, n: int, batch: int = 1, per_sm: int = 1) -> float:
    """How far the grid is from `per_sm` blocks an SM (|log(blocks / (per_sm SMS))|): the splits tuning tries
    first (a block an SM)."""
    return abs(math.log(tile.blocks(split, m, n, max(batch, 1)) / (per_sm * SMS)))


def alternatives(m: int, n: int, k: int, trans_a: bool, trans_b: bool, precision: str, batch: int = 1,
                 dtype: str = "float32", rows: bool = False, count: int = 6) -> list[tuple[Tile, int]]:
    """What tuning tries for one GEMM besides choose_tile's choice: the measured fastest tile (where the sweep
    timed the shape), the cost model's cheapest `count` (tile, split) pairs, pipelined ones included, and of
    those the model puts within 25% of its cheapest, the one with the fewest blocks (a GEMM beside a longer
    branch leaves it SMs: docs/compiler.md) — all usable for this GEMM. The sweep times each GEMM alone, the
    tuner in the whole step."""
    if dtype != "float32" or is_large(m, n, k, batch):
        return []
    measured = calibration()["measured_index"].get(measured_key(m, n, k, trans_a, trans_b, precision, batch))
    out = [measured] if measured is not None and rows_fit(*measured, rows, k, trans_a) else []
    usable = [(c, t, s) for c, t, s in candidates(max(m, 1), max(n, 1), max(k, 1), precision, max(batch, 1))
              if rows_fit(t, s, rows, k, trans_a) and t.fits(trans_a, trans_b)]
    for _, tile, split in usable:
        if len(out) >= count + (measured is not None):
            break
        if (tile, split) not in out:
            out.append((tile, split))
    near = [(t.blocks(s, m, n, max(batch, 1)), c, t, s) for c, t, s in usable if c <= 1.25 * usable[0][0]]
    if near:
        _, _, tile, split = min(near, key=lambda x: (x[0], x[1]))
        if (tile, split) not in out:
            out.append((tile, split))
    # the tiles the calibration has no figures for (Tile.uncalibrated): on a GEMM of TC_PARTS_MIN multiply-adds or
    # more, each such tile at the two splits whose grids come nearest to a block an SM
    if m * n * k * max(batch, 1) >= TC_PARTS_MIN:
        for tile in TILES[precision]:
            if not tile.uncalibrated or not tile.fits(trans_a, trans_b):
                continue
            fits = sorted((s for s in tile.splits() if split_fits(tile, s, k, batch)
                           and rows_fit(tile, s, rows, k, trans_a)),
                          key=lambda s: sm_distance(tile, s, m, n, batch))
            out += [(tile, s) for s in fits[:2] if (tile, s) not in out]
    return out


# Short-K tiles (TF32 = 5 under fp32: tf32 parts; 7 under tf32: plain) take, whatever the sweep timed for the
# GEMM alone, two kinds of float GEMM of SHORT_K_MIN_FMA multiply-adds or more at batch 1 (under fp32, whose
# parts triple the tensor cores' work, TC_PARTS_MIN or more, as tuning tries them: LeNet's 400 x 120 x 128
# weight gradient, 6.1M, on one made its b128 fp32 step 113.58 -> 114.22 us, H100 trainer, 3 rounds):
# - a weight gradient over at most SHORT_K_MAX rows of the batch (C = A^T B, K the batch: one round of a
#   short-K tile's 128 k; a smaller one is a chain's post stage, or keeps the sweep's tile), the grid nearest a
#   block an SM. In the step it runs beside a chain's post kernel (chain.post_stages), where a tile of the other
#   tf32 kinds was held back by the post kernel's blocks. H100, MLP b128 tf32 trainer, one run of 5 interleaved
#   rounds: dW1 on the mma.sync tile the sweep chose and no post kernel (dW2, dW3 and the bias gradients kernels
#   of their own) 13.94 us a step; with the post kernel 17.07; x @ W1 and dW1 on short-K tiles without the post
#   kernel 12.67, with it 11.45 (the fp32 record's build 12.35);
# - x @ W over at most SHORT_K_MAX rows (A not transposed, M the batch) and a longer K, split so that each
#   split's K slice is one round of the tile's k (a split of at most 8), where that grid comes within a factor
#   SHORT_K_SPREAD of a block an SM: the batch-128 MLP's x @ W1, 128 x 256 x 784, split 8, 128 blocks.
# Of a kind's (tile, split) options, the grid nearest a block an SM, then the fewest k of padding in the
# slice's last group, then the catalogue's order. These are the tuning records' choices for the MLP at batch 128
# (make tune, H100; bench/tuned). H100, MLP b128 trainer, 4 interleaved rounds of 4 epochs, us a step: fp32
# with the sweep's tiles 20.56, dW1 on 3xtf32sk 14.34, x @ W1 on it 18.58, both (the record) 12.32; tf32 (another
# run, 4 rounds), the first rule only 12.19, both (the record's tiles) 11.44.
SHORT_K_MAX = 128
SHORT_K_MIN_FMA = 1 << 22
SHORT_K_SPREAD = 2


def short_k_choice(m: int, n: int, k: int, trans_a: bool, trans_b: bool, precision: str, batch: int = 1,
                   dtype: str = "float32") -> tuple[Tile, int] | None:
    """(tile, split) for a GEMM that the rules above put on a short-K tile of the precision's catalogue; else
    None."""
    if dtype != "float32" or batch != 1 or m * n * k < (TC_PARTS_MIN if precision == "fp32" else SHORT_K_MIN_FMA):
        return None
    gradient = trans_a and not trans_b and 0 < k <= SHORT_K_MAX
    split_rows = not trans_a and 0 < m <= SHORT_K_MAX < k
    if not (gradient or split_rows):
        return None

    def slice_fits(t: Tile, s: int) -> bool:   # the split rows' rule: one round of k a split
        return gradient or math.ceil(k / s) <= t.bk * t.stages

    def padding(t: Tile, s: int) -> int:   # k of zeros in the last group of a split's slice
        return -math.ceil(k / s) % t.bk

    options = [(sm_distance(t, s, m, n), padding(t, s), i, t, s) for i, t in enumerate(TILES[precision])
               if t.short_k for s in t.splits() if split_fits(t, s, k) and slice_fits(t, s)]
    if not options:
        return None
    best = min(options)
    return best[3:] if gradient or best[0] <= math.log(SHORT_K_SPREAD) else None


# The larger float GEMMs on tensor cores, whatever the sweep timed (it timed each GEMM alone, and the
# warp-specialized and tf32-parts tiles not at all: Tile.uncalibrated): a GEMM of TC_PARTS_MIN multiply-adds or
# more at batch 1, B not transposed, M and K above SHORT_K_MAX (the short-K rules' GEMMs stay theirs) and N at
# least the tile's BN, that is not `is_large`:
# - x @ W reading the image input in place (`rows`: the batch's rows gathered as they are loaded): tf32 on the
#   warp-specialized 64 x 64 tile, 5 stages (its producers gather the rows while the consumer computes), the
#   split whose grid is nearest a block an SM; fp32 on the tf32-parts 64 x 32 tile, nearest two blocks an SM;
# - fp32 A^T B (a weight gradient): the tf32-parts 64 x 64 tile, nearest two blocks an SM.
# Ties: the fewer splits. The fp32 tiles are mma.sync (sm_80 and later): an fp32 build keeps running without
# sm_90 machine code (the 3xwgmma tile the H100's b1000 record gives dW1 needs it). These are the tuning
# records' x @ W1 tiles at batch 1000 (bench/tuned). H100, MLP trainer with default tiles, one run of 3
# interleaved rounds of 3 epochs, us a step, the sweep's tiles -> these: tf32 b256 26.36 -> 26.19, b512 35.56 ->
# 30.17, b1000 29.52 -> 26.32, b2000 76.78 -> 58.40; fp32 b256 40.85 -> 28.79, b512 48.64 -> 31.73, b1000 47.68 ->
# 39.81, b2000 104.80 -> 65.00 (a block an SM instead: 28.28, 32.00, 44.84, 73.53). LeNet at b1000, another run,
# with a first form of the rule that took its fc1 (no input rows) too: fp32 547.08 -> 546.01, tf32 566.42 ->
# 566.31. Alone (the GEMM benchmark, no gathered rows; two runs) the warp-specialized tile took 1000 x 100 x 256 in
# 7.42 us against the sweep's 3.70: x @ W whose A is not the input keeps the sweep's tile. The tf32 weight
# gradient keeps the sweep's wgmma tile (b1000: the record's 64 x 64 split 4 alone 29.29 against 29.35).
TC_RULE_TILES = {("tf32", False): tile_by_name("64x64x32/64x64/wgmma-ws/cp5"),   # (catalogue tiles, by name)
                 ("fp32", False): tile_by_name("64x32x32/32x16/3xtf32/cp4"),
                 ("fp32", True): tile_by_name("64x64x32/32x32/3xtf32/cp4")}
TC_RULE_PER_SM = {"tf32": 1, "fp32": 2}


def tensor_core_choice(m: int, n: int, k: int, trans_a: bool, trans_b: bool, precision: str, batch: int = 1,
                       dtype: str = "float32", rows: bool = False) -> tuple[Tile, int] | None:
    """(tile, split) for a GEMM that the rule above puts on a tensor-core tile of the precision's catalogue;
    else None."""
    tile = TC_RULE_TILES.get((precision, bool(trans_a)))
    if (tile is None or dtype != "float32" or batch != 1 or trans_b or (not trans_a and not rows)
            or m * n * k < TC_PARTS_MIN or min(m, k) <= SHORT_K_MAX or n < tile.bn or is_large(m, n, k, batch)):
        return None
    splits = [s for s in tile.splits() if split_fits(tile, s, k, batch)]
    return tile, min(splits, key=lambda s: (sm_distance(tile, s, m, n, batch, TC_RULE_PER_SM[precision]), s))


def choose_tile(m: int, n: int, k: int, trans_a: bool, trans_b: bool, precision: str, batch: int = 1,
                dtype: str = "float32", rows: bool = False) -> str:
    """C text of the tile type for C (m, n) = op(A) (m, k) @ op(B) (k, n), `batch` times, of `dtype` elements.

    precision "tf32" picks a tensor-core tile (float GEMMs only; the caller passes "fp32" for others).
    rows: A is the image input read in place (plan_memory.batch_rows). Pipelined tiles read the rows
    themselves (fp32: gc_pipe_rows, from the float rows the trainer gives them; tf32: gc_gemm_tc_kernel),
    register-staged ones through their row loader; LARGE_TILE and TC_LARGE_TILE are not given to it (the
    block's row indices sit in its shared memory, with TA as many as K: the large sizes are not bounded)."""
    check_precision(precision)
    if min(m, n, k, batch) < 0:
        raise GCompileError(f"choose_tile: negative size m={m} n={n} k={k} batch={batch}")
    if dtype == "float32" and is_large(m, n, k, batch) and not rows:
        return (LARGE_TILE if precision == "fp32" else TC_LARGE_TILE).c_type(1, m, n, k)
    ruled = (short_k_choice(m, n, k, trans_a, trans_b, precision, batch, dtype)
             or tensor_core_choice(m, n, k, trans_a, trans_b, precision, batch, dtype, rows))
    if ruled is not None:
        return ruled[0].c_type(ruled[1], m, n, k)
    # the sweep times float32 GEMMs: its choices are not given to float64 ones (8 x 8 doubles a thread...)
    measured = (calibration()["measured_index"].get(measured_key(m, n, k, trans_a, trans_b, precision, batch))
                if dtype == "float32" else None)
    if measured is not None and rows_fit(*measured, rows, k, trans_a):
        tile, split = measured
    else:
        # the model ranks the register-staged tiles only: a pipelined one it preferred made logreg's
        # batch-1000 step 4% slower (H100, 23.8 -> 24.8 us), so those go only where the sweep timed them
        usable = (c for c in candidates(max(m, 1), max(n, 1), max(k, 1), precision, max(batch, 1), pipelined=False,
                                        itemsize=8 if dtype == "float64" else 4)
                  if rows_fit(c[1], c[2], rows, k, trans_a))
        _, tile, split = next(usable, (None, None, None))
        if tile is None:
            raise GCompileError(f"choose_tile: a {m}x{n}x{k} GEMM reading the image input in place with A transposed "
                                f"needs {k} row indices, more than any tile's block can hold beside its buffers in "
                                f"{SMEM_LIMIT // 1024} KB of shared memory: use a smaller batch")
    return tile.c_type(split, m, n, k)
