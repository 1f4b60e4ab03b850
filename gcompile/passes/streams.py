"""streams: the step's kernels as independent branches, launched on several CUDA streams.

A step is one chain of kernels in schedule order, but parts of it do not depend on each other: in an MLP's
backward pass, a layer's weight gradient (and its SGD update) and the gradient flowing to the layer below
read the same values and write different buffers. Launched on different streams, such kernels run side by
side; a captured CUDA graph keeps them as parallel branches. At batch 128 most kernels fill a fraction of
the GPU, so this shortens the step.

Kernel j must run after an earlier kernel i (schedule order) when their arena bytes conflict: i writes
bytes that j reads or writes, or i reads bytes that j writes. Bytes, not values: the memory plan reuses a
dead value's buffer, and that reuse orders kernels too. The transitive reduction of that graph gives each
kernel its direct predecessors. Streams are assigned in schedule order: a kernel continues the stream whose
last kernel is a predecessor whose heir it is; one without such a stream opens a new one (at most
MAX_STREAMS, then the stream of its latest predecessor, or the one whose last kernel is oldest); it waits on
an event recorded after each predecessor on another stream. A kernel's heir (`heirs`) is the successor
that keeps its stream: a chain's post kernel whose GEMMs run on CUDA cores, else the successor with the most
GEMM work on its longest path to the step's end (the critical path, by multiply-adds), the first in schedule
order on a tie; the others open streams of their own. The heir follows on the same stream, launched programmatically (it
starts as its predecessor ends), while a kernel on another stream waits for an event, which starts it about
a microsecond later. The step begins with a fork (every stream used waits for what came before on stream 0, where the runtime's own
kernels run) and ends with a join (stream 0 waits for every other stream), so steps still follow each
other in order.

The cpu target runs kernels in schedule order; the stream calls are no-ops there.
"""
from __future__ import annotations

import networkx as nx

from .lower import overlap

MAX_STREAMS = 4      # GC_MAX_STREAMS in runtime/gc_runtime.h
MAX_EVENTS = 256     # GC_MAX_EVENTS


def conflicts(a, b) -> bool:
    """Whether kernel a (earlier) and kernel b (later) must run in that order."""
    return overlap(a.writes, b.reads + b.writes) or overlap(a.reads, b.writes)


def order_graph(kernels) -> nx.DiGraph:
    """Kernel index i -> j when j must follow i, transitively reduced."""
    g = nx.DiGraph()
    g.add_nodes_from(range(len(kernels)))
    g.add_edges_from((i, j) for j in range(len(kernels)) for i in range(j) if conflicts(kernels[i], kernels[j]))
    return nx.transitive_reduction(g)


def gemm_work(kernel) -> int:
    """The multiply-adds of a kernel's GEMMs (a tiled GEMM, a chain's or post kernel's GEMM stages); 0 for
    a kernel without one."""
    stages = kernel.values.get("stages", [kernel.values]) if kernel.kind in ("chain", "post", "matmul") else []
    return sum(v["m"] * v["n"] * v["k"] * v.get("batch", 1) for v in stages if v.get("gemm", True) and "k" in v)


def heirs(g: nx.DiGraph, kernels) -> dict[int, int]:
    """Each kernel's heir: a chain's post kernel (lower.py: built to follow the chain on its stream) whose GEMM
    stages run on CUDA cores (gc_col_gemm), else its successor with the most GEMM work on a path to the step's
    end (the first in schedule order on a tie). By work alone the MLP's dW1 (25.7M multiply-adds at batch 128)
    would take the stream from the post kernel (3.4M); with dW2 on gc_col_gemm's 256 blocks that was slower
    (H100, trainer steps: 22.46 -> 23.02 us, and again at 14.06 -> 14.20 and 15.51 -> 15.59), while at batch
    1000, without a post kernel, dW1 after the chain gave 55.10 -> 53.48 us (fp32) and 46.03 -> 42.86 (tf32).
    With dW2 on the post kernel's short-K tensor-core tile (a stage with "sk", 32 blocks) the post kernel is
    short and dW1 takes the stream: 13.04 -> 12.70 us (H100, b128 fp32, 8 interleaved rounds)."""
    def col_post(k) -> bool:
        return k.kind == "post" and not any(v.get("sk") for v in k.values.get("stages", []))
    path = {}
    for j in reversed(range(len(kernels))):
        path[j] = gemm_work(kernels[j]) + max((path[s] for s in g.successors(j)), default=0)
    return {i: min(g.successors(i), key=lambda s: (not col_post(kernels[s]), -path[s], s))
            for i in g if g.out_degree(i)}


