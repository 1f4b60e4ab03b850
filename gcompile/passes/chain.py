"""chain: runs of scheduled kernels that are row-local in the batch, to be lowered as ONE kernel.

A chain's stages are fused GEMM groups (or plain GEMMs) of M rows that read their A at their own rows (not
trans_a) and rows groups over a domain (M, n) reducing axis 1: row m of every value a stage writes and a
later stage reads needs only row m of what earlier stages wrote. So a block can own a few rows and run all
the stages on them one after another (lower.py's Lowering.chain, the row GEMM gc_row_gemm), with no global
synchronization between stages: one launch instead of one per stage, and the values stay in L1/L2.

Here, on nodes, after schedule: stages are taken greedily from a kernel that can start a chain; kernels in
between that do not join it (at most CHAIN_WINDOW) and that no later stage depends on are moved after the
chain (in their order), so the chain's stages become consecutive in the schedule. plan_memory then keeps
every buffer a chain reads or writes live over the whole chain (the blocks run the stages at different times: no stage may
reuse bytes another stage touches). lower checks the same rules on the arena's bytes again and lowers the
chain when every stage fits its kernel (else the stages stay separate kernels).

A chain may also take kernels that depend on it, its *post* stages: small weight gradients over the batch
(A^T B GEMMs reading the rows the stages wrote, their SGD updates as epilogues) and small fused groups (bias
gradients, the guard's and the step's assigns). lower makes them ONE kernel launched right after the chain
(Lowering.post), each on its own blocks: in logistic regression at batch 128 the step is then two kernels on
one stream instead of three on two (a tiled dW GEMM beside the bias kernel); in the MLP at batch 128 dW3, dW2
and the bias gradients, with dW1 (too large) beside them on another stream. A grid barrier inside the
chain's kernel instead of the second launch was slower (H100, logistic regression b128: 8.96 against 8.22
us a step).
"""
from __future__ import annotations

import numpy as np

from ..gemm_tiles import short_k_choice
from ..graph import Node
from ..ops.matmul import inner_size
from .plan_memory import NO_KERNEL, gemm_of, step_values, storage_root, step_writes

# The most elements a stage's B may have: every block reads all of B (from L2), so a chain's GEMMs are small
# ones (the MLP's W2 has 25,600, logistic regression's W 7,840; its W1, 200,704, stays a tiled GEMM).
CHAIN_MAX_B = 32768
CHAIN_WINDOW = 8    # the most kernels moved after a chain: the search for its next stage ends there
# A post stage: a GEMM of at most POST_MAX_FMA multiply-adds over at most POST_MAX_K rows of the batch (a
# warp of gc_col_gemm sums K / 8 of them one after another: logistic regression's dW at batch 1000, 7.8M
# FMAs, made its step 14.3 -> 42.4 us), or a fused group of at most POST_MAX_ELEMENTS elements in its
# domains. Logistic regression's dW 784 x 10 x 128 (1.0M) and the MLP's dW2 256 x 100 x 128 (3.3M) are
# ones; the MLP's dW1 (25.7M) is not. POST_ALL: take post stages only when every kernel depending on the
# chain can be one (else the others run beside the post kernel, on another stream). H100, MLP b128: with
# dW3, dW2 and the bias gradients post stages, dW1 beside them, 22.52 -> 21.59 us a step; with dW3 and the
# bias gradients alone (dW2 a tiled GEMM beside them) 25.33. The post kernel follows the chain on its stream
# (launched programmatically), dW1 waits for the chain on another: the other way round, 21.68 -> 21.90 us.
# Under tf32 a dependent left beside the post kernel was a tensor-core GEMM, which the post kernel's blocks
# delay (MLP b128 tf32: 20.3 -> 25.1 us in make bench; 13.94 -> 17.07 in the H100 trainer, thirty-second
# session): there a chain takes post stages only when every dependent it leaves is a GEMM on a plain tf32
# short-K tile (beside_post, gemm_tiles.short_k_choice), which runs beside it as fp32's short-K tiles do (11.45
# us).
POST_MAX_FMA = 1 << 22
POST_MAX_K = 256
POST_MAX_ELEMENTS = 1 << 17
POST_ALL = False


