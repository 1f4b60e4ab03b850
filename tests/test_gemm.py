"""gc_gemm against float64 numpy on both targets (the cuda one on a GPU machine): every transpose case, odd
shapes, static shapes the tiles divide, split-K, batches with strides and gaps, unaligned pointers, an
epilogue, fp32 and tf32 tiles, float64; a launch that contradicts its tile's static shape is refused.
Also: the tile heuristic's choices, and an nvcc compile (no GPU needed) of every catalogue tile."""
from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import gcompile as gc
from gcompile.build import compile_flags
from gcompile.errors import GCompileError
from gcompile.gemm_tiles import (LARGE_TILE, TC_LARGE_TILE, TILES, Tile, alternatives, calibration, candidates,
                                 SHORT_K_MAX, SMEM_LIMIT, choose_tile, cost, is_large, rows_fit, short_k_choice,
                                 tensor_core_choice, tile_by_name, tuned_tile)
from gcompile.resources import package_dir
import gemm_harness as H

TARGETS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def mlp_gemms(batch):
    """(m, n, k, trans_a, trans_b) of every GEMM in a training step of the 784-256-100-10 MLP."""
    return [(batch, 256, 784, False, False), (batch, 100, 256, False, False), (batch, 10, 100, False, False),
            (100, 10, batch, True, False), (batch, 100, 10, False, True), (256, 100, batch, True, False),
            (batch, 256, 100, False, True), (784, 256, batch, True, False)]


def parts_cases(odd: str, split: str, runs: str, nans: str, tf32: bool = False) -> list[H.Case]:
    """A family of fp32-on-tensor-core tiles in every transpose case, held to the fp32 tolerances (tf32: a family
    of tf32 tiles, to tf32's): `odd` on odd shapes, `split` (a split tile, any shape) with the epilogue, `runs`
    (split 4, specialized for 112 x 64 x 1000) with the epilogue on runs of 4 columns, `nans` with NaN operands."""
    out = []
    for ta in (False, True):
        for tb in (False, True):
            out += [H.Case("float32", ta, tb, odd, 37, 53, 29, ep=True, tf32=tf32),
                    H.Case("float32", ta, tb, split, 100, 136, 300, ep=True, tf32=tf32),
                    H.Case("float32", ta, tb, runs, 112, 64, 1000, ep=True, runs=True, tf32=tf32),
                    H.Case("float32", ta, tb, nans, 70, 40, 100, nans=True, tf32=tf32)]
    return out


