"""lower: each scheduled kernel node becomes a kernel spec — a template macro name and plain values.

This is where the C is decided: index arithmetic for broadcasting, transposes and reductions becomes C
expressions, each fused group's members become C statements in the right place of its kernel (per slice,
per element, in which reduction phase), and launch shapes are chosen, so the templates only substitute.
Kinds:
- `matmul`: a (batched) GEMM through the runtime's gc_gemm, with the group's epilogue functor when it has one;
- `fused`: a kernel over one or more segments (a rows group, or each segment of a multi group);
- `chain`: row-local GEMMs and rows groups of the batch, block by block (chain.py); `post`: the small
  gradients over the batch and fused groups that follow a chain, side by side on their own blocks.
Views (reshape, group_output), leaves and scalar constants produce no kernel.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import GCompileError
from ..gemm_tiles import SMS, Tile, choose_tile, tuned_tile
from ..graph import FLOAT_DTYPES, Node
from ..ops import get_op
from .fuse import REDUCTIONS, Group, Layout, strides
from ..ops.conv import windows_of
from ..ops.matmul import inner_size
from ..ops.random import dropout_threshold
from .chain import own_row_reads, own_row_writes, rows_of
from .plan_memory import NO_KERNEL, gemm_of, is_literal, step_writes, storage_root

C_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "uint8": "uint8_t"}
BLOCK = 256                      # threads per block of every fused kernel (GC_BLOCK in the runtime)
# A chain's rows per block (chain_rows): the fewest (a power of two, at most CHAIN_MAX_ROWS) that make at most
# CHAIN_BLOCKS blocks. On an H100 the MLP's step (chain h2 -> logits -> softmax -> dh2 -> dh1): at batch 128
# 24.2 us with a row a block (128 blocks), 25.0 with 2; at batch 1000 62.2 with 8 rows (125 blocks), 59.2 with 4.
CHAIN_BLOCKS = 256
CHAIN_MAX_ROWS = 8
# A chain that takes CHAIN_MMA_MIN_ROWS rows a block or more runs its GEMM stages on tensor cores (chain_mma,
# gc_row_mma) at CHAIN_MMA_ROWS rows a block, its rows stages' element values in registers (ELEMENT_REGISTERS'
# transformation) (H100, the MLP's b1000 tf32 trainer: 33.20 us a step with the fp32 stages at 4 rows, 28.77 at
# 8 rows, 31.29 at 16; 28.91 -> 28.28 with the element values in registers; docs/compiler.md); under fp32 each
# operand as two tf32 parts and three products a k step (gc_row_mma's X3: the error stays at fp32's; the MLP's
# b1000 fp32 trainer ~38.6 -> ~36.3 us against the fp32 stages at 4 rows, docs/compiler.md)
CHAIN_MMA_MIN_ROWS = 4
CHAIN_MMA_ROWS = 8
PARTIALS_MAX = 1 << 20            # bytes of a split GEMM's partial tiles a chain may sum (fold_split_sums)
STAGED_MAX = 128 * 1024           # bytes of Bs a chain may copy into each block's shared memory (chain_staged)
# A chain's post GEMM (gc_col_gemm) computes POST_OUTPUTS // N rows of C a block (at least one): an output a
# lane at N <= 32; its warps' partial sums take at most POST_SMEM bytes of shared memory. H100, logistic
# regression b128 (dW 784 x 10 x 128), one run: 3 rows a block 7.27 us a step, 1 row 8.42, 6 rows 9.41.
POST_OUTPUTS = 32
# A post kernel's weight gradient of POST_SK_MIN multiply-adds or more (float32, M and N multiples of 4, A not the
# image input) runs on the short-K tensor-core tile (gc_gemm_sk_post: 8 warps of 16 x 8, the post kernel's 256
# threads; all of K up to 128 staged at once) instead of gc_col_gemm: the MLP's dW2 at batch 128 on 32 blocks
# instead of 256 (docs/compiler.md). Under precision tf32 its plain tf32 twin (TF32 = 7: one mma a product).
POST_SK_TILE = Tile(32, 32, 64, 16, 8, 5, stages=2)
POST_SK_TILES = {"fp32": POST_SK_TILE, "tf32": Tile(32, 32, 64, 16, 8, 7, stages=2)}
POST_SK_MIN = 1 << 20
POST_SMEM = 32768
VECTOR = 4                       # elements per vector access of a map kernel (16 bytes of float32)
# A segment whose block takes one slice a round (a chain's stage at a row a block) and whose thread takes that
# whole slice, of at most ELEMENT_REGISTERS elements, computes its element loop's values into registers first
# and stores them after (cuda): loads and divisions of the slice's elements then overlap, where stores between
# them kept them apart. Measured (docs/compiler.md): MLP b128 16.42 -> 16.21 us, but its b1000 chain (4 rows a
# block) 39.01 -> 39.31, so one slice a block only, or a tensor-core chain's (chain_mma: 8 rows a block, b1000
# tf32 28.91 -> 28.28).
ELEMENT_REGISTERS = 16
# A chain at a row a block runs a GEMM stage of N <= 32 columns and K <= WARP_STAGE_MAX_K, the rows stage that
# reads its C and a GEMM stage reading that stage's values as its A, as ONE warp's stage (Lowering.warp_stages:
# the MLP's logits -> softmax cross-entropy -> dh2), its rows in registers.
WARP_STAGE_MAX_K = 128
GEMM_COORDINATES = "bmn"                      # an epilogue's coordinates: batch, row, column


@dataclass
class Kernel:
    """One kernel: `kind` names the template macro; every other field is a plain value."""
    kind: str
    name: str                    # C identifier, unique in the program
    comment: str                 # what it implements, in one line
    values: dict = field(default_factory=dict)
    details: list = field(default_factory=list)   # the graph nodes it implements, with shapes (comment lines)
    group: str | None = None     # the fused group it computes (fuse.py), e.g. "g3"
    reads: list = field(default_factory=list)    # arena byte ranges [start, end) it reads
    writes: list = field(default_factory=list)   # and writes (streams.py orders kernels by them)
    fused: list = field(default_factory=list)    # other groups it computes (a chain's stages after the first)


def c_literal(value, dtype: str) -> str:
    if dtype in ("float32", "float64"):
        v = float(value)
        if np.isnan(v):
            return "NAN"
        if np.isinf(v):
            return "INFINITY" if v > 0 else "-INFINITY"
        text = repr(v)
        return text + "f" if dtype == "float32" else text
    return str(int(value))


def linear_index(var: str, shape, coefficients) -> str:
    """C expression for sum_d coord_d(var) * coefficients[d], coord_d taken from flat index `var` over `shape`.
    Unit dimensions and zero coefficients vanish; an identity mapping comes out as `var` itself."""
    if list(coefficients) == [0 if d == 1 else s for d, s in zip(shape, strides(shape))]:
        return var
    terms = []
    for d, (size, stride, coef) in enumerate(zip(shape, strides(shape), coefficients)):
        if size == 1 or coef == 0:
            continue
        coord = coordinate(var, shape, d)
        terms.append(f"({coord}) * {coef}" if coef != 1 else f"({coord})")
    return " + ".join(terms) or "0"


def coordinate(var: str, shape, d: int) -> str:
    """C expression of the d-th coordinate of flat index `var` over `shape`."""
    stride = strides(shape)[d]
    coord = var if d == 0 else f"({var} % {shape[d] * stride})"
    return f"{coord} / {stride}" if stride != 1 else coord


# A global reduction's blocks at most: each takes the ticket (an atomic on one word) and stores a partial the
# last one sums; beyond what the GPU holds at once (8 blocks of 256 threads on each of ~132 SMs) more blocks
# only queue on it. H200 (.device/globalcap.py, us): bench's 256 MB reduce 80.0 uncapped (8192 blocks), 77.2
# at 2048, 77.7 at 1024, 121 at 512; an MSE train step over (4096, 1024) 40.0, 37.3, 36.5, 43.4.
GLOBAL_BLOCKS = 2048


def blocks_for(n: int, per_block: int = BLOCK) -> int:
    """Blocks for n independent items; grid-stride loops cover what is left over."""
    return max(1, min((n + per_block - 1) // per_block, 8192))


def overlap(xs, ys) -> bool:
    """Whether two lists of byte ranges [start, end) share a byte."""
    return any(x0 < y1 and y0 < x1 for x0, x1 in xs for y0, y1 in ys)


def workspaces(values: dict) -> list[tuple[int, int]]:
    """The arena byte ranges of a kernel's segments' workspaces (lower's GroupCode.segment)."""
    return [r for s in values.get("segments", []) for r in s["workspace"]]


def index_type(nodes) -> str:
    """C type of a kernel's loop indices: `int` when every tensor it touches has fewer than 2^30 elements (the
    grid-stride loops then cannot overflow either), which keeps the index arithmetic's divisions 32-bit."""
    return "int" if max(n.size for n in nodes) < 2 ** 30 else "int64_t"


def prefetch_globals(segments: list, writes: list) -> None:
    """Each segment's `prefetch`: the pointers its global part reads that the kernel does not write (any of
    its segments or stages), which the last block may load into L1 before its ticket (gc_prefetch_l1)."""
    for s in segments:
        s["prefetch"] = [pointer for pointer, ranges in s.pop("global_reads") if not overlap(ranges, writes)]


ROW_MMA_STAGE_BYTES = 40960   # gc_row_mma_shape's shared-memory budget a stage (runtime/gc_kernels_cuda.cuh)


def row_mma_fits(matmul: Node) -> bool:
    """Whether gc_row_mma takes this GEMM stage within its budget even without splitting K across warps (the
    one-share form it falls back to unchecked): a block's CHAIN_MMA_ROWS rows of A in ROW_MMA_STAGE_BYTES (K
    over 1240 is past it), and at most 16 of the 16-column tiles a warp (N over ~2000). Past them the kernel's
    static shared memory went past what a block may have (ptxas refused it, or beside the staged Bs the first
    launch would have failed): such chains keep the fp32 stages."""
    k, n = inner_size(matmul.inputs[0], matmul.attrs["trans_a"]), matmul.shape[-1]
    a_rows = CHAIN_MMA_ROWS * (math.ceil(k / 8) * 8 + 4) * 4   # K padded to 8, plus 4 (gc_row_mma_shape::LDA)
    tiles = math.ceil(n / 16) + 1                               # (+1: a swizzled layout has at most one more)
    return a_rows + BLOCK * 4 <= ROW_MMA_STAGE_BYTES and math.ceil(tiles / (BLOCK // 32)) <= 16


def chain_rows(m: int, cap: int) -> int:
    """Rows per block of a chain of M rows: the fewest (a power of two, at most `cap`) that make at most
    CHAIN_BLOCKS blocks."""
    rows = 1
    while rows * 2 <= cap and -(-m // rows) > CHAIN_BLOCKS:
        rows *= 2
    return rows


def c_name(node: Node, index: int) -> str:
    return f"k{index}_{re.sub(r'[^0-9A-Za-z_]', '_', node.name)}"


def kernel_key(name: str) -> str:
    """The stable part of a kernel's name, `k<index>` (its place in the program): node ids, in the rest, depend
    on what else the process built before."""
    return name.split("_", 1)[0]


def describe(node: Node) -> str:
    """A kernel comment's line for a node it implements: its op, operands and shapes, and its phase (fwd, bwd,
    update: graph.phase)."""
    args = ", ".join(f"{i.name} {list(i.shape)}" for i in node.inputs)
    return f"{node.name} = {node.op}({args}) -> {list(node.shape)} {node.dtype}   {node.phase}"


def threads(layout: Layout) -> tuple[int, int]:
    """(slices per block, threads per slice) of a block of BLOCK threads, thread t = x + sx * y working on
    slice x of the block's slices and on elements y, y + sy, ... of the slice. Short slices: a thread each;
    long contiguous ones (reduced innermost axis): a warp or the whole block each; strided ones (the
    innermost axis kept): 8 neighbouring slices side by side — a warp reads a 32-byte sector of 4 rows —
    and 32 threads along each. Always sx * sy = BLOCK (the template relies on y = 0 when sy = 1)."""
    if layout.length <= 32:
        return BLOCK, 1
    if layout.domain and len(layout.domain) - 1 in layout.axes:
        return (1, BLOCK) if layout.length >= 1024 else (BLOCK // 32, 32)
    sx = min(8, 1 << max(0, (layout.slices - 1).bit_length()))
    return sx, BLOCK // sx


class Lowering:
    def __init__(self, plan, direction: str, precision: str = "fp32", tiles: dict | None = None,
                 target: str = "cuda"):
        self.plan = plan
        self.direction = direction
        self.precision = precision     # "fp32" or "tf32": the GEMMs' arithmetic (gemm_tiles.py)
        self.tiles = tiles or {}       # {kernel_key: (tile name, split[, record])}: tuned tiles
        self.target = target

    def pointer(self, node: Node, const=True) -> str:
        """C expression of a node's typed pointer into the arena `A`."""
        ctype = C_TYPES[node.dtype]
        return f"(({'const ' if const else ''}{ctype}*)(A + {self.plan.offset_of(node, self.direction)}))"

    def vector_aligned(self, node: Node) -> bool:
        """Whether node's buffer starts on a vector of VECTOR of its elements (16 bytes of float32)."""
        return self.plan.offset_of(node, self.direction) % (VECTOR * np.dtype(node.dtype).itemsize) == 0

    def operand(self, node: Node, index_expr: str) -> str:
        """C expression of one element of an input: scalar constants become literals."""
        root = storage_root(node)
        if is_literal(root):
            return c_literal(root.attrs["value"].reshape(-1)[0], node.dtype)
        return f"{self.pointer(node)}[{index_expr}]"

    def kernel(self, node: Node, index: int) -> Kernel | None:
        if node.op in NO_KERNEL:
            return None
        method = getattr(self, "lower_" + node.op, None)
        if method is None:
            raise GCompileError(f"lower: no kernel for op {node.op!r} (node {node.describe()})")
        self.name = c_name(node, index)
        kind, values = method(node)
        reads, writes = self.ranges(node.inputs), self.ranges(step_writes(node)) + workspaces(values)
        prefetch_globals(values.get("segments", []), writes)
        if node.op != "fused":
            return Kernel(kind, self.name, f"{self.direction}: {describe(node)}", values,
                          reads=reads, writes=writes)
        group = node.attrs["group"]
        return Kernel(kind, self.name, f"{self.direction}: {group.describe()} {group.kind}: "
                      f"{group.kernel_text()}", values, [describe(m) for m in group.members], group.describe(),
                      reads=reads, writes=writes)

    def ranges(self, nodes) -> list[tuple[int, int]]:
        """The arena byte ranges holding these nodes' values (views and assigns resolved; literals have none)."""
        out = set()
        for n in nodes:
            if not is_literal(storage_root(n)):
                b = self.plan.buffer_of(n, self.direction)
                out.add((b.offset, b.offset + b.size))
        return sorted(out)

    def read_in_place(self, node: Node) -> bool:
        """Whether node is the image input read in place (plan_memory.batch_rows): it has no values in the
        arena, and only gc_gemm's row loader (its A operand, gc_rows) can read it."""
        return not is_literal(storage_root(node)) and self.plan.buffer_of(node, self.direction).rows

    def chain(self, stages: list[Node], index: int) -> Kernel | None:
        """A chain (chain.py) as one kernel, or None: block b owns rows b * R .. b * R + R - 1 of every stage
        and runs the stages on them in order, a __syncthreads between two: a GEMM stage computes its rows of
        C (gc_row_gemm), a rows stage runs its segment on its rows; the global part of a rows stage (the
        batch-mean loss, the guard) runs at the kernel's end, in the last block to arrive. It qualifies when,
        on the arena's bytes, a stage reads what an earlier one wrote only at its own rows (values written at
        rows, chain.own_row_writes and own_row_reads: a block reads only the rows it computed), no stage
        writes bytes an earlier one reads, and no two stages write the same bytes; rows stages whose slices a
        block's threads take R at a time. A chain's GEMMs are computed in fp32 on the CUDA cores, under
        precision="tf32" too (a chain's B is small, no tensor-core tile would fill: on an H100 the MLP's tf32
        step at b128 was slower than its fp32 one without), except where the batch is large (chain_mma): then on
        tensor cores, 8 rows a block (under fp32, each operand as two tf32 parts).
        `stages`: the chain's row stages (chain.Chain.rows); its post stages are a kernel of their own (post)."""
        m = rows_of(stages[0])
        self.name = c_name(stages[-1], index)
        reads, own_reads, writes, own_writes = [], [], [], []
        for node in stages:
            own = own_row_reads(node)
            own_reads.append(self.ranges([x for x in node.inputs if x in own]))
            reads.append(self.ranges([x for x in node.inputs if x not in own]))
            writes.append(self.ranges(step_writes(node)))
            own_writes.append(self.ranges(own_row_writes(node)))
        for j in range(len(stages)):
            for i in range(j):
                links = [r for r in own_reads[j] if r in own_writes[i]]
                if overlap(writes[i], reads[j] + writes[j]) or overlap(writes[j], reads[i] + own_reads[i]) or \
                        overlap(writes[i], [r for r in own_reads[j] if r not in links]) or \
                        overlap([w for w in writes[i] if w not in links], links):
                    return None
        cap = BLOCK   # the rows stages' slices a block
        for node in stages:
            gemm = gemm_of(node)
            if gemm is not None:
                if any(self.read_in_place(x) for x in gemm[2:]):
                    return None
            else:
                cap = min(cap, threads(node.attrs["group"].layout)[0])
        rows = chain_rows(m, min(cap, CHAIN_MAX_ROWS))
        mma = self.chain_mma(stages, m, rows, cap)
        if mma:
            rows = mma
        blocks = -(-m // rows)
        if blocks > 8192:
            return None
        values, details, groups, what = [], [], [], []
        for i, node in enumerate(stages):
            if gemm_of(node) is not None:
                v = self.gemm_step(node)
                v["gemm"], v["mma"] = True, bool(mma)
                v["parts"] = bool(mma) and self.precision != "tf32"   # fp32 on tensor cores: tf32 parts
                what.append(f"GEMM {v['m']}x{v['n']} K {v['k']}" + (" (tensor cores, tf32 parts)" if v["parts"] else
                                                                   " (tensor cores)" if mma else ""))
            else:
                v = GroupCode(self, node.attrs["group"]).segment(f"{self.name}_s{i}", per=rows, split=True)
                v["gemm"] = False
                assert v["blocks"] == blocks
                what.append(f"{node.attrs['group'].kind} {m}x{node.attrs['group'].layout.domain[1]}")
            values.append(v)
            members = node.attrs["group"].members if node.op == "fused" else [node]
            details += [describe(x) for x in members]
            groups.append(node.attrs["group"].describe() if node.op == "fused" else node.name)
        written = [w for x in writes for w in x]   # every stage's byte ranges
        if self.target == "cuda" and rows == 1:
            for i, j in self.warp_stages(stages, values, written):
                what[i] += f" (stages {i + 1} to {j + 1} by one warp)"
        text = "; ".join(f"{g} {w}" for g, w in zip(groups, what))
        fused = [g for node, g in zip(stages, groups) if node.op == "fused"]
        prefetch_globals([v for v in values if not v["gemm"]], written)
        collector = any(not v["gemm"] and v["collect"] for v in values)
        if collector:
            text += "; global sums in a collector block"
        staged = self.chain_staged(stages, values, blocks + collector, written)
        if staged:
            text += f"; {', '.join(staged['names'])} copied into shared memory ({staged['tx']} bytes)"
            held = self.chain_registers(values) if rows == 1 else None
            if held:
                name = next(part["name"] for part in staged["parts"] if part["ptr"] == values[held[0]]["b"])
                text += f"; {name} held in registers by stages {held[0] + 1} and {held[1] + 1}"
        if self.target == "cuda" and (rows == 1 or mma):
            self.chain_ones(stages, values)
        return Kernel("chain", self.name, f"{self.direction}: chain of {len(stages)} stages, {rows} rows a block: "
                      f"{text}", {"stages": values, "rows": rows, "blocks": blocks, "m": m, "collector": collector,
                                  "rows_input": any(v.get("rows") for v in values), "staged": staged},
                      details, fused[0] if fused else None,
                      reads=sorted(set(r for x in reads + own_reads for r in x)),
                      writes=sorted(set(w for x in writes for w in x)) + workspaces({"segments": [
                          v for v in values if not v["gemm"]]}),
                      fused=fused[1:])

    def warp_stages(self, stages: list[Node], values: list[dict], writes) -> list[tuple[int, int]]:
        """cuda, a chain at a row a block: a GEMM stage of N <= 32 columns (B K x N, K <= WARP_STAGE_MAX_K,
        an epilogue that stores nothing of its own), the rows stage after it, which reads its C at the
        elements' own indices only, taken by one thread (a slice of N elements, one a block), and the GEMM
        stage after that if it reads one of the rows stage's element values as its A (K = N), become one
        stage run by the block's first warp, without a barrier or a memory round trip between them
        (gc_warp_row_head, gc_warp_row_gemm): its lanes split the first GEMM's K and add their sums by an xor
        tree, so every lane holds the row of C; every lane runs the rows stage on that row from registers
        (the same values, each stored by one lane; the partials by lane 0); lane l computes the last GEMM's
        columns l, l + 32, ... from those values. The three took about 5,500 cycles between barriers at
        batch 128, for 2,000 multiply-adds (docs/compiler.md). What the stage reads and the kernel does not
        write (`writes`: its byte ranges) is loaded at its start: the head's epilogue operands as packs of one
        column (chain_ones), the rows' slice-invariant reads (GroupCode.early_load). Marks the
        first stage's values `warp` {"rows": the rows stage's values, rebuilt to read C from registers, "last":
        its last stage}, the others `in_warp`, the last GEMM's `warp_a` (the element values it reads). Returns
        [(first, last)]."""
        out, i = [], 0
        while i + 1 < len(values):
            a, s = values[i], values[i + 1]
            if not (a["gemm"] and not s["gemm"] and not a["trans_b"] and not a["rows"] and a["batch"] == 1
                    and a["n"] <= 32 and a["k"] <= WARP_STAGE_MAX_K and a["ctype"] == "float"
                    and not (a["epilogue"] or {}).get("stores") and s["per"] == 1 and s["sy"] == 1
                    and s["length"] == a["n"] and not s["vector"] and s["element_loop"]):
                i += 1
                continue
            code = GroupCode(self, stages[i + 1].attrs["group"])
            rows = code.segment(f"{self.name}_s{i + 1}", per=1, split=True, registers={a["c_at"]: "hc"},
                                early=writes)
            if code.register_misses or not code.register_reads or not rows["element_values"]:
                i += 1
                continue
            rows["gemm"], rows["in_warp"] = False, True
            values[i + 1], last = rows, i + 1
            b = values[i + 2] if i + 2 < len(values) else None
            e = next((e for e in rows["element_values"] if b and b["gemm"] and e["at"] == b["a_at"]), None)
            if e is not None and e["ctype"] == "float" and b["ctype"] == "float" and not b["rows"] and \
                    b["batch"] == 1 and b["k"] == rows["length"] and not (b["epilogue"] or {}).get("stores"):
                b["in_warp"], b["warp_a"], last = True, e["name"], i + 2
            a["warp"] = {"rows": rows, "last": last}
            out.append((i, last))
            i = last + 1
        return out

    def chain_ones(self, stages: list[Node], values: list[dict]) -> None:
        """cuda, a chain at a row a block: a warp stage's head (gc_warp_row_head) and the stage that loads a held
        B (gc_reg_row_gemm) get their epilogue also as packs of one column (GroupCode.epilogue_ones; the
        functor's `ones`), which they load when they start, instead of the functor loading its operands after
        the sums (and, in gc_reg_row_gemm, behind two barriers). The stage starts after the barrier that ends
        the earlier stages and writes nothing before its epilogue, so the loads read what the functor's did.
        An epilogue that stores values of its own (LeNet's dropout mask) keeps its functor: epilogue_ones refuses it.
        (The same for the warp stage's last GEMM and the held B's second stage measured no faster.)"""
        for node, v in zip(stages, values):
            if v["gemm"] and v["epilogue"] and node.op == "fused" and (v.get("warp") or v.get("regs") is not None
                                                                       or v.get("mma")):
                ones = GroupCode(self, node.attrs["group"]).epilogue_ones()
                if ones:
                    v["epilogue"] = {**v["epilogue"], "ones": ones}

    def chain_registers(self, values: list[dict]) -> tuple[int, int] | None:
        """cuda, a chain at a row a block with its Bs staged: a staged B (K x N, N a multiple of 4 up to 128, K up
        to 8 x 32) that a GEMM stage reads as B and a later stage as B^T (the MLP's W2: h2 = h1 W2, dh1 = dh2
        W2^T) is read from shared memory once, by the first, into registers the block keeps for the second
        (gc_reg_row_gemm, gc_reg_row_gemm_t): warp w, lane l hold B's rows w KW .. (KW = K / 8) at columns
        4 l .. 4 l + 3. Each of the two stages read the whole B for one row (100 KB in the MLP: about 800 cycles
        of the SM's shared-memory bandwidth a stage); the second now sums its lanes' dot products with a
        reduce-scatter. The first sums in gc_row_gemm's order (8 K groups of KW rows); the second in another.
        Marks the first `regs` (the second's index), the second `regs_of` (the first's); returns the two
        indices, or None."""
        for i, p in enumerate(values):
            if not (p["gemm"] and not p["trans_b"] and p.get("b_staged") is not None and p["ctype"] == "float"
                    and p["batch"] == 1 and p["n"] % 4 == 0 and p["n"] <= 128 and p["k"] <= (BLOCK // 32) * 32
                    and not p.get("warp") and not p.get("in_warp")):
                continue
            for j in range(i + 1, len(values)):
                q = values[j]
                if q["gemm"] and q["trans_b"] and q.get("b_staged") == p["b_staged"] and q["b"] == p["b"] and \
                        (q["n"], q["k"]) == (p["k"], p["n"]) and not q["rows"] and q["batch"] == 1 and \
                        not q.get("warp") and not q.get("in_warp"):
                    p["regs"], q["regs_of"] = j, i
                    return i, j
        return None

    def chain_mma(self, stages: list[Node], m: int, rows: int, cap: int) -> int:
        """cuda: the rows a block (CHAIN_MMA_ROWS) where the chain's GEMM stages run on tensor cores (gc_row_mma,
        every GEMM stage float32 and 2-D; under fp32 as tf32 parts, X3), or 0: only where the chain would take
        CHAIN_MMA_MIN_ROWS rows a block or more (a large batch: the MLP's b1000; at a row a block, b128, the
        fp32 warp stages are faster), its blocks and the collector fit the SMs at CHAIN_MMA_ROWS (so its Bs
        are staged, chain_staged: gc_row_mma's 16 rows, measured slower at b1000, are not used past that,
        nor are they tested on a GPU), its rows stages take that many rows a block, and not where a stage's
        A is the image input read in place (logistic regression's x @ W: its trainer's step, H100 bench,
        16.5 us a step with the fp32 stages, 24.2 on tensor cores, each A element loaded through its row's
        index; the library step, from its input buffer, 13.58 -> 11.78)."""
        if self.target != "cuda" or rows < CHAIN_MMA_MIN_ROWS:
            return 0
        if any(gemm_of(node) is not None and (gemm_of(node)[0].dtype != "float32" or gemm_of(node)[0].ndim != 2
                                              or self.read_in_place(gemm_of(node)[1])
                                              or not row_mma_fits(gemm_of(node)[0])) for node in stages):
            return 0
        return CHAIN_MMA_ROWS if -(-m // CHAIN_MMA_ROWS) + 1 <= SMS and CHAIN_MMA_ROWS <= cap else 0

    def chain_staged(self, stages: list[Node], values: list[dict], grid: int, writes) -> dict | None:
        """On cuda, the B operands of a chain's GEMM stages copied once into each block's shared memory by the TMA
        unit when the block starts (gc_stage_copy), the stages reading them there instead of from L1 / L2 at
        every k (the loads those stages wait on; each block reads every B whole); or None. The Bs that qualify:
        float32 arrays of the arena that no stage writes, 16-byte aligned and sized, at most STAGED_MAX bytes in
        all (the MLP's W2 and W3; in shared memory one after another, each at a multiple of 128 bytes), and only
        where the grid has a block an SM at most (a block's copy takes shared memory that other blocks of the SM
        would need). Marks each reader's values `b_staged` (its B's offset in the copy); {"parts": [{"ptr",
        "at", "bytes", "span": its arena bytes}], "bytes": the buffer's size, "tx": the bytes copied, "first":
        the first reader's stage, "names"} (and "early", streams.early_copies)."""
        if self.target != "cuda" or grid > SMS:
            return None
        parts, readers = {}, {}   # B's id: its part; the stages reading it
        for i, (node, v) in enumerate(zip(stages, values)):
            if not v["gemm"]:
                continue
            b = gemm_of(node)[2]
            if id(b) not in parts:
                if b.dtype != "float32" or is_literal(storage_root(b)) or self.read_in_place(b):
                    continue
                at, size = self.plan.offset_of(b, self.direction), b.size * 4
                if at % 16 or size % 16 or overlap([(at, at + size)], writes):
                    continue
                parts[id(b)] = {"ptr": self.pointer(b), "bytes": size, "name": b.name, "span": (at, at + size)}
            readers.setdefault(id(b), []).append(i)
        at = 0
        for part in parts.values():
            part["at"], at = at, at + -(-part["bytes"] // 128) * 128
        if not parts or at > STAGED_MAX:
            return None
        for key, ix in readers.items():
            for i in ix:
                values[i]["b_staged"] = parts[key]["at"]
        return {"parts": list(parts.values()), "bytes": at, "tx": sum(p["bytes"] for p in parts.values()),
                "first": min(i for ix in readers.values() for i in ix), "names": [p["name"] for p in parts.values()]}

    def post(self, after: list[Node], index: int, chain: Kernel) -> Kernel | None:
        """A chain's post stages (chain.post_stages) as one kernel launched right after the chain's, or None
        where they do not qualify (they then stay kernels of their own). Each runs on its own range of blocks:
        a GEMM C = ep(A^T B) through gc_col_gemm (B the batch's rows the chain wrote, A perhaps the image
        input read in place) on blocks of POST_OUTPUTS // N rows of C, or on POST_SK_TILES' tiles where
        post_short_k says so, a fused group's segments on as many blocks as each needs. On the arena's bytes no post stage may write what another reads or writes, nor
        what the chain writes."""
        self.name = c_name(after[-1], index)
        rd = [self.ranges(n.inputs) for n in after]
        wr = [self.ranges(step_writes(n)) for n in after]
        for j in range(len(after)):
            if overlap(wr[j], chain.writes):
                return None
            for i in range(j):
                if overlap(wr[i], rd[j] + wr[j]) or overlap(wr[j], rd[i]):
                    return None
        stages, gemms, segments, details, groups, what, first, sk_smem = [], [], [], [], [], [], 0, 0
        for i, node in enumerate(after):
            if gemm_of(node) is not None:
                v = self.gemm_step(node)
                v["gemm"] = True
                if self.post_short_k(v):
                    sk = POST_SK_TILES[self.precision]
                    v["sk"] = sk.c_type(1, v["m"], v["n"], v["k"])
                    v["blocks"] = sk.blocks(1, v["m"], v["n"])
                    sk_smem, on = max(sk_smem, sk.smem_bytes()), f" of {sk.name}"
                else:
                    v["rows_c"] = max(1, POST_OUTPUTS // v["n"])
                    v["blocks"], on = -(-v["m"] // v["rows_c"]), ""
                    v["col_bytes"] = BLOCK // 32 * v["rows_c"] * v["n"] * 4
                    if v["col_bytes"] > POST_SMEM:   # gc_col_gemm_shape::bytes (float)
                        return None
                    gemms.append(v)
                v["first"] = first
                first += v["blocks"]
                what.append(f"GEMM {v['m']}x{v['n']} K {v['k']} (A^T B) on {v['blocks']} blocks{on}")
            else:
                group = node.attrs["group"]
                v = {"gemm": False, "segments": self.segments(group, f"{self.name}_s{i}_", first)}
                first = v["segments"][-1]["end"]
                segments += v["segments"]
                what.append(f"{group.kind} on {sum(s['blocks'] for s in v['segments'])} blocks")
            stages.append(v)
            details += [describe(x) for x in (node.attrs["group"].members if node.op == "fused" else [node])]
            groups.append(node.attrs["group"].describe() if node.op == "fused" else node.name)
        if first > 8192:
            return None
        # the short-K stages' staging (dynamic), the reductions' scratch and gc_col_gemm's partials (static)
        if sk_smem and sk_smem + 8 * BLOCK + max([g["col_bytes"] for g in gemms] + [16]) > 48 * 1024:
            return None
        writes = sorted(set(w for x in wr for w in x))
        prefetch_globals(segments, writes)
        fused = [g for node, g in zip(after, groups) if node.op == "fused"]
        text = "; ".join(f"{g} {w}" for g, w in zip(groups, what))
        return Kernel("post", self.name, f"{self.direction}: after chain {kernel_key(chain.name)}, {len(after)} "
                      f"stages: {text}", {"stages": stages, "gemms": gemms, "blocks": first,
                                          "rows_input": any(v["rows"] for v in gemms), "next": None,
                                          "sk_smem": sk_smem},
                      details, fused[0] if fused else None, reads=sorted(set(r for x in rd for r in x)),
                      writes=writes + workspaces({"segments": segments}), fused=fused[1:])

    def post_short_k(self, v: dict) -> bool:
        """Whether a post kernel's GEMM stage runs on POST_SK_TILES' tile (above): cuda, float32, C = A^T B with M
        and N multiples of 4 (16-byte copies) and A not the image input, at least POST_SK_MIN multiply-adds (post()
        checks that the kernel's shared memory stays under the 48 KB a block gets unasked)."""
        return (self.target == "cuda" and BLOCK == POST_SK_TILES[self.precision].threads and v["ctype"] == "float"
                and v["trans_a"] and not v["trans_b"] and not v["rows"] and v["batch"] == 1
                and v["m"] % 4 == 0 and v["n"] % 4 == 0 and v["m"] * v["n"] * v["k"] >= POST_SK_MIN)

    def lower_matmul(self, node: Node):
        return "matmul", self.gemm_step(node)

    def gemm_step(self, node: Node) -> dict:
        """The gemm values of a GEMM step: a gemm group, C through its epilogue, or a plain matmul."""
        matmul, a, b = gemm_of(node)
        if node.op == "matmul":
            return self.gemm(matmul, (a, b), node, None)
        code = GroupCode(self, node.attrs["group"])
        epilogue, stored = code.epilogue()
        return self.gemm(matmul, (a, b), code.target(stored), epilogue)

    def gemm(self, node: Node, operands, c: Node, epilogue: dict | None) -> dict:
        """The gemm values; `c`: the node whose buffer C is. a_at / c_at: A's and C's arena offsets (A's None
        where it is the image input read in place)."""
        a, b = operands
        m, n = node.shape[-2:]
        ta, tb = node.attrs["trans_a"], node.attrs["trans_b"]
        k = inner_size(a, ta)
        batch = node.shape[0] if node.ndim == 3 else 1
        if max(m, n, k, batch) >= 2**31:   # (the C++ build failed on a narrowing conversion)
            raise GCompileError(f"lower: {node.describe()} is a GEMM of batch {batch}, M {m}, N {n}, K {k}: each "
                                f"must be below 2^31 (gc_gemm's sizes and gc_tile's are int)")
        # a stack's matrices follow each other; a shared matrix (2-D, or a stack of one) has stride 0
        sa, sb = ((x.shape[-2] * x.shape[-1] if x.ndim == 3 and x.shape[0] > 1 else 0) for x in (a, b))
        # rows: A is the image input read in place, the steps' batch input (gc_rows)
        rows = self.read_in_place(a)
        tile = self.tile(m, n, k, ta, tb, node.dtype, batch, rows)
        split = Tile.parse(tile)[1]
        if self.target == "cuda" and batch * split > 65535:   # (gc_gemm_launch refused it at every step)
            ways = f", each split {split} ways" if split > 1 else ""
            raise GCompileError(f"lower: {node.describe()} is a batch of {batch} GEMMs{ways}: the cuda target launches "
                                f"at most 65535 blocks along a grid's z; use a smaller batch size, or the cpu target")
        return {"a": "*gc_batch_input()" if rows else self.pointer(a), "rows": rows, "b": self.pointer(b),
                "b_at": self.plan.offset_of(b, self.direction),
                "c": self.pointer(c, const=False), "m": m, "n": n, "k": k,
                "a_at": None if rows else self.plan.offset_of(a, self.direction),
                "c_at": self.plan.offset_of(c, self.direction),
                "trans_a": int(ta), "trans_b": int(tb), "ctype": C_TYPES[node.dtype],
                "tile": tile, "batch": batch, "sa": sa, "sb": sb, "sc": m * n,
                "epilogue": epilogue}

    def tile(self, m, n, k, ta, tb, dtype, batch, rows) -> str:
        precision = self.precision if dtype == "float32" else "fp32"
        key = kernel_key(self.name)
        if key in self.tiles:
            name, split, *source = self.tiles[key]   # (a record's tiles name the record: tune.record_tiles)
            try:
                return tuned_tile(name, split, m, n, k, precision, batch, dtype, rows, ta, tb)
            except GCompileError as e:
                raise GCompileError(f"{source[0] + ': ' if source else ''}lower: kernel {self.name} "
                                    f"({m}x{n}x{k}): {e}") from None
        return choose_tile(m, n, k, ta, tb, precision, batch, dtype, rows)

    def lower_fused(self, node: Node):
        group: Group = node.attrs["group"]
        if group.kind == "gemm":
            return "matmul", self.gemm_step(node)
        segments = self.segments(group, f"{self.name}_s")
        return "fused", {"segments": segments, "blocks": segments[-1]["end"]}

    def segments(self, group: Group, prefix: str, first: int = 0) -> list[dict]:
        """A fused group's segments (each part of a multi group, or the group), named prefix0, prefix1, ...
        (`fn`), each on its own range of blocks [first, end) from `first` on."""
        out = []
        for i, part in enumerate(group.segments or [group]):
            body = GroupCode(self, part).segment(f"{prefix}{i}")
            body["fn"], body["first"], body["end"] = f"{prefix}{i}", first, first + body["blocks"]
            first = body["end"]
            out.append(body)
        return out

    # --- convolutional networks: one gather per output element (runtime/gc_kernels_conv.h) ------------
    # These ops are not elementwise (each output element gathers a window), so fuse leaves them alone and
    # each becomes a `map` kernel: out[i] = expr(i).
    def map_kernel(self, node: Node, expr: str):
        return "map", {"out": self.pointer(node, const=False), "n": node.size, "expr": expr,
                       "blocks": blocks_for(node.size), "index": index_type((node, *node.inputs))}

    def window(self, node: Node, image_shape) -> str:
        """The gc_window literal of a window op over images of `image_shape` (N, C, H, W)."""
        n, c, h, w = image_shape
        (kh, kw), s, p = node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"]
        oh, ow = windows_of(h, kh, s, p), windows_of(w, kw, s, p)
        return f"gc_window{{{n}, {c}, {h}, {w}, {kh}, {kw}, {oh}, {ow}, {s}, {p}}}"

    def lower_im2col(self, node: Node):
        (x,) = node.inputs
        ctype = C_TYPES[node.dtype]
        return self.map_kernel(node, f"gc_im2col_at<{ctype}>({self.pointer(x)}, {self.window(node, x.shape)}, i)")

    def lower_col2im(self, node: Node):
        (cols,) = node.inputs
        ctype = C_TYPES[node.dtype]
        return self.map_kernel(node, f"gc_col2im_at<{ctype}>({self.pointer(cols)}, "
                                     f"{self.window(node, node.shape)}, i)")

    def pool(self, node: Node, is_max: bool):
        (x,) = node.inputs
        ctype = C_TYPES[node.dtype]
        return self.map_kernel(node, f"gc_pool_at<{ctype}, {str(is_max).lower()}>({self.pointer(x)}, "
                                     f"{self.window(node, x.shape)}, i)")

    def lower_max_pool2d(self, node):
        return self.pool(node, True)

    def lower_avg_pool2d(self, node):
        return self.pool(node, False)

    def lower_max_pool2d_grad(self, node: Node):
        x, g = node.inputs
        ctype = C_TYPES[node.dtype]
        return self.map_kernel(node, f"gc_pool_grad_at<{ctype}, true>({self.pointer(x)}, {self.pointer(g)}, "
                                     f"{self.window(node, x.shape)}, i)")

    def lower_max_pool2d_select(self, node: Node):
        x, h = node.inputs
        ctype = C_TYPES[node.dtype]
        return self.map_kernel(node, f"gc_pool_select_at<{ctype}>({self.pointer(x)}, {self.pointer(h)}, "
                                     f"{self.window(node, x.shape)}, i)")

    def lower_avg_pool2d_grad(self, node: Node):
        (g,) = node.inputs
        ctype = C_TYPES[node.dtype]
        return self.map_kernel(node, f"gc_pool_grad_at<{ctype}, false>(({ctype}*)0, {self.pointer(g)}, "
                                     f"{self.window(node, node.shape)}, i)")

    def lower_dropout_mask(self, node: Node):
        (step,) = node.inputs
        rate, seed = node.attrs["rate"], node.attrs["seed"]
        keep = c_literal(1.0 / (1.0 - rate), node.dtype)  # the literal rounds as numpy's dtype.type() does
        return self.map_kernel(node, f"gc_dropout_mask_at<{C_TYPES[node.dtype]}>(i, {self.operand(step, '0')}, "
                                     f"{seed}ull, {dropout_threshold(rate)}u, {keep})")


def accumulator_type(red: Node) -> str:
    """The C type a reduction accumulates in (where the targets' own choice does not apply: the cpu sums floats
    in double, declare's acc_ctype): a maximum in its value's type, an integer mean in int64 (numpy's sums in
    float64, exact here), an int32 sum in uint32 (it wraps as numpy's int32 result does, without signed
    overflow, undefined in C++), else the value's type."""
    if red.dtype in ("float32", "float64") or red.op == "reduce_max":
        return C_TYPES[red.dtype]
    if red.op == "reduce_mean":
        return "int64_t"
    return "uint32_t" if red.dtype == "int32" else C_TYPES[red.dtype]


class GroupCode:
    """The C statements of one group: every member a local `v<k>` computed in its context — once per slice
    (`o` is the slice; in a GEMM's epilogue the coordinates `b`, `m`, `n`), per element of the slice (`i`
    is the element's flat index in the domain, `r` its index within the slice) or once after all slices."""

    def __init__(self, lowering: Lowering, group: Group):
        self.lowering, self.group, self.layout = lowering, group, group.layout
        self.members = group.members
        self.inside = set(self.members)
        self.var = {m: f"v{k}" for k, m in enumerate(self.members)}
        self.accumulators = {}        # (combine, input) -> accumulator name: identical reductions share one
        self.vectors = None           # while the vector loop is written: {"load"|"store": {node: array name}}
        self.packed = None            # while an epilogue's runs are written: {(node, index): pack field}
        self.registers = {}           # a warp stage's rows: {arena offset: array} read at the element's own index
        self.early = None             # a warp stage's rows: {"writes", "vars", "stmts"}, its early loads (read)
        self.register_reads = 0       # reads of them there
        self.register_misses = 0      # and anywhere else (the rows do not qualify)

    # --- expressions ----------------------------------------------------------------------------
    def index(self, coef, context: str) -> str:
        lay = self.layout
        if context == "element":
            return linear_index("i", lay.domain, coef)
        if context == "gemm":
            terms = [f"(int64_t){v} * {c}" if c != 1 else f"(int64_t){v}"
                     for v, c in zip(GEMM_COORDINATES[-len(coef):], coef) if c]
            return " + ".join(terms) or "0"
        if context == "slice":
            return linear_index("o", lay.kept_shape, [coef[d] for d in lay.kept])
        return "0"

    def guard(self, coef, context: str) -> str:
        """Condition under which this thread writes a value smaller than the domain: it is at coordinate 0 of
        every axis the value is broadcast along."""
        lay = self.layout
        if context == "element":
            axes, shape, var = range(len(lay.domain)), lay.domain, "i"
        elif context in ("slice", "gemm"):
            axes, shape, var = range(len(lay.kept)), lay.kept_shape, "o"
            coef = [coef[d] for d in lay.kept]
        else:
            return ""
        zero = [d for d in axes if shape[d] > 1 and coef[d] == 0]
        if context == "gemm":
            return " && ".join(f"{GEMM_COORDINATES[-len(shape):][d]} == 0" for d in zero)
        return " && ".join(f"{coordinate(var, shape, d)} == 0" for d in zero)

    def read(self, m: Node, k: int, context: str) -> str:
        x = m.inputs[k]
        if x in self.inside:
            return self.var[x]
        coef = self.layout.operand_coef(m, k)
        index = self.index(coef, context)
        node = self.group.external[x]
        if self.packed is not None and not is_literal(storage_root(node)):
            return self.pack_field(node, coef, index)
        if self.registers and not is_literal(storage_root(node)):
            array = self.registers.get(self.lowering.plan.offset_of(node, self.lowering.direction))
            if array is not None:
                if context == "element" and index == "i":
                    self.register_reads += 1
                    return f"{array}[r]"
                self.register_misses += 1
        if self.early is not None and context in ("element", "slice"):
            name = self.early_load(node, coef)
            if name is not None:
                return name
        return self.lane(node, index, "load") or self.lowering.operand(node, index)

    def early_load(self, node: Node, coef) -> str | None:
        """In a warp stage's rows (self.early): an operand the kernel does not write, read at an index that
        depends on the slice only (not on the reduced axes), loaded once at the stage's start, before its head
        GEMM, into a local (gc_pack_load: loads the compilers keep there) — the MLP's label, which the softmax
        read in its loops after the head's sums, a round trip later. None for any other read."""
        lay, lowering = self.layout, self.lowering
        root = storage_root(node)
        if is_literal(root) or lowering.read_in_place(node) or any(coef[d] for d in lay.axes):
            return None
        if overlap(lowering.ranges([node]), self.early["writes"]):
            return None
        index = self.index(coef, "slice")
        key = (node, index)
        if key not in self.early["vars"]:
            name = self.early["vars"][key] = f"pre{len(self.early['vars'])}"
            self.early["stmts"].append(f"const {C_TYPES[node.dtype]} {name} = gc_pack_load({lowering.pointer(node)} + {index});")
        return self.early["vars"][key]

    def pack_field(self, node: Node, coef, index: str) -> str:
        """In an epilogue's runs: lane j's value of an operand read at `index` — a field of the run's pack,
        a 16-byte vector where the operand lies along the row (n's coefficient 1, the others and the offset
        multiples of 4 elements of 4 bytes), one value for the run where it does not depend on n; else the
        epilogue has no runs (self.packed["ok"] False)."""
        fields = self.packed["fields"]
        cn, others = coef[-1], coef[:-1]
        vector = (cn == 1 and np.dtype(node.dtype).itemsize == 4 and all(c % VECTOR == 0 for c in others)
                  and self.lowering.vector_aligned(node) and not self.packed.get("one"))
        if cn != 0 and not vector and not self.packed.get("one"):
            self.packed["ok"] = False
            return self.lowering.operand(node, index)
        field = fields.setdefault((node, index), {"name": f"f{len(fields)}", "ctype": C_TYPES[node.dtype],
                                                  "vector": vector, "pointer": self.lowering.pointer(node),
                                                  "index": index})
        return f"q.{field['name']}.v[j]" if vector else f"q.{field['name']}"

    def lane(self, node: Node, index: str, move: str) -> str | None:
        """In the vector loop: lane j of the vector that loads (or stores) node, when node is accessed at the
        element's own index `o` in a buffer aligned to the vector; None otherwise (a scalar access)."""
        if self.vectors is None or index != "o" or is_literal(storage_root(node)):
            return None
        if not self.lowering.vector_aligned(node):
            return None
        arrays = self.vectors[move]
        name = arrays.setdefault(node, f"{'in' if move == 'load' else 'out'}{len(arrays)}")
        return f"{name}.v[j]"

    def expression(self, m: Node, context: str) -> str:
        ctype = C_TYPES[m.dtype]
        if m.op == "matmul":
            return "acc"
        if m.op == "assign":
            return self.read(m, 1, context)
        operands = [self.read(m, k, context) for k in range(len(m.inputs))]
        if m.op in ("reshape", "broadcast_to", "transpose"):
            return operands[0]
        if m.op == "cast" and m.inputs[0].dtype in FLOAT_DTYPES and m.dtype not in FLOAT_DTYPES:
            return f"({ctype})gc_float_to_int32({operands[0]})"   # (a C cast of NaN or 3e9 is undefined)
        if m.op == "cast":
            return f"({ctype})({operands[0]})"
        if m.op == "div" and m.dtype not in ("float32", "float64"):
            return f"({ctype})gc_idiv({operands[0]}, {operands[1]})"   # x / 0 is 0, as in the numpy executor
        if m.op in ("zeros_like", "ones_like"):
            return f"({ctype}){int(m.op == 'ones_like')}"
        if m.op == "one_hot":
            depth = m.attrs["depth"]
            own = self.index(self.layout.coef[m], context)
            return f"({ctype})({operands[0]} == (int32_t)(({own}) % {depth}) ? 1 : 0)"
        attrs = {key: c_literal(v, m.dtype) for key, v in m.attrs.items() if isinstance(v, float)}
        op = get_op(m.op)
        if op.wraps and m.dtype == "int32":
            operands = [f"(uint32_t)({x})" for x in operands]
        return f"({ctype})({op.c_text(m.attrs).format(*operands, **attrs)})"

    def define(self, m: Node, context: str, out: list, done: set):
        """Append the statements computing m (and the members of the same context it needs) to `out`."""
        if m in done:
            return
        for x in m.inputs:
            if x in self.inside and self.layout.context[x] == self.layout.context[m]:
                self.define(x, context, out, done)
        out.append(f"const {C_TYPES[m.dtype]} {self.var[m]} = {self.expression(m, context)};")
        done.add(m)

    def accumulator(self, red: Node, context: str) -> tuple[str, bool]:
        """The accumulator of a reduction (shared by identical reductions) and whether it is new."""
        x = red.inputs[0]
        # a sum and a mean of one input share a float accumulator; integer ones differ (accumulator_type)
        combine = "max" if red.op == "reduce_max" else accumulator_type(red)
        key = (combine, x if x in self.inside else self.read(red, 0, context), red.dtype)
        new = key not in self.accumulators
        if new:
            self.accumulators[key] = f"a{len(self.accumulators)}"
        return self.accumulators[key], new

    def reduction_value(self, red: Node, acc: str) -> str:
        """A reduction's value stays in its accumulator's type (double for float sums on the cpu target): the
        members using it round their own results, as the runtime's softmax did with its double sum."""
        count = get_op(red.op).count(red)
        if red.op != "reduce_mean":
            if accumulator_type(red) != C_TYPES[red.dtype]:
                return f"const auto {self.var[red]} = ({C_TYPES[red.dtype]}){acc};"   # an int32 sum, wrapped
            return f"const auto {self.var[red]} = {acc};"
        if red.dtype in ("float32", "float64"):
            return f"const auto {self.var[red]} = {acc} * {c_literal(1.0 / count, red.dtype)};"
        # an integer mean truncates toward zero, as numpy's float64 mean cast to the integer type does
        return f"const auto {self.var[red]} = ({C_TYPES[red.dtype]})({acc} / {count});"

    def accumulate(self, red: Node, acc: str, value: str) -> str:
        if red.op == "reduce_max":
            return f"{acc} = ({value} > {acc} || {value} != {value} ? {value} : {acc});"   # NaN stays, as in numpy
        return f"{acc} = {acc} + {value};"

    def declare(self, red: Node, acc: str) -> dict:
        init = "0"
        if red.op == "reduce_max":
            init = {"float32": "-INFINITY", "float64": "-INFINITY", "int32": "INT32_MIN"}.get(red.dtype, "0")
        ctype = accumulator_type(red)
        return {"name": acc, "ctype": ctype, "init": init, "max": "true" if red.op == "reduce_max" else "false",
                # the cpu target sums floats in double (see runtime/gc_kernels_cpu.h); cuda in the value's type.
                # A maximum is exact in any type: it stays in the value's type.
                "acc_ctype": "double" if red.dtype in ("float32", "float64") and red.op != "reduce_max" else ctype}

    def target(self, m: Node) -> Node:
        """The outer node whose buffer receives member m: its variable for an assign, else its group_output."""
        return self.group.external[m.inputs[0]] if m.op == "assign" else self.group.result_of(m)

    def store(self, m: Node, context: str, value: str | None = None) -> str:
        """The statement storing member m (its variable, or `value`) at its index in `context`."""
        index, cond = self.index(self.layout.coef[m], context), self.guard(self.layout.coef[m], context)
        value = value or self.var[m]
        lane = None if cond else self.lane(self.target(m), index, "store")
        if lane:
            return f"{lane} = {value};"
        text = f"{self.lowering.pointer(self.target(m), const=False)}[{index}] = {value};"
        return f"if ({cond}) {text}" if cond else text

    def written(self) -> list[Node]:
        """Members whose values the kernel stores: those read outside the group, and every assign."""
        return [m for m in self.members if m.op == "assign" or m in self.group.outputs]

    # --- kernels --------------------------------------------------------------------------------
    def segment(self, name: str, per: int | None = None, split: bool = False, registers: dict | None = None,
                early: list | None = None) -> dict:
        """A rows group as the body of a kernel: per slice, the reduction phases, then the element loop. `name`
        names its workspace; `per`: the slices a block takes per round (default: its sx, all its threads);
        `split`: a chain's stage, whose global part is a function of its own (the kernel's tail) reading the
        blocks' partials, even on one block; `registers`: {arena offset: array}, a buffer whose value at the
        element's own index the element code reads from array[r] (a warp stage's rows, Lowering.warp_stages;
        `register_misses` counts its reads elsewhere); `early`: the byte ranges the kernel writes, for a warp
        stage's rows whose slice-invariant reads of what it does not write load at its start (early_load)."""
        self.registers = registers or {}
        self.early = None if early is None else {"writes": early, "vars": {}, "stmts": []}
        lay = self.layout
        ctx = lay.context
        slice_done, prelude = set(), []
        phases = max((lay.level[m] for m in self.members if m.op in REDUCTIONS and ctx[m] == "slice"), default=0)
        after = {level: [] for level in range(phases + 1)}
        reductions = {level: [] for level in range(1, phases + 1)}
        for m in self.members:
            if ctx[m] == "slice":
                if m.op in REDUCTIONS:
                    reductions[lay.level[m]].append(m)
                else:
                    after[lay.level[m]].append(m)
        for m in after[0]:              # first: the phases' loops may read them
            self.define(m, "slice", prelude, slice_done)
        body_phases = []
        for level in range(1, phases + 1):
            accs, loop, loop_done, values = [], [], set(), []
            for red in reductions[level]:
                acc, new = self.accumulator(red, "element")
                x = red.inputs[0]
                if new:
                    accs.append(self.declare(red, acc))
                    if x in self.inside and ctx[x] == "element":   # else constant over the slice: computed
                        self.define(x, "element", loop, loop_done)
                    loop.append(self.accumulate(red, acc, self.var[x] if x in self.inside
                                                else self.read(red, 0, "element")))
                values.append(self.reduction_value(red, acc))
                slice_done.add(red)
            stmts = []
            for m in after[level]:
                self.define(m, "slice", stmts, slice_done)
            body_phases.append({"accs": accs, "loop": loop, "after": values + stmts})
        written = self.written()
        element_loop, element_done = [], set()
        element_defs, element_values = [], []
        for j, m in enumerate(w for w in written if ctx[w] == "element"):
            defined = len(element_loop)
            self.define(m, "element", element_loop, element_done)
            element_defs += element_loop[defined:]
            element_values.append({"name": f"el{j}", "ctype": C_TYPES[m.dtype], "value": self.var[m],
                                   "store": self.store(m, "element", f"el{j}[r]"),
                                   # where it is stored, when at the element's own index (a warp stage's A)
                                   "at": self.lowering.plan.offset_of(self.target(m), self.lowering.direction)
                                   if self.index(self.layout.coef[m], "element") == "i" else None})
            element_loop.append(self.store(m, "element"))
        slice_stores = [self.store(m, "slice") for m in written if ctx[m] == "slice"]
        global_accs, global_update, global_after, global_done = [], [], [], set()
        for m in (m for m in self.members if ctx[m] == "global"):
            if m.op in REDUCTIONS:
                acc, new = self.accumulator(m, "slice")
                if new:
                    global_accs.append(self.declare(m, acc))
                    global_update.append(self.accumulate(m, acc, self.var[m.inputs[0]]))
                global_after.append(self.reduction_value(m, acc))
                global_done.add(m)
            else:
                self.define(m, "global", global_after, global_done)
        global_stores = [self.store(m, "global") for m in written if ctx[m] == "global"]
        # what the global part reads from outside the group: the last block prefetches it before the ticket
        # (Lowering.prefetch_globals keeps what the kernel does not write); in the order the members read them
        # (sorted by name, reduce_sum_10 came before reduce_sum_8 and after it as reduce_sum_12: the source
        # depended on how many nodes the process had made before)
        global_reads = list(dict.fromkeys(self.group.external[x] for m in self.members if ctx[m] == "global"
                                          for x in m.inputs if x not in self.inside
                                          and not is_literal(storage_root(self.group.external[x]))))
        sx, sy = threads(lay)
        per = per or sx
        # A chain stage's short slices, where the block takes a slice for each of its warps (cuda): a warp
        # each, its lanes along the slice and its reductions shuffles (gc_reduce_lanes), instead of a thread
        # each — the MLP's 10-class softmax and loss took ~3,000 cycles of its b1000 tf32 chain that way
        # (clock64 stamps: a thread's serial loops, ten divisions each behind a branch to the slow path).
        # H100 trainer, 5-10 interleaved rounds, three runs: 26.01 / 25.88 / 26.05 -> 25.90 / 25.78 / 25.88 us.
        # Not with fewer slices than warps: the fp32 chain's 4 rows a block 37.69 -> 37.99 (its idle warps
        # redo the last slice, as a block's spare threads do).
        warp_rows = (split and self.lowering.target == "cuda" and sy == 1 and lay.length <= 32
                     and per == BLOCK // 32 and not registers)
        if warp_rows:
            sx, sy = BLOCK // 32, 32
        assert per <= sx, "a block's slices are its threads' columns"
        vector = self.vector_loop()
        # the block's one slice, a thread's whole and short: its values into registers, then its stores
        # (ELEMENT_REGISTERS; a warp stage's rows stage at any length, Lowering.warp_stages)
        in_registers = (sy == 1 and per == 1
                        and (lay.length <= ELEMENT_REGISTERS or bool(registers)) and not vector)
        blocks = min(vector["tiles"], 2 ** 31 - 1) if vector else blocks_for(lay.slices, per)
        if global_accs and not split:
            blocks = min(blocks, GLOBAL_BLOCKS)   # (every block takes the ticket and leaves a partial to sum)
        # A global reduction over several blocks: each stores its partials, the last to arrive (a ticket) sums
        # them in block order (gc_last_block). Ticket and partials (8 bytes a block each) are the kernel's
        # workspace in the arena; one block needs neither.
        # A chain's stage (split) with 4-byte partials has them summed by a block of their own, the collector
        # (gc_collect_partials), instead: the ticket word holds the launch's number, a partial's 8 bytes the
        # value and that number.
        ticket, workspace = None, []
        collect = split and bool(global_accs) and all(a["ctype"] in ("float", "int32_t") for a in global_accs)
        if global_accs and (blocks > 1 or split):
            base = self.lowering.plan.workspace(name, 8 + 8 * blocks * len(global_accs))
            ticket, workspace = f"((unsigned int*)(A + {base}))", [(base, base + 8 + 8 * blocks * len(global_accs))]
            for j, a in enumerate(global_accs):
                a["partials"] = f"(({a['ctype']}*)(A + {base + 8 + 8 * blocks * j}))"
                a["slots"] = f"((unsigned long long*)(A + {base + 8 + 8 * blocks * j}))"
        base = linear_index("o", lay.kept_shape, [strides(lay.domain)[d] for d in lay.kept]) if lay.kept else "0"
        offset = linear_index("r", [lay.domain[d] for d in lay.axes],
                              [strides(lay.domain)[d] for d in lay.axes]) if lay.axes else "0"
        return {
            "slices": lay.slices, "length": lay.length, "base": base, "offset": offset,
            "index": "int64_t" if lay.slices * lay.length >= 2 ** 30 else
                     index_type([x for m in self.members for x in (m, *m.inputs)]),
            "sx": sx, "sy": sy, "per": per, "vector": vector, "warp_rows": warp_rows,
            "start": vector["tiles"] * vector["tile"] if vector else 0,
            "blocks": blocks, "ticket": ticket, "workspace": workspace,
            "early": self.early["stmts"] if self.early else [],
            "prelude": prelude, "phases": body_phases, "element_loop": element_loop,
            "element_defs": element_defs if in_registers else [],
            "element_values": element_values if in_registers else [],
            "slice_stores": slice_stores, "global_accs": global_accs, "global_update": global_update,
            "global_after": global_after, "global_stores": global_stores,
            "sync": sy > 1, "tail": split and bool(global_accs or global_after or global_stores),
            "collect": collect,
            # the threads whose global accumulators hold values (x < per, y = 0): the block's sum is theirs
            "contributors": 1 << (per - 1).bit_length(),
            "global_reads": [(self.lowering.pointer(n), self.lowering.ranges([n])) for n in global_reads],
            # the cpu target: parallel over slices, unless the slices feed a global sum in a fixed order
            "parallel": int(not global_accs and lay.slices * lay.length > 32768),
        }

    def vector_loop(self) -> dict | None:
        """A map group's vector loop (cuda), or None. The domain's whole tiles of BLOCK vectors of VECTOR
        elements go to the blocks, thread x taking vector x of a tile: it loads every vector operand, computes
        the VECTOR lanes and stores whole vectors. Operands read and values stored at the element's own index in
        a buffer aligned to the vector move as vectors; broadcast or transposed operands, scalar constants and
        guarded stores stay per element. The scalar loop does the elements after the last whole tile.
        Each tile gets a block of its own (the grid-stride loop only matters past 2^31 tiles): on an H200,
        256 MB through a one-input map ran at 101% of a device copy's bandwidth so, at 99% with 8192 blocks
        looping over the tiles, at 89-91% with a grid of resident blocks (132 SMs x 8), and at 96-98% with 2 or
        4 vectors per thread and operand in flight (bench/README.md)."""
        lay = self.layout
        tile = BLOCK * VECTOR
        if lay.axes or lay.slices < tile or any(lay.context[m] != "slice" for m in self.members):
            return None
        self.vectors = {"load": {}, "store": {}}
        body, done = [], set()
        for m in self.written():
            self.define(m, "slice", body, done)
            body.append(self.store(m, "slice"))
        moves, self.vectors = self.vectors, None
        if not moves["load"] and not moves["store"]:
            return None

        def arrays(move):
            return [{"name": name, "ctype": C_TYPES[n.dtype], "pointer": self.lowering.pointer(n, move == "load")}
                    for n, name in moves[move].items()]
        return {"tiles": lay.slices // tile, "tile": tile, "width": VECTOR, "loads": arrays("load"),
                "stores": arrays("store"), "body": body}

    def epilogue(self) -> tuple[dict, Node]:
        """A gemm group's epilogue: every member at (m, n) from the GEMM's sum `acc`; the first full-size
        member written outside is the value stored in C, the others are stored by the epilogue itself."""
        lay, matmul = self.layout, self.members[0]
        written = self.written()
        stored = next(m for m in written if lay.coef[m] == lay.identity() and m.dtype == matmul.dtype
                      and m.size == matmul.size)
        stmts, done = [], set()
        for m in self.members:
            self.define(m, "gemm", stmts, done)
        stores = [self.store(m, "gemm") for m in written if m is not stored]
        runs = None if stores else self.epilogue_runs()
        return {"stmts": stmts, "stores": stores, "value": self.var[stored],
                "ctype": C_TYPES[matmul.dtype], "runs": runs}, stored

    def epilogue_runs(self) -> dict | None:
        """The same epilogue on runs of 4 columns (cuda; gc_gemm_cuda.cuh's `runs`): the operands each lane
        reads go into a pack loaded at once (pack_field), so a kernel may load a thread's packs into registers
        while its first K steps are on their way, then compute the lanes. None where an operand is read
        across the row otherwise (a transposed one) or the epilogue stores values of its own."""
        return self.packed_epilogue(one=False)

    def epilogue_ones(self) -> dict | None:
        """The epilogue one column at a time with its operands in a pack (`ones`: pack1, load1, run1), every
        operand one value at its own index: a warp stage's head (gc_warp_row_head) and the stage that loads a
        held B (gc_reg_row_gemm) load the packs of their row's columns when they start (chain_ones), instead of
        the functor loading them after the sums. None where the epilogue stores values of its own (run1
        computes C's value only) or reads nothing."""
        return self.packed_epilogue(one=True)

    def packed_epilogue(self, one: bool) -> dict | None:
        """The epilogue's statements with its operands read from a pack (pack_field): {"fields", "stmts"}, or
        None (not float32; runs: an operand that does not fit them; ones: no operand at all, or a value it
        stores besides C's — epilogue() leaves runs out there itself)."""
        if self.members[0].dtype != "float32" or (one and len(self.written()) > 1):
            return None
        self.packed = {"fields": {}, "ok": True, "one": one}
        stmts, done = [], set()
        try:
            for m in self.members:
                self.define(m, "gemm", stmts, done)
        finally:
            packed, self.packed = self.packed, None
        if not packed["ok"] or (one and not packed["fields"]):
            return None
        return {"fields": list(packed["fields"].values()), "stmts": stmts}


def fold_split_sums(kernels: list, plan) -> None:
    """cuda: where a split GEMM's C is read next by a chain's first stage, as its A at the chain's rows, and by
    no kernel in between, the chain's blocks sum the splits' partial tiles at their rows (gc_chain_sum_partials:
    in split order, the GEMM's epilogue applied, C stored before the first stage) instead of the GEMM's
    cluster: the GEMM stores its partials into a workspace of split x M x N values (gc_ep_partial; launched
    without a cluster) where they take at most PARTIALS_MAX bytes. The same order of sums, so the same bits.
    H200, the MLP at batch 128 (x @ W1 split 8 on clusters of 8 before the chain), trainer steps: 19.36 ->
    17.86 us in the prototype (docs/compiler.md)."""
    for g, c in zip(kernels, kernels[1:]):
        if g.kind != "matmul" or c.kind != "chain":
            continue
        v, first = g.values, c.values["stages"][0]
        split = Tile.parse(v["tile"])[1]
        if split < 2 or v["batch"] != 1 or v["ctype"] != "float" or (v["epilogue"] or {}).get("stores") or \
                not first["gemm"] or first["a_at"] != v["c_at"] or (first["m"], first["k"]) != (v["m"], v["n"]):
            continue
        nbytes = split * v["m"] * v["n"] * 4
        if nbytes > PARTIALS_MAX:
            continue
        base = plan.workspace(f"split partials ({nbytes} bytes)", nbytes,   # the train and eval steps share it
                              "split GEMMs' partial tiles, summed by the chain after each (lower.py's fold_split_sums)")
        c_range = next(w for w in g.writes if w[0] <= v["c_at"] < w[1])
        part = (base, base + nbytes)
        # a first stage holding its B in registers (chain_registers) takes its A row from the sum's threads
        # in shared memory instead of reading back what they stored
        staged_a = c.values["rows"] == 1 and first.get("regs") is not None
        first["a_staged"] = staged_a
        c.values["sum"] = {"split": split, "m": v["m"], "n": v["n"], "c": v["c"], "ctype": v["ctype"],
                           "part": f"((const float*)(A + {base}))", "epilogue": v["epilogue"], "rows": staged_a}
        v["partials"], v["c"] = True, f"((float*)(A + {base}))"
        g.writes = sorted([w for w in g.writes if w != c_range] + [part])
        c.reads, c.writes = sorted(set(c.reads) | {part}), sorted(set(c.writes) | {c_range})
        g.comment += f"; its {split} splits' partial tiles summed by {c.name}"
        c.comment += f"; sums {g.name}'s {split} splits first"


# The least K of a chain's stage d @ W^T that reads W's mirror (mirror_variables: the MLP's dh1, K 100, gains;
# its dh2, K 10, loses)
CHAIN_MIRROR_MIN_K = 64


def mirror_variables(kernels: dict, plan) -> None:
    """cuda: readers of a 2-D float32 variable W that would rather have W^T read W's mirror instead — a
    workspace of W's size holding W^T — where the train step writes W in one GEMM's epilogue only (its update:
    dW's GEMM, C = W, its splits summed on a cluster or none) or not at all. The readers:
      * a GEMM x @ W on a warp-specialized wgmma tile (TF32 = 6: gc_gemm_ws_kernel), which copies both operands
        k contiguous: it reads the mirror as B with TB. Otherwise its producer warps transpose each K step of
        W, at every step (docs/compiler.md: 7.1-7.8 us against 4.8-5.1 for the MLP's b1000 x @ W1 alone);
      * a chain's GEMM stage d @ W^T of N > 32 columns and K >= CHAIN_MIRROR_MIN_K reading W from global
        memory (not staged in shared memory, not held in registers, not on tensor cores: chain_mma; a chain of
        more blocks than SMs, the MLP's dh1 = dh2 W2^T at b2000): it reads the mirror as B without TB, a
        thread still one column summing k in order (gc_row_gemm's ONE: the same sums, the same bits), a warp's
        loads one 128-byte run a k where with TB each lane read its own column's k run (32 rows apart: twice
        the L1 wavefronts). H100, b1000 tf32 trainer (docs/compiler.md): 33.57 -> 33.11 us; W3's mirror for
        dh2 too (K 10) took it back.
    That GEMM's end also stores each final value at (n, m) of the mirror (its functor says where, `mirror()`;
    the split's sum transposes its rows in shared memory first: gc_gemm_cuda.cuh's gc_ep_mirror), and the
    host's writes of W refresh it (gc_refresh_mirrors: gc_set_variable, gc_load). The mirror is never in a
    checkpoint (it is no variable) and shares no bytes (a workspace). The kernels reading it and the one
    writing it read / write its bytes (streams.py orders them as W's)."""
    variables = {b.offset: b for b in plan.buffers if b.region == "persistent" and b.node.op == "variable"
                 and b.node.dtype == "float32" and b.node.ndim == 2}
    readers = {}   # W's offset -> [(kernel, the values to retarget: the GEMM's or a chain stage's)]
    for ks in kernels.values():
        for k in ks:
            v = k.values
            if k.kind == "matmul" and not (v["trans_a"] or v["trans_b"] or v["batch"] != 1 or v["ctype"] != "float"):
                var = variables.get(v["b_at"])
                if var is not None and Tile.parse(v["tile"])[0].tf32 == 6 and var.node.shape == (v["k"], v["n"]):
                    readers.setdefault(var.offset, []).append((k, v))
            if k.kind == "chain":
                staged = {part["ptr"] for part in (v["staged"] or {}).get("parts", [])}
                for st in v["stages"]:
                    if not (st["gemm"] and st["trans_b"] and st["n"] > 32 and st["k"] >= CHAIN_MIRROR_MIN_K
                            and st["batch"] == 1
                            and st["ctype"] == "float" and st.get("regs") is None and not st.get("in_warp")
                            and not st.get("warp") and not st.get("mma") and st["b"] not in staged):
                        continue
                    var = variables.get(st["b_at"])
                    if var is not None and var.node.shape == (st["n"], st["k"]):
                        readers.setdefault(var.offset, []).append((k, st))
    for at, reading in sorted(readers.items()):
        var = variables[at]
        rows, cols = var.node.shape
        span = [(at, at + var.node.nbytes)]
        writing = [k for ks in kernels.values() for k in ks if overlap(k.writes, span)]
        if len(writing) > 1 or (writing and not (
                writing[0].kind == "matmul" and writing[0].values["c_at"] == at and writing[0].values["epilogue"]
                and (writing[0].values["m"], writing[0].values["n"]) == (rows, cols)
                and writing[0].values["batch"] == 1 and not writing[0].values.get("partials"))):
            continue
        name = f"mirror of {var.node.name}"
        what = sorted({"the warp-specialized GEMMs x @ " + var.node.name if k.kind == "matmul"
                       else "a chain's stage d @ " + var.node.name + "^T" for k, _ in reading})
        off = plan.workspace(name, var.node.nbytes, f"{var.node.name} transposed ({cols} x {rows}), read by "
                             + " and ".join(what) + " (lower.py's mirror_variables)")
        mirror = [(off, off + var.node.nbytes)]
        for k, values in reading:
            values.update(b=f"((const float*)(A + {off}))", b_at=off, trans_b=1 - values["trans_b"])
            if k.kind == "chain":   # a column a thread, k in order: the stage's sums on W (gc_row_gemm's ONE)
                values["b_mirror"] = True
            if mirror[0] not in k.reads:
                k.reads = k.reads + mirror
                k.comment += f"; reads {var.node.name}^T, its mirror"
        for k in writing:   # its functor says where the mirror is; the kernel's end stores it (gc_ep_mirror)
            k.values["epilogue"] = {**k.values["epilogue"], "mirror": off}
            k.writes = k.writes + mirror
            k.comment += f"; stores {var.node.name}^T into its mirror too"
        plan.mirrors.append({"name": var.node.name, "src": at, "dst": off, "rows": rows, "cols": cols})


def lower(schedules: dict[str, list[Node]], plan, precision: str = "fp32",
          tiles: dict | None = None, target: str = "cuda") -> dict[str, list[Kernel]]:
    """Kernel specs for each schedule, in schedule order. Kernel names are unique across schedules. A chain's
    stages (chain.py, plan.chains) become one kernel when they qualify (Lowering.chain); on cuda a split GEMM
    before a chain may leave its sum to it (fold_split_sums). tiles: {kernel name: (tile name, split)} for GEMM
    kernels by kernel_key, a tuning record's choices (gcompile/tune.py) instead of choose_tile's."""
    out, index = {}, 0
    for direction, order in schedules.items():
        lowering, kernels = Lowering(plan, direction, precision, tiles, target), []
        chains = {stages[0]: stages for stages in plan.chains.get(direction, [])}
        nodes = [n for n in order if n.op not in NO_KERNEL]
        j = 0
        while j < len(nodes):
            stages = chains.get(nodes[j])
            rows = list(getattr(stages, "rows", stages or []))
            kernel = lowering.chain(rows, index) if stages and nodes[j:j + len(rows)] == rows else None
            if kernel is not None:
                kernels.append(kernel)
                index += 1
                j += len(rows)
                after = getattr(stages, "after", [])
                post = lowering.post(after, index, kernel) if after and nodes[j:j + len(after)] == after else None
                if post is not None:
                    kernels.append(post)
                    index += 1
                    j += len(after)
                continue
            kernel = lowering.kernel(nodes[j], index)
            j += 1
            if kernel is not None:
                kernels.append(kernel)
                index += 1
        if target == "cuda":
            fold_split_sums(kernels, plan)
        out[direction] = kernels
    if target == "cuda":
        mirror_variables(out, plan)
    return out