class Chain(list):
    """A chain's stage nodes in order: the row stages, then its `post` stages (run by a second launch)."""

    def __init__(self, stages, post: int = 0):
        super().__init__(stages)
        self.post = post

    @property
    def rows(self) -> list[Node]:
        return list(self[:len(self) - self.post])

    @property
    def after(self) -> list[Node]:
        return list(self[len(self) - self.post:])


def rows_of(node: Node) -> int | None:
    """The rows M of a step that can be a chain's stage, or None: a 2-D float32 GEMM reading A at its own
    rows, B of at most CHAIN_MAX_B elements, without assigns; or a rows group over (M, n) reducing axis 1."""
    gemm = gemm_of(node)
    if gemm is not None:
        matmul = gemm[0]
        group = node.attrs["group"] if node.op == "fused" else None
        if matmul.ndim != 2 or matmul.dtype != "float32" or matmul.attrs["trans_a"] or gemm[2].size > CHAIN_MAX_B \
                or (group and group.assigns):
            return None
        return matmul.shape[0]
    if node.op == "fused":
        group = node.attrs["group"]
        lay = group.layout
        if group.kind == "rows" and not group.segments and len(lay.domain) == 2 and tuple(lay.axes) == (1,) \
                and not group.assigns:
            return lay.domain[0]
    return None


def own_row_reads(node: Node) -> set:
    """The inputs a stage reads only at the rows it computes: a GEMM's A, and values of the domain's shape
    read at the element's own index (an epilogue's or a rows group's members)."""
    if node.op == "matmul":
        return {node.inputs[0]}
    group = node.attrs["group"]
    lay = group.layout
    domain = tuple(lay.domain) if group.kind == "rows" else tuple(group.members[0].shape)
    own, other = set(), set()
    for m in group.members:
        for k, x in enumerate(m.inputs):
            if x in group.external and m.op != "matmul":    # (the GEMM's own operands: below)
                outer = group.external[x]
                at_own = tuple(outer.shape) == domain and lay.operand_coef(m, k) == lay.identity()
                (own if at_own else other).add(outer)
    if group.kind == "gemm":
        own.add(gemm_of(node)[1])
        other.add(gemm_of(node)[2])
    return own - other


def own_row_writes(node: Node) -> set:
    """The values a stage writes at the rows it computes: a GEMM's results stored at (m, n) (C and side
    stores of C's shape), a rows group's element values; its slice and global values are not."""
    if node.op == "matmul":
        return {node}
    group = node.attrs["group"]
    lay = group.layout
    out = set()
    for member, result in zip(group.outputs, group.results):
        if group.kind == "gemm" and tuple(result.shape) == tuple(group.members[0].shape) and \
                lay.coef[member] == lay.identity():
            out.add(result)
        elif group.kind == "rows" and lay.context[member] == "element" and lay.coef[member] == lay.identity() \
                and tuple(result.shape) == tuple(lay.domain):
            out.add(result)
    return out


def post_stage(node: Node) -> bool:
    """Whether a kernel can be a chain's post stage: a 2-D float32 GEMM A^T @ B (trans_a, not
    trans_b: a weight gradient over the batch) of at most POST_MAX_FMA multiply-adds and POST_MAX_K rows, or a
    fused group without a GEMM of at most POST_MAX_ELEMENTS elements."""
    gemm = gemm_of(node)
    if gemm is not None:
        matmul, a, b = gemm
        return matmul.ndim == 2 and matmul.dtype == "float32" and matmul.attrs["trans_a"] and \
            not matmul.attrs["trans_b"] and matmul.size * a.shape[0] <= POST_MAX_FMA and a.shape[0] <= POST_MAX_K
    if node.op != "fused":
        return False
    group = node.attrs["group"]
    parts = group.segments or [group]
    return all(p.kind == "rows" for p in parts) and \
        sum(int(np.prod(p.layout.domain)) for p in parts) <= POST_MAX_ELEMENTS


def conflict(x: Node, y: Node) -> bool:
    """Whether two steps touch the same storage, one of them writing it."""
    wx, wy = ({storage_root(w) for w in step_writes(n)} for n in (x, y))
    vx, vy = ({storage_root(v) for v in step_values(n)} for n in (x, y))
    return bool(wx & vy or wy & vx)