def assign_streams(kernels, max_streams: int = MAX_STREAMS) -> int:
    """Set each kernel's values["stream"], values["waits"] (events to wait for before it) and values["record"]
    (the event recorded after it, or None); returns the number of streams used. Events are numbered per step."""
    g = order_graph(kernels)
    heir = heirs(g, kernels)
    stream, tails = {}, []            # tails[s]: index of the last kernel on stream s
    for j in range(len(kernels)):
        preds = set(g.predecessors(j))
        following = [s for s, t in enumerate(tails) if t in preds]
        kept = [s for s in following if heir.get(tails[s]) == j]
        if kept:                               # continue the branch of a predecessor whose heir it is
            s = max(kept, key=lambda s: tails[s])
        elif len(tails) < max_streams:         # a new branch (a later kernel is its predecessors' heir)
            s = len(tails)
            tails.append(j)
        elif following:                        # all streams taken: the branch of the latest predecessor
            s = max(following, key=lambda s: tails[s])
        else:                                  # all streams taken: the one idle longest
            s = min(range(len(tails)), key=lambda s: tails[s])
        tails[s] = j
        stream[j] = s
    events = {}
    for j, k in enumerate(kernels):
        waits = [i for i in sorted(g.predecessors(j)) if stream[i] != stream[j]]
        for i in waits:
            events.setdefault(i, len(events))
        k.values["stream"], k.values["waits"] = stream[j], [events[i] for i in waits]
    if len(events) > MAX_EVENTS:     # more cross-stream edges than the runtime has events: one stream
        for k in kernels:
            k.values.update(stream=0, waits=[], record=None)
        return 1
    for j, k in enumerate(kernels):
        k.values["record"] = events.get(j)
    return len(tails)


def early_copies(kernels) -> None:
    """A chain that copies Bs into shared memory (lower.py's chain_staged) issues those copies before its
    gc_wait_prior where an earlier kernel of the step runs on its stream and no kernel of the step writes their
    bytes but the last such one's ancestors (values["staged"]["early"]). That kernel is the one its launch
    follows programmatically: the chain's blocks start once every block of it has triggered or ended, each
    having passed its own wait — so its ancestors have completed and their writes are visible, and so has the
    previous step (an ancestor of every kernel of this one through the fork and the join) — while it, and a
    kernel the chain waits for on another stream (an edge that capture may make programmatic too), may still
    be writing. Where that kernel is a GEMM it lets the chain start once its main loop is done
    (values["release"]: gc_release_dependents, griddepcontrol.launch_dependents), so the copies run beside its
    end (the split's sum, the epilogue) on SMs that have room for both. Not for a chain that opens its stream
    in the step (logistic regression's: its stream's previous kernel is the previous step's update of its W).
    H100, the MLP's b1000 tf32 trainer (x @ W1 on a 5-stage tile, so that a chain block fits beside one):
    25.66 -> 25.10 us a step (docs/compiler.md)."""
    g = order_graph(kernels)
    last = {}   # stream: the index of its latest kernel so far
    for j, k in enumerate(kernels):
        s = k.values.get("stream", 0)
        staged = k.values.get("staged") if k.kind == "chain" else None
        if staged and s in last:
            spans = [tuple(p["span"]) for p in staged["parts"]]
            done = nx.ancestors(g, last[s])
            if all(i in done for i in range(j) if overlap(spans, kernels[i].writes)):
                staged["early"] = True
                if kernels[last[s]].kind == "matmul":
                    kernels[last[s]].values["release"] = True
        last[s] = j