def cases() -> list[H.Case]:
    C = H.Case
    out = []
    for ta in (False, True):
        for tb in (False, True):
            out += [
                C("float32", ta, tb, "gc_tile<32, 32, 16, 4, 4, 0>", 37, 53, 29),           # any shape, odd sizes
                C("float32", ta, tb, choose_tile(70, 45, 300, ta, tb, "fp32"), 70, 45, 300, ep=True),
                C("float32", ta, tb, "gc_tile<64, 64, 16, 4, 4, 0, 4, 128, 64, 1024>", 128, 64, 1024),  # no checks
                C("float32", ta, tb, "gc_tile<64, 64, 16, 32, 32, 1>", 37, 53, 29, tf32=True),
                C("float32", ta, tb, "gc_tile<64, 32, 16, 32, 16, 1, 4, 100, 36, 1000>", 100, 36, 1000,
                  ep=True, tf32=True),
                C("float32", ta, tb, LARGE_TILE.c_type(), 300, 260, 70, ep=True),
                C("float32", ta, tb, LARGE_TILE.c_type(1, 1000, 999, 777), 1000, 999, 777),
            ]
    out += [
        # batches: strides with gaps (C's gaps must stay untouched) and no multiple of 4 (scalar loads)
        C("float32", False, True, "gc_tile<32, 32, 16, 4, 4, 0>", 33, 20, 17, batch=3, sa=33 * 17 + 3,
          sb=20 * 17, sc=33 * 20 + 4, ep=True),
        C("float32", True, False, choose_tile(64, 48, 40, True, False, "tf32", 4), 64, 48, 40, batch=4, tf32=True),
        C("float32", False, False, "gc_tile<32, 32, 16, 4, 4, 0, 2>", 40, 24, 100, batch=2, sc=40 * 24 + 8),
        # A one element past an aligned address: scalar loads
        C("float32", False, False, "gc_tile<64, 64, 16, 8, 4, 0>", 64, 64, 64, shift=1),
        C("float32", True, True, "gc_tile<64, 64, 16, 8, 4, 0>", 64, 64, 64, shift=1),
        # the big tiles, with overhangs
        C("float32", False, False, "gc_tile<128, 128, 8, 8, 8, 0>", 300, 260, 70, ep=True),
        C("float32", True, True, "gc_tile<128, 128, 16, 64, 32, 1>", 300, 260, 70, tf32=True),
        # the pipelined tile for large problems: overhangs and K no multiple of its step, a static shape it
        # divides, batches with gaps and odd rows (element copies), unaligned A; a small pipelined tile, float64
        C("float32", False, False, LARGE_TILE.c_type(1, 256, 512, 96), 256, 512, 96, ep=True),
        C("float32", False, True, LARGE_TILE.c_type(), 33, 20, 17, batch=3, sa=33 * 17 + 3, sb=20 * 17,
          sc=33 * 20 + 4, ep=True),
        C("float32", True, False, LARGE_TILE.c_type(), 130, 132, 36, shift=1),
        C("float64", True, True, "gc_tile<64, 64, 16, 4, 4, 0, 1, 0, 0, 0, 3>", 45, 138, 77, ep=True),
        # K = 0: every output is ep(0)
        C("float32", False, False, "gc_tile<32, 32, 16, 4, 4, 0>", 5, 7, 0, ep=True),
        # double
        C("float64", True, False, "gc_tile<64, 64, 16, 4, 4, 0, 2>", 45, 38, 77, ep=True),
        C("float64", False, True, "gc_tile<32, 32, 16, 4, 4, 0>", 45, 38, 77, batch=2),
        # a launch whose shape is not the tile's static shape is refused
        C("float32", False, False, "gc_tile<32, 32, 16, 4, 4, 0, 1, 64, 64, 64>", 65, 64, 64,
          expect_error="specialized for"),
    ]
    # the tf32 tensor-core pipeline (gc_gemm_tc.cuh), every transpose case: odd shapes (element copies),
    # overhangs with 16-byte copies, split-K with the epilogue, a static shape it divides (no checks)
    for ta in (False, True):
        for tb in (False, True):
            out += [
                C("float32", ta, tb, "gc_tile<64, 64, 32, 32, 32, 1, 1, 0, 0, 0, 4>", 37, 53, 29, ep=True, tf32=True),
                C("float32", ta, tb, "gc_tile<64, 32, 32, 32, 16, 1, 1, 0, 0, 0, 4>", 100, 68, 300, tf32=True),
                C("float32", ta, tb, "gc_tile<32, 32, 32, 16, 16, 1, 4, 100, 36, 1000, 4>", 100, 36, 1000,
                  ep=True, tf32=True),
                C("float32", ta, tb, "gc_tile<64, 64, 32, 32, 32, 1, 2, 128, 128, 256, 3>", 128, 128, 256,
                  ep=True, tf32=True),
                C("float32", ta, tb, "gc_tile<128, 128, 32, 64, 32, 1, 1, 0, 0, 0, 3>", 300, 260, 70, ep=True,
                  tf32=True),
                C("float32", ta, tb, "gc_tile<128, 128, 32, 64, 64, 1, 8, 0, 0, 0, 3>", 260, 300, 700, ep=True,
                  tf32=True),
            ]
    # K groups (KW = 2: the fp32 pipelined kernel's threads in two groups sharing out each step's k), every
    # transpose case: odd shapes, overhangs, split-K with the epilogue, the MLP's batch-1000 x @ W1 (K no
    # multiple of a split's steps)
    for ta in (False, True):
        for tb in (False, True):
            out += [
                C("float32", ta, tb, "gc_tile<64, 64, 16, 8, 4, 0, 1, 0, 0, 0, 4, 2>", 37, 53, 29, ep=True),
                C("float32", ta, tb, "gc_tile<32, 32, 16, 4, 4, 0, 4, 0, 0, 0, 4, 2>", 100, 36, 1000, ep=True),
                C("float32", ta, tb, "gc_tile<64, 64, 32, 8, 4, 0, 2, 1000, 256, 784, 3, 2>", 1000, 256, 784,
                  ep=True),
                C("float32", ta, tb, "gc_tile<64, 64, 16, 8, 8, 0, 8, 0, 0, 0, 4, 2>", 130, 132, 300),
            ]
    out += [
        # K groups: batches with gaps and odd rows, A unaligned, K = 0, float64, the image input read in place
        # (from float rows: the pipelined kernel reads them, gc_pipe_rows)
        C("float32", False, True, "gc_tile<32, 32, 16, 4, 4, 0, 1, 0, 0, 0, 4, 2>", 33, 20, 17, batch=3,
          sa=33 * 17 + 3, sb=20 * 17, sc=33 * 20 + 4, ep=True),
        C("float32", True, False, "gc_tile<64, 64, 16, 8, 4, 0, 2, 0, 0, 0, 4, 2>", 130, 132, 36, shift=1),
        C("float32", False, False, "gc_tile<32, 32, 16, 4, 4, 0, 1, 0, 0, 0, 4, 2>", 5, 7, 0, ep=True),
        C("float64", True, True, "gc_tile<64, 64, 16, 4, 4, 0, 2, 0, 0, 0, 3, 2>", 45, 138, 77, ep=True),
        C("float32", False, False, "gc_tile<32, 32, 16, 4, 4, 0, 1, 100, 36, 300, 4, 2>", 100, 36, 300, ep=True,
          rows="f32", index=True),
        C("float32", True, False, "gc_tile<64, 64, 16, 8, 4, 0, 2, 304, 64, 128, 4, 2>", 304, 64, 128, rows="f32",
          index=True),
    ]
    # the pipelined kernel reading the image input in place from float rows (gc_pipe_rows): both layouts of
    # A (its rows are M, or K with TA: a row per K step's copy), indexed or in order, overhangs, split-K, the
    # epilogue, short odd-sized ones
    for ta in (False, True):
        for index in (True, False):
            out += [
                C("float32", ta, False, "gc_tile<32, 32, 16, 4, 4, 0, 8, 128, 256, 784, 4>", 128, 256, 784,
                  ep=True, rows="f32", index=index),
                C("float32", ta, True, "gc_tile<64, 64, 32, 8, 4, 0, 2, 100, 36, 1000, 3, 2>", 100, 36, 1000,
                  ep=True, rows="f32", index=index),
                C("float32", ta, False, "gc_tile<64, 16, 16, 4, 4, 0, 4, 72, 40, 300, 4>", 72, 40, 300,
                  rows="f32", index=index),
            ]
        m, k = (36, 29) if ta else (37, 28)   # the stored rows' length (K, or M with TA) a multiple of 4
        out.append(C("float32", ta, False, f"gc_tile<64, 64, 16, 8, 4, 0, 1, {m}, 53, {k}, 4>", m, 53, k,
                     rows="f32"))
    # uint8 rows refused: cp.async copies floats only (the trainer converts them, GC_X_FLOAT)
    out.append(C("float32", False, False, "gc_tile<32, 32, 16, 4, 4, 0, 8, 128, 256, 784, 4>", 128, 256, 784,
                 rows="u8", expect_error="float rows only", cuda_only=True))
    out += [
        # batches with gaps and odd rows, A unaligned, K = 0, split 8 whose last slices are empty
        C("float32", False, True, "gc_tile<64, 64, 32, 32, 32, 1, 1, 0, 0, 0, 4>", 33, 20, 17, batch=3,
          sa=33 * 17 + 3, sb=20 * 17, sc=33 * 20 + 4, ep=True, tf32=True),
        C("float32", True, False, "gc_tile<64, 64, 32, 32, 32, 1, 1, 0, 0, 0, 4>", 130, 132, 36, shift=1, tf32=True),
        C("float32", False, False, "gc_tile<32, 32, 32, 16, 16, 1, 1, 0, 0, 0, 4>", 5, 7, 0, ep=True, tf32=True),
        C("float32", False, False, "gc_tile<64, 64, 32, 32, 32, 1, 8, 0, 0, 0, 4>", 70, 40, 100, ep=True, tf32=True),
        # NaN operands stay NaN through the tf32 rounding or truncation (both layouts of A), the fp32 and tf32
        # kernels alike
        C("float32", False, False, "gc_tile<64, 64, 32, 32, 32, 1, 1, 0, 0, 0, 4>", 70, 40, 100, nans=True, tf32=True),
        C("float32", True, True, "gc_tile<64, 64, 32, 32, 32, 1, 2, 0, 0, 0, 4>", 70, 40, 100, nans=True, tf32=True),
        C("float32", False, True, "gc_tile<64, 64, 16, 32, 32, 1>", 70, 40, 100, nans=True, tf32=True),
        C("float32", True, False, "gc_tile<32, 32, 16, 4, 4, 0>", 70, 40, 100, nans=True),
    ]
    # A read in place (gc_rows: the trainer's image input), every source form, both layouts of A (its rows
    # are M, or K with TA): the tensor-core pipeline (16-byte copies; rows of no multiple of 16 bytes or an
    # unaligned uint8 source: 4-byte copies; split-K; overhangs; the epilogue) and the register-staged kernel
    for ta in (False, True):
        for tb in (False, True):
            for rows, index in (("u8", True), ("u8", False), ("f32", True)):
                out += [
                    C("float32", ta, tb, "gc_tile<64, 64, 32, 32, 32, 1, 1, 112, 72, 304, 3>", 112, 72, 304,
                      ep=True, tf32=True, rows=rows, index=index),
                    C("float32", ta, tb, "gc_tile<32, 64, 32, 16, 32, 1, 4, 100, 36, 1000, 4>", 100, 36, 1000,
                      ep=True, tf32=True, rows=rows, index=index),
                    C("float32", ta, tb, "gc_tile<64, 64, 64, 32, 32, 1, 2, 80, 80, 192, 3>", 80, 80, 192,
                      tf32=True, rows=rows, index=index),
                    C("float32", ta, tb, "gc_tile<32, 64, 16, 16, 32, 1, 2, 100, 36, 1000>", 100, 36, 1000,
                      ep=True, tf32=True, rows=rows, index=index),
                    C("float32", ta, tb, "gc_tile<32, 32, 16, 4, 4, 0, 1, 100, 36, 300>", 100, 36, 300,
                      ep=True, rows=rows, index=index),
                ]
            out.append(C("float32", ta, tb, "gc_tile<64, 64, 32, 32, 32, 1, 1, 112, 72, 304, 3>", 112, 72, 304,
                         tf32=True, rows="u8", shift=4))
    # epilogues on runs of 4 columns (ep_test_runs, N a multiple of the tile's): packs loaded into registers
    # while the first K steps load (4 x 4 and 8 x 4 blocks; the plain and the pipelined kernel, K groups), too
    # many packs to keep (8 x 8: loaded at the end), splits (their reduction's runs, fp32 and tf32); rows past
    # M, A read in place
    for ta in (False, True):
        for tb in (False, True):
            for tile, m, n, k in (("gc_tile<32, 32, 16, 4, 4, 0, 1, 100, 64, 300>", 100, 64, 300),
                                  ("gc_tile<32, 32, 16, 4, 4, 0, 1, 100, 64, 300, 4>", 100, 64, 300),
                                  ("gc_tile<64, 64, 16, 8, 4, 0, 1, 100, 128, 300>", 100, 128, 300),
                                  ("gc_tile<64, 64, 16, 8, 4, 0, 1, 100, 128, 300, 4, 2>", 100, 128, 300),
                                  ("gc_tile<64, 64, 16, 8, 8, 0, 1, 100, 128, 300, 4>", 100, 128, 300),
                                  ("gc_tile<32, 32, 16, 4, 4, 0, 4, 100, 64, 1000, 4>", 100, 64, 1000)):
                out.append(C("float32", ta, tb, tile, m, n, k, ep=True, runs=True))
            # tf32 splits: their reduction takes runs of 4 too (the plain and the pipelined tensor-core kernel)
            for tile, m, n, k in (("gc_tile<32, 64, 32, 16, 32, 1, 4, 100, 64, 1000>", 100, 64, 1000),
                                  ("gc_tile<64, 64, 32, 32, 32, 1, 2, 112, 128, 304, 3>", 112, 128, 304)):
                out.append(C("float32", ta, tb, tile, m, n, k, ep=True, runs=True, tf32=True))
    out += [C("float32", False, False, "gc_tile<32, 32, 16, 4, 4, 0, 1, 100, 64, 300>", 100, 64, 300, ep=True,
              runs=True, rows="u8"),
            C("float32", False, False, "gc_tile<32, 32, 16, 4, 4, 0, 1, 100, 64, 300, 4>", 100, 64, 300, ep=True,
              runs=True, rows="f32")]
    # the wgmma kernel (gc_gemm_wgmma.cuh, sm_90a), every transpose case (k contiguous: 16-byte copies; A^T's B
    # transposed through registers, gc_wg_staged): odd shapes (element copies), overhangs, split-K with the epilogue, a static shape
    # it divides (no checks), two warpgroups, BK 16, the MLP's batch-1000 x @ W1 and dW1 (K no multiple of a
    # split's steps); the image input read in place from float rows (both layouts of A, indexed or in order)
    for ta in (False, True):
        for tb in (False, True):
            out += [
                C("float32", ta, tb, "gc_tile<64, 64, 32, 64, 64, 2, 1, 0, 0, 0, 4>", 37, 53, 29, ep=True, tf32=True),
                C("float32", ta, tb, "gc_tile<64, 128, 32, 64, 128, 2, 1, 0, 0, 0, 4>", 100, 136, 300, tf32=True),
                C("float32", ta, tb, "gc_tile<64, 128, 32, 64, 128, 2, 4, 1000, 256, 784, 4>", 1000, 256, 784,
                  ep=True, tf32=True),
                C("float32", ta, tb, "gc_tile<128, 64, 32, 128, 64, 2, 2, 128, 256, 256, 4>", 128, 256, 256,
                  ep=True, tf32=True),
                C("float32", ta, tb, "gc_tile<128, 128, 32, 64, 128, 2, 8, 0, 0, 0, 3>", 260, 300, 700, ep=True,
                  tf32=True),
                C("float32", ta, tb, "gc_tile<64, 128, 16, 64, 128, 2, 2, 0, 0, 0, 6>", 70, 140, 100, ep=True,
                  tf32=True),
                # a step of fewer 4 x 4 units of the transposed B (A^T B) than threads (128 x 64 x 16: 64 units,
                # 128 threads; gc_wg_staged's idle threads), by elements (N odd) and by vectors
                C("float32", ta, tb, "gc_tile<128, 64, 16, 128, 64, 2, 2, 0, 0, 0, 6>", 150, 70, 100, ep=True,
                  tf32=True),
                C("float32", ta, tb, "gc_tile<128, 64, 16, 128, 64, 2, 1, 0, 0, 0, 6>", 130, 136, 200, tf32=True),
            ]
            for index in (True, False):
                out.append(C("float32", ta, tb, "gc_tile<64, 128, 32, 64, 128, 2, 4, 784, 256, 1000, 4>"
                             if ta else "gc_tile<64, 128, 32, 64, 128, 2, 4, 1000, 256, 784, 4>",
                             *((784, 256, 1000) if ta else (1000, 256, 784)), ep=True, tf32=True, rows="f32",
                             index=index))
    # the warp-specialized wgmma kernel (TF32 = 6, gc_gemm_ws.cuh, sm_90a; A not transposed), B k-contiguous
    # (TB: copied as it lies, by the TMA unit where K is a multiple of 4 and the batch is one — zeros past N and
    # past K in the last split's last step — else by cp.async) or not (transposed by the producer warps):
    # odd shapes (element copies),
    # overhangs, split-K with the epilogue (the cluster's sum, all threads) and on partials... its grid's
    # shapes: two consumer warpgroups, 6 stages, a static shape it divides, K past one step only; the MLP's
    # batch-1000 x @ W1 from float rows (indexed or not; 4 and 5 stages); batches with gaps, A unaligned, K = 0,
    # NaN operands
    for tb in (False, True):
        out += [
            C("float32", False, tb, "gc_tile<64, 128, 32, 64, 128, 6, 1, 0, 0, 0, 4>", 37, 53, 29, ep=True, tf32=True),
            C("float32", False, tb, "gc_tile<64, 64, 32, 64, 64, 6, 2, 0, 0, 0, 6>", 100, 136, 300, ep=True,
              tf32=True),
            C("float32", False, tb, "gc_tile<128, 64, 32, 64, 64, 6, 4, 128, 256, 256, 4>", 128, 256, 256,
              ep=True, tf32=True),
            C("float32", False, tb, "gc_tile<128, 64, 32, 64, 64, 6, 8, 0, 0, 0, 4>", 260, 300, 700, ep=True,
              tf32=True),
            C("float32", False, tb, "gc_tile<64, 128, 32, 64, 128, 6, 1, 0, 0, 0, 4>", 33, 20, 17, batch=3,
              sa=33 * 17 + 3, sb=20 * 17, sc=33 * 20 + 4, ep=True, tf32=True),
            C("float32", False, tb, "gc_tile<64, 64, 32, 64, 64, 6, 1, 0, 0, 0, 6>", 5, 7, 0, ep=True, tf32=True),
            C("float32", False, tb, "gc_tile<64, 64, 32, 64, 64, 6, 2, 0, 0, 0, 6>", 70, 40, 100, nans=True,
              tf32=True),
        ]
        for index in (True, False):
            out.append(C("float32", False, tb, "gc_tile<64, 128, 32, 64, 128, 6, 4, 1000, 256, 784, 4>", 1000, 256,
                         784, ep=True, tf32=True, rows="f32", index=index))
            # (the H100 b1000 tf32 record's x @ W1: 5 stages, so that a chain block fits beside it)
            out.append(C("float32", False, tb, "gc_tile<64, 64, 32, 64, 64, 6, 2, 1000, 256, 784, 5>", 1000, 256,
                         784, ep=True, tf32=True, rows="f32", index=index))
    out += [
        # batches with gaps and odd rows, A unaligned, K = 0, NaN operands (truncated to tf32, still NaN),
        # uint8 rows refused (cp.async copies floats only: the trainer converts them, GC_X_FLOAT)
        C("float32", False, True, "gc_tile<64, 64, 32, 64, 64, 2, 1, 0, 0, 0, 4>", 33, 20, 17, batch=3,
          sa=33 * 17 + 3, sb=20 * 17, sc=33 * 20 + 4, ep=True, tf32=True),
        C("float32", True, False, "gc_tile<64, 64, 32, 64, 64, 2, 1, 0, 0, 0, 4>", 130, 132, 36, shift=1, tf32=True),
        C("float32", False, False, "gc_tile<64, 64, 32, 64, 64, 2, 1, 0, 0, 0, 4>", 5, 7, 0, ep=True, tf32=True),
        C("float32", False, False, "gc_tile<64, 64, 32, 64, 64, 2, 1, 0, 0, 0, 4>", 70, 40, 100, nans=True, tf32=True),
        C("float32", True, True, "gc_tile<64, 64, 32, 64, 64, 2, 2, 0, 0, 0, 4>", 70, 40, 100, nans=True, tf32=True),
        C("float32", False, False, "gc_tile<64, 128, 32, 64, 128, 2, 4, 1000, 256, 784, 4>", 1000, 256, 784,
          tf32=True, rows="u8", expect_error="float rows only", cuda_only=True),
    ]
    # fp32 on tensor cores (TF32 = 3: each operand as two tf32 parts, gc_gemm_tc_kernel), held to the fp32
    # tolerances (tf32 not set): every transpose case, odd shapes (element copies), split-K with the epilogue and
    # on runs of 4 columns, eight warps, NaN operands; the MLP's batch-1000 x @ W1 and dW1 with A read in place
    # from uint8 rows (the bytes exact: two mma a product, the sums scaled) and from float rows, by index or not
    out += parts_cases("gc_tile<64, 64, 32, 32, 32, 3, 1, 0, 0, 0, 4>",
                       "gc_tile<64, 128, 32, 32, 32, 3, 2, 0, 0, 0, 3>",
                       "gc_tile<32, 32, 32, 16, 16, 3, 4, 112, 64, 1000, 4>",
                       "gc_tile<64, 32, 32, 32, 16, 3, 2, 0, 0, 0, 4>")
    for ta in (False, True):
        for rows in ("u8", "f32"):
            for index in (True, False):
                out.append(C("float32", ta, False, "gc_tile<64, 64, 32, 32, 32, 3, 4, 784, 256, 1000, 4>" if ta
                             else "gc_tile<64, 64, 64, 32, 32, 3, 2, 1000, 256, 784, 3>",
                             *((784, 256, 1000) if ta else (1000, 256, 784)), ep=not ta, rows=rows, index=index))
    # the same on wgmma (TF32 = 4, A^T B only): odd shapes (element copies), split-K with the epilogue and on
    # runs, NaN operands, batches with gaps and A unaligned, the MLP's dW1 from uint8 rows (exact bytes, two
    # wgmma a product) and float rows, by index or not
    out += [C("float32", True, False, "gc_tile<64, 64, 32, 64, 64, 4, 1, 0, 0, 0, 4>", 37, 53, 29, ep=True),
            C("float32", True, False, "gc_tile<64, 64, 32, 64, 64, 4, 2, 0, 0, 0, 4>", 100, 136, 300, ep=True),
            C("float32", True, False, "gc_tile<64, 64, 32, 64, 64, 4, 4, 112, 64, 1000, 4>", 112, 64, 1000,
              ep=True, runs=True),
            C("float32", True, False, "gc_tile<64, 64, 32, 64, 64, 4, 2, 0, 0, 0, 4>", 70, 40, 100, nans=True),
            C("float32", True, False, "gc_tile<64, 64, 32, 64, 64, 4, 1, 0, 0, 0, 4>", 33, 20, 17, batch=3,
              sa=33 * 17 + 3, sb=20 * 17, sc=33 * 20 + 4, ep=True),
            C("float32", True, False, "gc_tile<64, 64, 32, 64, 64, 4, 1, 0, 0, 0, 4>", 130, 132, 36, shift=1)]
    for rows in ("u8", "f32"):
        for index in (True, False):
            out.append(C("float32", True, False, "gc_tile<64, 64, 32, 64, 64, 4, 4, 784, 256, 1000, 4>",
                         784, 256, 1000, rows=rows, index=index))
    # fp32 on tensor cores for a short K slice staged whole (TF32 = 5, gc_gemm_sk.cuh), held to the fp32
    # tolerances: every transpose case, odd shapes (4-byte copies, tiles overhanging M and N), K past one round
    # of 128 (rounds), split-K with the epilogue (a cluster's sum) and on runs, 4 and 8 warps, NaN operands,
    # batches with gaps and A unaligned; the batch-128 MLP's dW1 and x @ W1 (the catalogue's tiles) with A read
    # in place from float rows, by index or not, exact tf32 values or not; uint8 rows refused (cp.async copies
    # floats only: the trainer converts them, GC_X_FLOAT)
    out += parts_cases("gc_tile<32, 64, 16, 16, 16, 5, 1, 0, 0, 0, 8>",
                       "gc_tile<32, 32, 16, 16, 16, 5, 2, 0, 0, 0, 8>",
                       "gc_tile<32, 64, 16, 16, 32, 5, 4, 112, 64, 1000, 8>",
                       "gc_tile<32, 64, 16, 16, 16, 5, 1, 0, 0, 0, 8>")
    out += [C("float32", True, False, "gc_tile<32, 64, 16, 16, 16, 5, 1, 0, 0, 0, 8>", 33, 20, 17, batch=3,
              sa=33 * 17 + 3, sb=20 * 17, sc=33 * 20 + 4, ep=True),
            C("float32", False, True, "gc_tile<32, 32, 16, 16, 16, 5, 1, 0, 0, 0, 8>", 130, 132, 36, shift=1),
            C("float32", False, False, "gc_tile<32, 64, 16, 16, 16, 5, 8, 128, 256, 784, 8>", 128, 256, 784,
              rows="u8", expect_error="float rows only", cuda_only=True)]
    for index in (True, False):   # (values k / 256 flagged exact: two mma a product)
        for exact in (False, True):
            out += [C("float32", True, False, "gc_tile<32, 64, 64, 16, 16, 5, 1, 784, 256, 128, 2>", 784, 256, 128,
                      rows="f32", index=index, exact=exact),
                    C("float32", False, False, "gc_tile<32, 64, 56, 16, 16, 5, 8, 128, 256, 784, 2>", 128, 256, 784,
                      ep=True, rows="f32", index=index, exact=exact)]
    # the same kernel in plain tf32 (TF32 = 7: one mma a product), held to tf32's tolerance: every transpose case,
    # odd shapes, K past a round, split-K with the epilogue and on runs, NaN operands, batches with gaps and A
    # unaligned; the batch-128 MLP's dW1 and x @ W1 on the catalogue's tiles with A read in place from float rows,
    # by index or not; uint8 rows refused
    out += parts_cases("gc_tile<32, 64, 16, 16, 16, 7, 1, 0, 0, 0, 8>",
                       "gc_tile<32, 32, 16, 16, 16, 7, 2, 0, 0, 0, 8>",
                       "gc_tile<32, 64, 16, 16, 32, 7, 4, 112, 64, 1000, 8>",
                       "gc_tile<32, 64, 16, 16, 16, 7, 1, 0, 0, 0, 8>", tf32=True)
    out += [C("float32", True, False, "gc_tile<32, 64, 16, 16, 16, 7, 1, 0, 0, 0, 8>", 33, 20, 17, batch=3,
              sa=33 * 17 + 3, sb=20 * 17, sc=33 * 20 + 4, ep=True, tf32=True),
            C("float32", False, True, "gc_tile<32, 32, 16, 16, 16, 7, 1, 0, 0, 0, 8>", 130, 132, 36, shift=1, tf32=True),
            C("float32", False, False, "gc_tile<32, 64, 16, 16, 16, 7, 8, 128, 256, 784, 8>", 128, 256, 784,
              rows="u8", expect_error="float rows only", cuda_only=True, tf32=True)]
    for index in (True, False):
        out += [C("float32", True, False, "gc_tile<32, 64, 64, 16, 16, 7, 1, 784, 256, 128, 2>", 784, 256, 128,
                  rows="f32", index=index, tf32=True),
                C("float32", False, False, "gc_tile<32, 64, 56, 16, 16, 7, 8, 128, 256, 784, 2>", 128, 256, 784,
                  ep=True, rows="f32", index=index, tf32=True)]
    for precision in ("fp32", "tf32"):   # the MLP's GEMMs as the trainer runs them: rows by index, float ones
        for m, n, k, ta in ((1000, 256, 784, False), (784, 256, 1000, True), (128, 256, 784, False),
                            (784, 256, 128, True)):   # for a pipelined fp32 or a wgmma tile (GC_X_FLOAT), else uint8
            tile = choose_tile(m, n, k, ta, False, precision, rows=True)
            floats = Tile.parse(tile)[0].float_rows_only
            out.append(C("float32", ta, False, tile, m, n, k, ep=not ta, tf32=precision == "tf32",
                         rows="f32" if floats else "u8"))
    for precision in ("fp32", "tf32"):   # the MLP's GEMMs with the tiles the heuristic gives them
        for m, n, k, ta, tb in mlp_gemms(128) + [(1000, 256, 784, False, False), (784, 256, 1000, True, False)]:
            out.append(C("float32", ta, tb, choose_tile(m, n, k, ta, tb, precision), m, n, k,
                         ep=not ta, tf32=precision == "tf32"))
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_gemm_matches_numpy(target, tmp_path):
    if target == "cuda" and not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    all_cases = [case for case in cases() if target == "cuda" or not case.cuda_only]
    exe = H.build(all_cases, target, tmp_path, parts=2 if target == "cpu" else 8)
    rng = np.random.default_rng(7)
    data = []
    for i, case in enumerate(all_cases):
        a, b, bias, c, files = H.operands(case, rng)
        for name, x in (("a", a), ("b", b), ("bias", bias), ("c", c), *files.items()):
            x.tofile(tmp_path / f"{name}{i}.bin")
        data.append((a, b, bias, c))
    proc = subprocess.run([str(exe), str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rcs = dict(re.findall(r"^case (\d+) rc (\d+)$", proc.stdout, re.M))
    for i, (case, (a, b, bias, c0)) in enumerate(zip(all_cases, data)):
        what = f"case {i}: {case}"
        if case.expect_error:
            assert rcs[str(i)] != "0" and case.expect_error in proc.stdout, what
            continue
        assert rcs[str(i)] == "0", f"{what}\n{proc.stdout}"
        got = np.fromfile(tmp_path / f"out{i}.bin", dtype=case.dtype)
        sc = case.strides()[2]
        written = np.zeros(got.size, bool)
        rel_errors = []
        for j, (want, scale) in enumerate(H.reference(case, a, b, bias)):
            block = got[j * sc:j * sc + case.m * case.n].reshape(case.m, case.n).astype(np.float64)
            written[j * sc:j * sc + case.m * case.n] = True
            bound = H.tolerance(case) * scale + 4 * np.finfo(case.dtype).eps * (np.abs(want) + 4 + j)
            # NaN (an unwritten output) is bad too, unless it is expected (NaN operands)
            bad = ~(np.abs(block - want) <= bound) & ~(np.isnan(want) & np.isnan(block))
            assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} outputs off, e.g. at {np.argwhere(bad)[0]}: "
                                   f"{block[bad][0]} vs {want[bad][0]} (bound {bound[bad][0]:.3g})")
            finite = np.isfinite(want)
            rel_errors.append(np.linalg.norm(block[finite] - want[finite]) / max(np.linalg.norm(want[finite]), 1e-30))
        assert np.isnan(got[~written]).all(), f"{what}: wrote outside C's matrices"
        # the documented norm-wise tolerance: fp32 1e-5, tf32 2e-3 (typically ~3e-4)
        assert max(rel_errors) <= (2e-3 if case.tf32 else 1e-5), f"{what}: relative error {max(rel_errors):.3g}"