def beside_post(node: Node, precision: str) -> bool:
    """Whether a kernel that depends on a chain but is not one of its post stages may run beside the post
    kernel: under fp32 any (none with POST_ALL); under tf32 a GEMM that goes on a short-K tile."""
    if POST_ALL:
        return False
    if precision != "tf32":
        return True
    gemm = gemm_of(node)
    if gemm is None or gemm[0].ndim != 2:
        return False
    matmul, a, _ = gemm
    ta, tb = matmul.attrs["trans_a"], matmul.attrs["trans_b"]
    return short_k_choice(*matmul.shape, inner_size(a, ta), ta, tb, precision,
                          dtype=matmul.dtype) is not None


def post_stages(stages: list[Node], after: list[Node], precision: str = "fp32") -> list[Node]:
    """The kernels of `after` (the schedule after the chain) that depend on the chain, directly or through
    each other, and can be post stages (post_stage), none depending on another nor conflicting with a
    kernel of `after` it moves ahead of; none unless a GEMM is among them, nor unless every dependent left
    can run beside them (beside_post)."""
    kernels = [n for n in after if n.op not in NO_KERNEL]
    written = {storage_root(w) for s in stages for w in step_writes(s)}
    dependent = []
    for node in kernels:
        if any(storage_root(x) in written for x in node.inputs):
            dependent.append(node)
            written.update(storage_root(w) for w in step_writes(node) + [node])
    post = [n for n in dependent if post_stage(n)]
    left = [n for n in dependent if n not in post]
    if all(gemm_of(n) is None for n in post) or not all(beside_post(n, precision) for n in left):
        return []          # (fused groups alone: the kernel they are anyway)
    last = kernels.index(post[-1])
    stay = [n for n in kernels[:last] if n not in post]
    for i, p in enumerate(post):
        if any(conflict(p, q) for q in post[:i] + stay):
            return []
    return post


def joins(stages: list[Node], node: Node) -> bool:
    """Whether node can follow the stages: it reads what they wrote only at its own rows, and only values
    they wrote at rows."""
    written = {r: s for s in stages for r in step_writes(s)}
    mine = own_row_reads(node)
    for x in node.inputs:
        root = storage_root(x)
        for r, s in written.items():
            if storage_root(r) is root and (x not in mine or r not in own_row_writes(s)):
                return False
    return True


def find_chains(order: list[Node], precision: str = "fp32") -> tuple[list[Node], list[Chain]]:
    """The schedule with each chain's stages made consecutive, and the chains (their stage nodes, in order;
    two row stages at least, a GEMM among them; then its post stages, moved right after them). precision:
    the program's GEMM precision (post_stages' rule differs under tf32)."""
    order, chains, j = list(order), [], 0
    while j < len(order):
        m = rows_of(order[j])
        if m is None:
            j += 1
            continue
        stages, deferred, outputs = [order[j]], [], set()   # outputs: what the deferred steps write
        for node in order[j + 1:]:
            depends = any(storage_root(x) in outputs for x in node.inputs)
            if node.op in NO_KERNEL and not depends and node.op != "group_output":
                continue                                    # a leaf or a view: stays where it is
            if node.op == "group_output" and node.inputs[0] in stages:
                continue
            if not depends and rows_of(node) == m and joins(stages, node):
                stages.append(node)
                continue
            if node.op not in NO_KERNEL and sum(n.op not in NO_KERNEL for n in deferred) == CHAIN_WINDOW:
                break
            deferred.append(node)
            outputs.update(storage_root(w) for w in step_writes(node) + [node])
        if len(stages) < 2 or all(gemm_of(s) is None for s in stages):   # rows groups alone: fuse.py's
            j += 1
            continue
        # the stages (and the views of their results) first, then the deferred steps in their order
        span = order[j:order.index(stages[-1]) + 1]
        later = [n for n in span if n in deferred or n.op == "group_output" and n.inputs[0] in deferred]
        first = [n for n in span if n not in later]
        rest = order[order.index(stages[-1]) + 1:]
        post = post_stages(stages, later + rest, precision)
        # a post stage moves with the views of its results (a group's outputs)
        moved = [n for n in later + rest if n in post or n.op == "group_output" and n.inputs[0] in post]
        order[j:] = first + moved + [n for n in later + rest if n not in moved]
        chains.append(Chain(stages + post, len(post)))
        j += len(first) + len(moved)
    return order, chains