def test_short_k_rules_take_the_small_batch_gemms_the_records_put_there():
    """short_k_choice: at b128 the MLP's x @ W1 (split, a K slice of one round) and dW1 (K the batch) on the
    tiles the H100's tuning records chose, under both precisions (fp32 on the tf32-parts form); nothing under
    fp32 below TC_PARTS_MIN multiply-adds (LeNet's 400 x 120 x 128 weight gradient: tf32 only), nothing past a
    factor SHORT_K_SPREAD from a block an SM or without a split whose slice is one round, nothing at b1000."""
    from gcompile.gemm_tiles import SHORT_K_SPREAD, TC_PARTS_MIN, sm_distance
    for precision, kind in (("fp32", 5), ("tf32", 7)):
        for (m, n, k, ta), (name, split) in (((128, 256, 784, False), ("32x64x56", 8)),
                                             ((784, 256, 128, True), ("32x64x64", 1))):
            tile, s = short_k_choice(m, n, k, ta, False, precision)
            assert (tile.name.split("/")[0], s, tile.tf32) == (name, split, kind)
            assert -(-k // s) <= tile.bk * tile.stages   # one round of k a split
        assert short_k_choice(1000, 256, 784, False, False, precision) is None
        assert short_k_choice(784, 256, 1000, True, False, precision) is None
        assert short_k_choice(128, 4096, 1024, False, False, precision) is None   # 2,048 blocks at best
        assert short_k_choice(128, 10, 4096, False, False, precision) is None     # no split of one round
        assert short_k_choice(784, 256, 128, True, False, precision, batch=2) is None
    assert 400 * 120 * 128 < TC_PARTS_MIN and short_k_choice(400, 120, 128, True, False, "fp32") is None
    tile, s = short_k_choice(400, 120, 128, True, False, "tf32")
    assert tile.tf32 == 7 and sm_distance(tile, s, 400, 120) < math.log(SHORT_K_SPREAD)


def test_tensor_core_rule_takes_the_larger_gemms_the_records_put_there():
    """tensor_core_choice: the b1000 MLP's x @ W1 reading the input in place on the records' tiles (tf32: the
    warp-specialized 64 x 64, 5 stages, split 2 — a block an SM; fp32: tf32 parts, 64 x 32 split 2 — two blocks an
    SM), fp32's dW1 on the 64 x 64 tf32-parts tile split 4; nothing for B transposed, x @ W not reading the input,
    the tf32 weight gradient, under TC_PARTS_MIN multiply-adds, the short-K rules' GEMMs, N under the tile's BN,
    a batch of GEMMs or large problems; choose_tile gives its choice, the short-K rules' first."""
    from gcompile.gemm_tiles import TC_PARTS_MIN, sm_distance
    cases = ((("tf32", 1000, 256, 784, False), ("64x64x32/64x64/wgmma-ws/cp5", 2)),
             (("fp32", 1000, 256, 784, False), ("64x32x32/32x16/3xtf32/cp4", 2)),
             (("fp32", 784, 256, 1000, True), ("64x64x32/32x32/3xtf32/cp4", 4)),
             (("fp32", 2000, 256, 784, False), ("64x32x32/32x16/3xtf32/cp4", 1)),
             (("tf32", 256, 256, 784, False), ("64x64x32/64x64/wgmma-ws/cp5", 8)))
    for (precision, m, n, k, ta), (name, split) in cases:
        tile, s = tensor_core_choice(m, n, k, ta, False, precision, rows=not ta)
        assert (tile.name, s) == (name, split), (precision, m, n, k)
        per_sm = 1 if precision == "tf32" else 2   # the split whose grid is nearest per_sm blocks an SM
        assert all(sm_distance(tile, s, m, n, per_sm=per_sm) <= sm_distance(tile, o, m, n, per_sm=per_sm)
                   for o in tile.splits())
        assert choose_tile(m, n, k, ta, False, precision, rows=not ta) == tile.c_type(s, m, n, k)
    for precision in ("fp32", "tf32"):
        assert tensor_core_choice(1000, 256, 784, False, True, precision, rows=True) is None      # B transposed
        assert tensor_core_choice(1000, 256, 784, False, False, precision) is None                # not the input
        assert tensor_core_choice(1000, 256, 784, False, False, precision, batch=2, rows=True) is None
        assert tensor_core_choice(128, 256, 784, False, False, precision, rows=True) is None      # short-K's
        assert tensor_core_choice(1000, 16, 2000, False, False, precision, rows=True) is None     # N < BN
        assert tensor_core_choice(1000, 256, 784, False, False, precision, "float64", True) is None
    assert tensor_core_choice(784, 256, 1000, True, False, "tf32") is None   # the sweep's wgmma tile
    assert tensor_core_choice(784, 256, 128, True, False, "fp32") is None    # K the short batch: short-K's
    assert 1000 * 10 * 784 < TC_PARTS_MIN and tensor_core_choice(1000, 10, 784, False, False, "fp32", rows=True) is None
    assert tensor_core_choice(2048, 2048, 2048, True, False, "fp32") is None and is_large(2048, 2048, 2048)


def test_choose_tile_fills_the_gpu_and_uses_big_tiles_for_big_problems():
    # large float fp32 problems get the pipelined tile, whatever the transposes; float64 and tf32 do not
    for ta, tb in ((False, False), (True, True)):
        assert choose_tile(4096, 4096, 4096, ta, tb, "fp32") == LARGE_TILE.c_type(1, 4096, 4096, 4096)
    assert choose_tile(1024, 2048, 1024, False, True, "fp32", batch=2) == LARGE_TILE.c_type(1, 1024, 2048, 1024)
    assert choose_tile(4096, 4096, 4096, False, False, "fp32", dtype="float64").startswith(
        "gc_tile<128, 128, 8, 8, 8, 0, 1, 4096, 4096, 4096>")
    # large tf32 problems get the tensor-core pipeline's large tile, except where A is read in place (the
    # trainer's register-staged kernel cannot hold it): the register-staged tf32 tile
    assert choose_tile(4096, 4096, 4096, False, False, "tf32") == TC_LARGE_TILE.c_type(1, 4096, 4096, 4096)
    assert choose_tile(4096, 4096, 4096, False, False, "tf32", rows=True).startswith("gc_tile<128, 128, 16, 64, 32, 1, 1,")
    assert not is_large(4096, 4096, 1000) and not is_large(1000, 4096, 4096) and not is_large(1024, 1024, 1024)
    for batch in (128, 1000):
        for m, n, k, ta, tb in mlp_gemms(batch):
            for precision in ("fp32", "tf32"):
                tile = choose_tile(m, n, k, ta, tb, precision)
                bm, bn, bk, tm, tn, tf32, split, sm, sn, sk = map(int, re.findall(r"\d+", tile)[:10])
                # tf32: 1 mma.sync, 2 wgmma, 7 short-K; fp32 on tensor cores only on a short-K tile's tf32 parts (5),
                # where short_k_choice puts the GEMM (at b128 x @ W1 and dW1), and on the mma.sync tf32-parts
                # tiles (3) where tensor_core_choice does (at b1000 the weight gradients dW1 and dW2; x @ W1 reads
                # the input in place in the step only, not here)
                short = short_k_choice(m, n, k, ta, tb, precision) is not None
                assert short == (batch == 128 and m * n * k > 2e7), (m, n, k, precision)
                ruled = tensor_core_choice(m, n, k, ta, tb, precision) is not None
                assert ruled == (batch == 1000 and precision == "fp32" and ta and m * n * k > 2e7), (m, n, k, precision)
                kinds = {5, 7} if short else {3} if ruled else {0} if precision == "fp32" else {1, 2}
                assert (sm, sn, sk) == (m, n, k) and tf32 in kinds
                assert (bm, bn, bk, tm, tn) != (LARGE_TILE.bm, LARGE_TILE.bn, LARGE_TILE.bk, LARGE_TILE.tm, LARGE_TILE.tn)
                blocks = -(-m // bm) * -(-n // bn) * split
                # small problems: enough blocks to spread over many SMs, unless the work is tiny
                assert blocks >= 32 or m * n * k < 2e6, (m, n, k, precision, bm, bn, split)


def test_calibration_is_consistent():
    """Every measured tile is a catalogue tile with a split it supports, choose_tile returns it for its
    shape (but for the GEMMs over a short batch that short_k_choice puts on a short-K tile and the larger fp32
    weight gradients that tensor_core_choice puts on tf32 parts), and every catalogue
    tile has the cost model's constants but the fp32 tensor-core (tf32 parts), the warp-specialized wgmma and
    the plain tf32 short-K ones (Tile.uncalibrated: tuning tries them, choose_tile's rules give some)."""
    data = calibration()
    assert data["measured"] and data["gpu"] and data["commit"]
    for e in data["measured"]:
        tile, split = tile_by_name(e["tile"]), e["split"]
        assert tile in TILES[e["precision"]] and split in tile.splits()
        if e["precision"] == "fp32" and is_large(e["m"], e["n"], e["k"]):
            tile, split = LARGE_TILE, 1   # the pipelined tile comes first
        if e["precision"] == "tf32" and is_large(e["m"], e["n"], e["k"]):
            tile, split = TC_LARGE_TILE, 1   # likewise the tensor-core pipeline's
        short = short_k_choice(e["m"], e["n"], e["k"], e["trans_a"], e["trans_b"], e["precision"], e["batch"])
        if short is not None:   # a weight gradient over a short batch, or x @ W over one with a longer K
            assert (e["trans_a"] and e["k"] <= SHORT_K_MAX) or (not e["trans_a"] and e["m"] <= SHORT_K_MAX < e["k"])
            assert short[0].tf32 == (7 if e["precision"] == "tf32" else 5)
            tile, split = short
        ruled = tensor_core_choice(e["m"], e["n"], e["k"], e["trans_a"], e["trans_b"], e["precision"], e["batch"])
        if short is None and ruled is not None:   # an fp32 weight gradient of the larger ones: tf32 parts
            assert e["precision"] == "fp32" and e["trans_a"] and ruled[0].tf32 == 3
            tile, split = ruled
        assert choose_tile(e["m"], e["n"], e["k"], e["trans_a"], e["trans_b"], e["precision"], e["batch"]) == \
            tile.c_type(split, e["m"], e["n"], e["k"])
    for tiles in TILES.values():
        for tile in tiles:
            if tile.uncalibrated:
                assert tile.name not in data["model"]["tiles"] and cost(tile, 1, 1000, 1000, 1000) == math.inf
                continue
            assert len(data["model"]["tiles"][tile.name]) == 2
            assert cost(tile, 1, 1000, 1000, 1000) > 0
    # tuning tries the tf32-parts tiles on the MLP's larger GEMMs (two splits each: x @ W1, dW1 and, at
    # batch 1000, dW2; the wgmma ones on the weight gradients A^T B only), not on the small ones, nor under tf32
    for m, n, k, ta, tries in ((1000, 256, 784, False, True), (784, 256, 1000, True, True),
                               (128, 256, 784, False, True), (256, 100, 1000, True, True),
                               (256, 100, 128, True, False), (128, 100, 256, False, False)):
        for kind in (3, 4):
            parts = [(t, s) for t, s in alternatives(m, n, k, ta, False, "fp32", rows=True) if t.tf32 == kind]
            expect = 2 * sum(t.tf32 == kind for t in TILES["fp32"]) if tries and (kind == 3 or ta) else 0
            assert len(parts) == expect, (m, n, k, kind)
            assert all(s in t.splits() for t, s in parts)
        assert not any(t.tf32 == 4 for t, _ in alternatives(m, n, k, ta, True, "fp32"))
    assert not any(t.parts for t, _ in alternatives(1000, 256, 784, False, False, "tf32"))
    # and the warp-specialized wgmma tiles under tf32, two splits each, on the large GEMMs with A not
    # transposed (x @ W1 at both batches), not on dW1 nor on the small ones
    ws = sum(t.tf32 == 6 for t in TILES["tf32"])
    for m, n, k, ta, expect in ((1000, 256, 784, False, 2 * ws), (128, 256, 784, False, 2 * ws),
                                (784, 256, 1000, True, 0), (128, 100, 256, False, 0)):
        tried = [(t, s) for t, s in alternatives(m, n, k, ta, False, "tf32", rows=not ta) if t.tf32 == 6]
        assert len(tried) == expect and all(s in t.splits() for t, s in tried), (m, n, k)
    with pytest.raises(GCompileError, match="A not transposed only"):
        tuned_tile("64x128x32/64x128/wgmma-ws/cp4", 4, 784, 256, 1000, "tf32", rows=True, trans_a=True)
    # a record's wgmma tf32-parts tile on a GEMM that is not A^T B is refused (the kernel computes that only)
    assert tuned_tile("64x64x32/64x64/3xwgmma/cp4", 4, 784, 256, 1000, "fp32", rows=True, trans_a=True)
    with pytest.raises(GCompileError, match="computes A\\^T B only"):
        tuned_tile("64x64x32/64x64/3xwgmma/cp4", 2, 1000, 256, 784, "fp32", rows=True)
    # a shape the sweep did not measure goes through the model, which ranks the register-staged tiles only
    _, tile, split = candidates(3000, 70, 200, "fp32", pipelined=False)[0]
    assert choose_tile(3000, 70, 200, False, True, "fp32") == tile.c_type(split, 3000, 70, 200)
    assert any(t.stages for _, t, _ in candidates(3000, 70, 200, "fp32"))   # the sweep times them all


def test_choose_tile_errors_and_candidates():
    with pytest.raises(GCompileError, match="precision"):
        choose_tile(8, 8, 8, False, False, "fp16")
    with pytest.raises(GCompileError, match="negative"):
        choose_tile(-1, 8, 8, False, False, "fp32")
    # every candidate is a catalogue tile with a split it supports, and splits keep two K steps each (a short-K
    # tile, which stages its slice at once, one group of bk)
    for c, tile, split in candidates(784, 256, 1000, "fp32"):
        steps = 1 if tile.tf32 == 5 else 2
        assert tile in TILES["fp32"] and split in tile.splits() and 1000 >= steps * split * tile.bk


def test_register_staged_tiles_count_their_row_indices():
    """A weight gradient reading the image input in place (A^T, K the batch) keeps a row index per k of its split
    in static shared memory beside the tile's buffers (gc_gemm_kernel, 48 KB in all): the 128 x 128 tf32 tile
    fits dW1 of a 2048-unit layer at batch 3584, not at 3585, where nvcc's static_assert stopped the build.
    choose_tile, the tuning alternatives and a record's tile go by the same count."""
    big = tile_by_name("128x128x16/64x32/tf32")
    assert rows_fit(big, 1, True, 3584, True) and not rows_fit(big, 1, True, 3585, True)
    assert rows_fit(big, 1, False, 3585, True)                                           # not read in place
    assert rows_fit(big, 1, True, 10**6, False)                                          # BM indices only
    for batch in (3584, 3585, 20000):
        tile, split = Tile.parse(choose_tile(784, 2048, batch, True, False, "tf32", rows=True))
        assert rows_fit(tile, split, True, batch, True)
        assert all(rows_fit(t, s, True, batch, True) for t, s in alternatives(784, 2048, batch, True, False, "tf32",
                                                                              rows=True))
    with pytest.raises(GCompileError, match="too large for the register-staged kernel"):
        tuned_tile(big.name, 1, 784, 2048, 3585, "tf32", rows=True, trans_a=True)
    with pytest.raises(GCompileError, match="needs 400000 row indices, more than any tile's block can hold"):
        choose_tile(784, 16, 400000, True, False, "fp32", rows=True)


def test_float64_gemms_get_tiles_whose_doubles_fit_in_shared_memory(tmp_path):
    """A register-staged tile's buffers hold the GEMM's elements: 64 x 64 x 32 split 4 fits 48 KB as floats,
    not as doubles (68 KB): nvcc's static_assert stopped a float64 MLP's build at batch 512 and 1000."""
    shapes = [(m, n, k, ta) for m in (100, 784, 1000) for n in (10, 100, 256) for k in (128, 512, 1000, 4096)
              for ta in (False, True)]
    for m, n, k, ta in shapes:
        tile, split = Tile.parse(choose_tile(m, n, k, ta, False, "fp32", dtype="float64"))
        assert not tile.stages and not tile.tf32 and tile.smem_bytes(split, 8) <= SMEM_LIMIT, (m, n, k, ta)
    assert TILES["fp32"][0].splits(8) and not [t for t in TILES["fp32"] if t.stages and t.splits(8)]
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    x, g = gc.placeholder("x", (512, 784), dtype="float64"), gc.placeholder("g", (512, 256), dtype="float64")
    artifact = gc.compile([gc.matmul(x, g, trans_a=True), gc.matmul(g, g, trans_a=True)], target="cuda",
                          out_dir=tmp_path, name="gemm64")
    assert open(artifact.library, "rb").read(4) == b"\x7fELF"


def k_order_product(a, b):
    """float32 op(a) @ op(b) as the cpu GEMM computes it: each output's double sum in k order, rounded once."""
    acc = np.zeros(a.shape[:-1] + b.shape[-1:])
    for k in range(a.shape[-1]):
        acc += a[..., :, k:k + 1].astype(np.float64) * b[..., k:k + 1, :].astype(np.float64)
    return acc.astype(np.float32)


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("a_shape, b_shape", [
    ((130, 600), (600, 300)),    # k blocks carried in double, two chunks of panels, partial tiles and panels
    ((7, 900), (900, 40)),       # few row tiles: the panels shared out, the rows packed once
    ((700, 300), (300, 3)),      # fewer columns than a panel: rows along N, the vectors along M
    ((1, 500), (500, 70)),       # a vector times a matrix
    ((3, 40, 300), (3, 300, 50)),  # a stack, each entry its own B
    ((3, 40, 300), (300, 50)),   # a stack sharing B
    ((64, 2, 5), (64, 5, 3)),    # small products: the plain loops
], ids=["blocks", "few-tiles", "swapped", "vector", "stacks", "shared-B", "small"])
def test_cpu_gemm_gives_the_bits_of_the_k_loop_whatever_its_blocking(trans_a, trans_b, a_shape, b_shape):
    """The cpu GEMM (runtime/gc_kernels_cpu.h) packs panels and tiles of its operands and carries sums between
    k blocks: every output must still be the double sum of its products in k order, rounded once — the same
    bits as the plain loop, whatever the shape's path (and so whatever the thread count)."""
    r = np.random.RandomState(4)
    av, bv = r.uniform(-1, 1, a_shape).astype(np.float32), r.uniform(-1, 1, b_shape).astype(np.float32)
    stored_a = np.ascontiguousarray(np.swapaxes(av, -1, -2)) if trans_a else av
    stored_b = np.ascontiguousarray(np.swapaxes(bv, -1, -2)) if trans_b else bv
    a, b = gc.placeholder("a", stored_a.shape), gc.placeholder("b", stored_b.shape)
    (got,) = gc.Executor([gc.matmul(a, b, trans_a=trans_a, trans_b=trans_b)], target="cpu").run(
        {a: stored_a, b: stored_b})
    want = k_order_product(av, bv)
    assert got.shape == want.shape and np.array_equal(got, want), \
        f"{int((got != want).sum())} of {want.size} outputs differ from the k-order sums"


def test_which_tiles_read_float_rows_only():
    """Rows read in place: the fp32 pipelined and the tf32 wgmma kernels copy them into shared memory as they
    lie (float only, GC_X_FLOAT); the register-staged kernel and the mma.sync pipeline convert uint8 ones, and
    the wgmma tf32-parts tile copies them as bytes (it reads them only as A^T, its register operand)."""
    only = {t.name: t.float_rows_only for kind in ("fp32", "tf32") for t in TILES[kind]}
    assert only["64x64x16/8x4/fp32/cp4"] and only["64x128x32/64x128/wgmma/cp4"]
    assert not only["64x64x16/8x4/fp32"] and not only["64x64x32/32x32/tf32/cp4"]
    assert not only["64x64x32/32x32/3xtf32/cp4"] and not only["64x64x32/64x64/3xwgmma/cp4"]
    assert not only["32x32x32/16x16/tf32"]
    assert only["64x128x32/64x128/wgmma-ws/cp4"]


def test_sweep_calibrates_on_the_gemms_as_the_step_runs_them():
    """The sweep times every candidate with the epilogue the step fuses into that GEMM, and the calibration
    takes the fastest of those (a GEMM with no epilogue: of the plain timings)."""
    from conftest import load_bench
    load_bench()
    from bench import gemm_bench as gb
    cases = gb.bench_cases(sweep=True)
    dh1 = [c for c in cases if c["name"] == "b1000 bwd  dh1 = g2 W2^T" and c["precision"] == "fp32"]
    assert {c["epilogue"] for c in dh1 if not c["chosen"]} == {"relu_mask"} and len(dh1) > 10
    assert {c["epilogue"] for c in cases if c["name"] == "b1000 bwd  dW1 = x^T g1"} == {"none"}
    pipe, plain = TILES["fp32"][10].c_type(1, 1000, 256, 100), TILES["fp32"][3].c_type(1, 1000, 256, 100)
    row = lambda tile, ep, us, name="dh1", k=100: dict(name=name, m=1000, n=256, k=k, ta=0, tb=1, precision="fp32",  # noqa: E731
                                                       epilogue=ep, tile=tile, own_us=us)
    # the plain pipelined tile is faster, the register-staged one is faster with the mask: the latter wins
    rows = [row(pipe, "none", 4.0), row(pipe, "relu_mask", 4.6), row(plain, "relu_mask", 4.5),
            row(pipe, "none", 9.0, "other", 300), row(plain, "none", 8.0, "other", 300)]
    best = {e["k"]: (e["tile"], e["us"]) for e in gb.calibrate({"gpu": "x", "commit": "y", "rows": rows})["measured"]}
    assert best == {100: (TILES["fp32"][3].name, 4.5), 300: (TILES["fp32"][3].name, 8.0)}


def test_tile_threads_match_the_runtime(tmp_path):
    """Tile.threads (the catalogue's block size, which the occupancy estimate uses) is gc_tile's THREADS, the
    block the kernels are launched with, for every catalogue tile (a host compile of static_asserts: the
    warp-specialized tiles' producer warpgroups are counted on both sides)."""
    compiler, flags, _ = compile_flags("cpu", None)
    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is not installed")
    tiles = [t for ts in TILES.values() for t in ts] + [LARGE_TILE, TC_LARGE_TILE]
    lines = ['#include "gc_runtime.h"', '#include "gc_gemm.h"']
    lines += [f'static_assert({t.c_type(1, 64, 64, 64)}::THREADS == {t.threads}, "{t.name}");' for t in tiles]
    src = tmp_path / "threads.cpp"
    src.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([compiler, *flags, "-fsyntax-only", "-I", str(package_dir("runtime")), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any(t.tf32 == 6 for t in tiles)


def test_every_tile_compiles_with_nvcc(tmp_path):
    """Compile-only: each catalogue tile, in all four transpose cases and with each split it supports, for a
    static shape that no tile divides (all bounds checks present), spills at most 16 bytes of registers
    (the 128 x 128 tf32 tile does, by 8 to 16 bytes, with every bounds check in; more would be slow), and no
    wgmma tile has its wgmma serialized by ptxas.
    Each tile also with an epilogue that reads an operand and says prefetch (the ReLU mask of dh1)."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    lines = ['#include "gc_runtime.h"', '#include "gc_gemm.h"', '#include "gc_gemm_cuda.cuh"',
             '#include "gc_gemm_tc.cuh"', '#include "gc_gemm_wgmma.cuh"', '#include "gc_gemm_sk.cuh"',
             '#include "gc_gemm_ws.cuh"',
             "struct ep_mask {",
             "    static constexpr bool prefetch = true;",
             "    const float* aux;",
             "    GC_HD float operator()(int, int m, int n, float acc) const { return aux[m * 999 + n] > 0.f ? acc : 0.f; }",
             "};",
             "int instantiate(const float* a, const float* b, float* c) {",
             "    const gc_rows rows = {a, nullptr, 1.f, 1};"]
    for precision, tiles in {**TILES, "large": [LARGE_TILE], "tc": [TC_LARGE_TILE]}.items():
        for tile in tiles:
            variants = [(ta, tb, 1, "gc_ep_store{}", "a") for ta in (False, True) for tb in (False, True)]
            variants += [(True, False, s, "gc_ep_store{}", "a") for s in tile.splits() if s > 1]
            variants += [(False, True, 1, "ep_mask{a}", "a"), (True, False, 1, "ep_mask{a}", "a")]
            if tile.tf32 and tile.stages and tile != TC_LARGE_TILE:   # the image input read in place, both layouts
                variants += [(False, False, 2, "ep_mask{a}", "rows"), (True, False, 4, "gc_ep_store{}", "rows")]
            for ta, tb, split, ep, a in (v for v in variants if tile.fits(v[0], v[1])):
                lines.append(f"    GC_TRY((gc_gemm<float, {str(ta).lower()}, {str(tb).lower()}, "
                             f"{tile.c_type(split, 1000, 999, 777)}>({a}, b, c, 1000, 999, 777, {ep})));")
    lines.append("    return GC_OK;\n}")
    src = tmp_path / "tiles.cu"
    src.write_text("\n".join(lines))
    compiler, flags, _ = compile_flags("cuda", "sm_90")
    proc = subprocess.run([compiler, *flags, "-Xptxas", "-v", "-I", str(package_dir("runtime")), "-c", str(src),
                           "-o", str(tmp_path / "tiles.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-6000:]
    # ptxas serializes every wgmma of a kernel where it finds registers of a wgmma's operands written while
    # an earlier wgmma is in flight: a silent slowdown of several times (gc_gemm_wgmma.cuh), so an error here
    assert "C7513" not in proc.stderr, [line for line in proc.stderr.splitlines() if "C7513" in line][:3]
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", proc.stderr)]
    assert len(spills) >= sum(len(t) for t in TILES.values()) * 4 and max(spills) <= 16, \
        [line for line in proc.stderr.splitlines() if "spill" in line and " 0 bytes spill stores" not in line]


def matmul_program():
    import gcompile as gc
    x = gc.placeholder("x", (40, 30))
    w = gc.variable("w", init=np.random.default_rng(1).normal(size=(30, 20)).astype(np.float32))
    return [gc.relu(x @ w)], x, w


def test_precision_is_a_compile_setting(tmp_path):
    """precision reaches the tiles (tf32 ones only with "tf32"), the manifest and the build fingerprint;
    the cpu target computes the same either way."""
    import json

    import gcompile as gc
    from gcompile.loader import load
    outputs, x, w = matmul_program()
    tf32_tile = re.compile(r"gc_tile<\d+, \d+, \d+, \d+, \d+, 1, ")
    results = {}
    for precision in ("fp32", "tf32"):
        artifact = gc.compile(outputs, target="cpu", out_dir=tmp_path / "m", name="m", precision=precision)
        assert not artifact.cached                      # same folder, other precision: rebuilt
        assert json.loads(open(artifact.manifest).read())["precision"] == precision
        assert bool(tf32_tile.search(open(artifact.source).read())) == (precision == "tf32")
        xv = np.random.default_rng(2).normal(size=(40, 30)).astype(np.float32)
        results[precision] = load(artifact).forward(xv)
    for a, b in zip(results["fp32"].values(), results["tf32"].values()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(GCompileError, match="precision"):
        gc.compile(outputs, target="cpu", out_dir=tmp_path / "bad", precision="bf16")
    with pytest.raises(GCompileError, match="precision"):
        gc.Executor(outputs, target="cpu", precision="fp16")


def test_cli_precision_flag(capsys):
    from gcompile.cli import main
    example = Path(__file__).resolve().parent.parent / "examples" / "mnist_logreg.py"
    assert main(["inspect", str(example), "--target", "cpu", "--precision", "tf32", "--after", "emit"]) == 0
    assert re.search(r"gc_tile<\d+, \d+, \d+, \d+, \d+, 1, ", capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main(["inspect", str(example), "--precision", "bf16"])


@pytest.mark.gpu
@pytest.mark.parametrize("model,batch", [("mnist_mlp", 1000), ("mnist_mlp", 128), ("mnist_logreg", 1000)])
def test_tf32_training_step_follows_fp32(tmp_path, model, batch):
    """The MLP's tf32 training step at batch 1000 (its GEMMs with their fused epilogues: bias + ReLU, the
    ReLU mask, split-K; its chain's on tensor cores) tracks the fp32 step: the same losses to the tf32
    tolerance over a few steps; so does it at batch 128 (dW1 and the post kernel's dW2 on the plain tf32
    short-K tiles), and logistic regression's (its chain, on tensor cores at 6e9c1d5 with W's 31 KB copy
    beside 33 KB of static shared memory, once failed to launch: its dynamic limit not raised)."""
    import gcompile as gc
    from conftest import load_example
    program = load_example(model).program(batch_size=batch, lr=0.1)
    losses = {}
    rng = np.random.default_rng(3)
    x = rng.random((batch, 784), dtype=np.float32)
    y = rng.integers(0, 10, batch).astype(np.int32)
    for precision in ("fp32", "tf32"):
        artifact = gc.compile(program, target="cuda", out_dir=tmp_path / precision, precision=precision)
        trainer = gc.load(artifact)
        losses[precision] = [trainer.train_step(x, y) for _ in range(5)]
    np.testing.assert_allclose(losses["tf32"], losses["fp32"], rtol=2e-3)
