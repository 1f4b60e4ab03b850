"""plan_memory: every buffer of one or more schedules at an offset of ONE arena, 256-byte aligned.

The arena has two regions:

- persistent (first): placeholders (the input buffers), variables, array constants and every node the caller
  lists in `persistent` (the loss, named outputs: anything read after a step; a listed view makes the node
  it views persistent). They live for the whole run, laid out one after another: placeholders, variables,
  constants, then the listed nodes.
- temporary (after it): the other results. Schedules (the train step, the eval forward) never run at the same
  time, so each is planned on its own into the same region, which is as large as the largest of them needs.

Within a schedule a temporary is live from the step that writes it to the last step that reads it
(inclusive: an op's output never shares memory with its inputs). Some nodes own no buffer:

- scalar constants become literals in the generated code;
- `reshape` is a view: it aliases its input's buffer, and reads of the view keep that buffer alive;
- `assign(var, value)` writes into var's persistent buffer, and its result is that buffer (schedule puts it
  after every read of var's old value; a persistent view of var shows the value after the step);
- a `fused` node (a group's kernel, see fuse.py) owns no buffer: it writes the buffers of its group_output
  nodes, which are live from the fused node's step. The values internal to the group are no nodes here, so
  they get no buffer at all.

The image input of a trainer program whose every reader is a GEMM reading it as its A operand (the MLP's
x @ W1 and x^T @ dh1, logistic regression likewise; `batch_rows`) gets no buffer of one batch's values: its
persistent buffer holds two batches of row indices instead (the step's and the next step's), or, where that
is small (gathered_rows), two gathered batches of its values, and those GEMMs read x's rows in place — in
the trainer's dataset or gathered half, or the library's input buffer outside the arena (runtime gc_rows;
docs/compiler.md, "The batch gather fused into the GEMMs").

Placement is greedy first-fit: buffers in some order, each at the lowest offset that overlaps no placed
buffer live at the same time. Several orders are tried (largest first, earliest first, longest-lived first)
and the one with the smallest region kept. `lower_bound` (persistent bytes + the largest peak of live
temporary bytes) says how close that is; `check_plan` verifies a plan without trusting this placement.

Left to later passes: which kernel writes which buffer (lower), and the C declaration of the layout (emit).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import graph as G
from ..errors import GCompileError, PlanError
from ..graph import Node
from .fuse import written_member
from .schedule import old_value_of

ALIGN = 256
PERSISTENT_KINDS = ("placeholder", "variable", "constant")


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def storage_root(node: Node) -> Node:
    """The node that owns node's buffer: a reshape views its input, an assign writes its variable, and so
    does the group_output of an assign fused into a group."""
    while True:
        if node.op == "group_output" and written_member(node).op == "assign":
            node = written_member(node)
        if node.op not in ("reshape", "assign"):
            return node
        node = node.inputs[0]


def is_literal(node: Node) -> bool:
    return node.op == "constant" and node.shape == ()


def in_a_buffer(node: Node) -> Node:
    """node; or, where it is a literal or a view of one (written into the code where read, so in no buffer), a
    view of a one-element constant holding its value: an output or the loss is read back from its buffer."""
    root = storage_root(node)
    if not is_literal(root):
        return node
    return G.reshape(G.constant(np.reshape(root.attrs["value"], (1,)), dtype=node.dtype), node.shape)


def read_at_start(node: Node, assigned: set) -> Node:
    """node; or, where it is a variable (or a view of one) of `assigned` (those its graph assigns), a copy of it: an
    output is read back after the run, when the variable holds its new value, and every read of a step sees the
    step's starting values (NumpyExecutor's semantics; the schedule puts the copy before the assign, as every
    reader)."""
    return G.cast(node, node.dtype) if old_value_of(node) in assigned else node


@dataclass(frozen=True)
class Buffer:
    name: str
    node: Node
    offset: int
    size: int                # bytes, a multiple of ALIGN
    first: int | None        # schedule steps that write it and read it last (None: persistent)
    last: int | None
    region: str              # "persistent" or "temp"
    schedule: str | None     # the schedule a temporary belongs to (None: persistent)
    rows: bool = False       # holds the row indices of an image input read in place, not its values

    @property
    def needed(self) -> int:
        """The bytes the buffer must hold."""
        return rows_bytes(self.node) if self.rows else self.node.nbytes

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass
class MemoryPlan:
    buffers: list[Buffer]            # persistent ones by offset, then each schedule's temporaries by offset
    schedules: dict[str, list[Node]]
    persistent_bytes: int
    arena_bytes: int
    lower_bound: int                 # persistent bytes + the largest peak of live temporary bytes
    naive_bytes: int                 # every buffer of every schedule at its own offset
    rows_note: str = ""              # how the image input's batch is read (batch_rows), for `inspect`
    workspaces: dict = field(default_factory=dict)   # kernel's own bytes: name -> (offset, size), see workspace
    workspace_notes: dict = field(default_factory=dict)   # name -> what the bytes hold (the layout's comment)
    chains: dict = field(default_factory=dict)       # schedule -> its chains' stage nodes (chain.py), for lower
    mirrors: list = field(default_factory=list)      # variables kept also transposed (lower.py's mirror_variables)
    literals: dict = field(default_factory=dict)     # scalar constants read through a pointer: node -> offset
    # buffer_of's index: (the buffers list it was made from, its length, node -> its buffers)
    _index: tuple = field(default=(None, 0, {}), init=False, repr=False, compare=False)

    def workspace(self, name: str, nbytes: int, what: str = "a reduction's ticket and the blocks' partials") -> int:
        """Offset of `nbytes` owned by one kernel (lower.py: a reduction over several blocks keeps its ticket and
        partials there; `what` says what, for the arena's layout), in a region after the temporaries that grows
        the arena: zero when the arena is made, never shared with another buffer, never in a checkpoint. The same
        name gets the same bytes again."""
        if name not in self.workspaces:
            self.workspaces[name] = (self.arena_bytes, aligned(nbytes))
            self.workspace_notes[name] = what
            self.arena_bytes += aligned(nbytes)
            self.lower_bound += aligned(nbytes)      # bytes no plan can share
        offset, size = self.workspaces[name]
        if size < nbytes:
            raise GCompileError(f"workspace {name} has {size} bytes, not {nbytes}")
        return offset

    def literal_offset(self, literal: Node) -> int:
        """Where a scalar constant (written into the code where an element is read, so in no buffer) also
        lies in the arena, for a kernel that reads its operand through a pointer (a GEMM, a window op): a
        workspace that emit's constants table fills when the arena is made. The gradient of a one-element
        output makes such operands: ones_like of a scalar, viewed as (1, 1)."""
        if literal not in self.literals:   # (names need not be unique: one workspace a node)
            self.literals[literal] = self.workspace(f"literal {literal.name} #{len(self.literals)}", literal.nbytes,
                                                    "a scalar constant read through a pointer")
        return self.literals[literal]

    def buffer_of(self, node: Node, schedule: str | None = None) -> Buffer:
        """The buffer holding node's value (views and assigns resolved); `schedule` picks among temporaries
        that several schedules compute."""
        root = storage_root(node)
        if is_literal(root):
            raise GCompileError(f"{node.describe()} is a literal in the generated code; it has no buffer")
        listed, length, by_node = self._index
        if listed is not self.buffers or length != len(self.buffers):   # (a lookup a scan: lower's were O(N^2))
            by_node = {}
            for b in self.buffers:
                by_node.setdefault(b.node, []).append(b)
            self._index = (self.buffers, len(self.buffers), by_node)
        found = [b for b in by_node.get(root, ()) if schedule is None or b.schedule in (None, schedule)]
        if len(found) != 1:
            raise GCompileError(f"{node.describe()} has {len(found)} buffers in schedule {schedule!r} of "
                                f"{list(self.schedules)}: name the schedule whose temporary you mean")
        return found[0]

    def offset_of(self, node: Node, schedule: str | None = None) -> int:
        """Where node's value lies in the arena (a scalar constant's: literal_offset)."""
        root = storage_root(node)
        return self.literal_offset(root) if is_literal(root) else self.buffer_of(node, schedule).offset

    def format(self) -> str:
        rows = [("name", "region", "offset", "size", "lifetime")]
        for b in self.buffers:
            region = b.region if b.schedule is None else f"temp:{b.schedule}"
            lifetime = "always" if b.first is None else f"{b.first}..{b.last}"
            rows.append((b.name, region, str(b.offset), str(b.size), lifetime))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(c.rjust(w) if i in (2, 3) else c.ljust(w) for i, (c, w) in
                           enumerate(zip(r, widths))).rstrip() for r in rows]
        for name, order in self.schedules.items():
            aliases = [f"{n.name}->{storage_root(n).name}" for n in order
                       if storage_root(n) is not n and not is_literal(storage_root(n))]
            if aliases:
                lines.append(f"aliases in {name}: " + ", ".join(aliases))
        if self.rows_note:
            lines.append(self.rows_note)
        lines.append(f"arena {self.arena_bytes} bytes = persistent {self.persistent_bytes} + temporary "
                     f"{self.arena_bytes - self.persistent_bytes}; lower bound {self.lower_bound} (arena is "
                     f"{self.arena_bytes / max(self.lower_bound, 1):.3f}x); naive {self.naive_bytes}")
        return "\n".join(lines)

    def format_workspaces(self) -> str:
        """The workspaces lower added after the plan (format's arena line comes before them), and the arena
        with them: what the program allocates."""
        if not self.workspaces:
            return "no workspaces"
        lines = [f"workspace {name}: offset {start}, {size} bytes ({self.workspace_notes[name]})"
                 for name, (start, size) in self.workspaces.items()]
        return "\n".join(lines + [f"arena with the workspaces: {self.arena_bytes} bytes (lower bound "
                                   f"{self.lower_bound})"])


# Where two batches of x's values take at most GATHERED_MAX bytes, the trainer gathers each step's batch into
# x's buffer (two halves) beside the step before, and the GEMMs read those rows in place without an index
# (gathered_rows); larger batches keep row indices into the dataset. Measured (H100, the trainer's step):
# see docs/compiler.md, "The batch gather fused into the GEMMs".
GATHERED_MAX = 1 << 20


def gathered_rows(x: Node) -> bool:
    """Whether the trainer gathers image input x's batches (float32 values, two halves) into its buffer instead
    of writing row indices there, for a program whose GEMMs read x in place (batch_rows)."""
    return 2 * x.shape[0] * x.shape[1] * 4 <= GATHERED_MAX


def rows_bytes(x: Node) -> int:
    """The batch rows of image input x, twice — the trainer writes the next step's into the other half while
    the step reads its own (emit.next_batch_hook): its rows' float32 values where gathered_rows(x), else one
    uint32 row index a batch row."""
    return 2 * (x.shape[0] * x.shape[1] * 4 if gathered_rows(x) else 4 * x.shape[0])


def batch_rows(x: Node | None, schedules: dict[str, list[Node]], persistent: list[Node] = ()) -> tuple[bool, str]:
    """Whether the trainer's image input x can be read through batch rows (no buffer of its values): no
    output is x's values (`persistent`: the outputs and the loss; an output read back from x's buffer needs
    them there), every step of every schedule that reads it is a 2-D float GEMM reading it as A, and only
    there (not as B, not in the GEMM's epilogue), and its rows are a multiple of 4 elements. A stored row of
    A is then a batch row whether or not A is transposed. Returns the answer and a line for `gcompile inspect`."""
    if x is None:
        return False, ""
    if any(storage_root(n) is x for n in persistent):
        return False, f"{x.name}: gathered into its buffer each step (an output is its values)"
    for name, order in schedules.items():
        for node in order:
            if x in node.inputs and not reads_rows_only(node, x):
                return False, (f"{x.name}: gathered into its buffer each step ({name}: {node.name} reads it "
                               "otherwise than as a GEMM's A operand)")
    if x.ndim != 2 or x.shape[1] % 4:   # the GEMMs' row loader moves runs of 4 elements
        return False, f"{x.name}: gathered into its buffer each step (not a matrix of rows of 4k elements)"
    if gathered_rows(x):
        return True, (f"{x.name}: the GEMMs read its rows in place from two batches of its values at its offset "
                      f"({rows_bytes(x)} bytes): the trainer gathers the next step's beside each step")
    return True, (f"{x.name}: no buffer of its values; the GEMMs read its rows in place, through the row indices "
                  f"at its offset ({rows_bytes(x)} bytes): the batch gather is fused into their loads")


def gemm_of(node: Node):
    """(matmul, A, B) of a GEMM step (a gemm group or a plain matmul), or None."""
    if node.op == "matmul":
        return node, node.inputs[0], node.inputs[1]
    if node.op == "fused" and node.attrs["group"].kind == "gemm":
        group = node.attrs["group"]
        matmul = group.members[0]
        return matmul, group.external[matmul.inputs[0]], group.external[matmul.inputs[1]]
    return None


def reads_rows_only(node: Node, x: Node) -> bool:
    """Whether the step `node` reads x only as the A operand of a 2-D float32 GEMM."""
    gemm = gemm_of(node)
    if gemm is None:
        return False
    matmul, a, b = gemm
    if node.op == "fused":   # not in the GEMM's epilogue either
        group = node.attrs["group"]
        if any(group.external.get(i, i) is x for m in group.members[1:] for i in m.inputs):
            return False
    return a is x and b is not x and matmul.ndim == 2 and matmul.dtype == "float32"


def plan_memory(schedules: dict[str, list[Node]], persistent: list[Node], rows_of: Node | None = None,
                chains: dict | None = None) -> MemoryPlan:
    """`rows_of`: the trainer's image input, to be read through batch rows where batch_rows allows. `chains`:
    each schedule's chains (chain.py), whose stages run as one kernel: what they touch lives over all of it."""
    chains = chains or {}
    rows, note = batch_rows(rows_of, schedules, persistent)
    kept = persistent_nodes(schedules, persistent)
    buffers, base = [], 0
    for node in kept:
        indirect = rows and node is rows_of
        size = aligned(rows_bytes(node) if indirect else node.nbytes)
        buffers.append(Buffer(node.name, node, base, size, None, None, "persistent", None, indirect))
        base += size
    region, peak = 0, 0
    for name, order in schedules.items():
        lives = liveness(order, set(kept), chains.get(name, []))
        # Buffers shared only along dependences leave independent kernels free to run side by side
        # (streams.py); kept while the arena stays within CONCURRENT_SLACK of its lower bound (persistent
        # bytes + the peak of live temporary bytes), else buffers are shared along the schedule's order.
        before = ordered_before(order)
        starts = min((first_fit(lives, key, before) for key in PLACEMENT_ORDERS.values()), key=region_bytes)
        if base + region_bytes(starts) > CONCURRENT_SLACK * (base + peak_live_bytes(lives, len(order))):
            starts = min((first_fit(lives, key) for key in PLACEMENT_ORDERS.values()), key=region_bytes)
        temps = [Buffer(n.name, n, base + starts[n], aligned(n.nbytes), first, last, "temp", name)
                 for n, (first, last) in lives.items()]
        buffers += sorted(temps, key=lambda b: (b.offset, b.first))
        region = max(region, region_bytes(starts))
        peak = max(peak, peak_live_bytes(lives, len(order)))
    return MemoryPlan(buffers, dict(schedules), base, base + region, base + peak,
                      sum(b.size for b in buffers), note, chains=chains)


def persistent_nodes(schedules, persistent) -> list[Node]:
    """Buffers of the persistent region, in layout order (a persistent view keeps its source instead)."""
    seen = [n for order in schedules.values() for n in order if n.op in PERSISTENT_KINDS]
    seen += [storage_root(n) for n in persistent]
    kinds = {kind: i for i, kind in enumerate(PERSISTENT_KINDS)}
    unique = [n for n in dict.fromkeys(seen) if not is_literal(n)]
    return sorted(unique, key=lambda n: kinds.get(n.op, len(kinds)))


CONCURRENT_SLACK = 1.05
NO_KERNEL = {"placeholder", "variable", "constant", "reshape", "group_output"}   # steps that launch nothing


def step_writes(node: Node) -> list[Node]:
    """The values a schedule step's kernel writes: a group's results, a plain op's value; nothing for a step
    that launches no kernel."""
    if node.op == "fused":
        return node.attrs["group"].results
    return [] if node.op in NO_KERNEL else [node]


def step_values(node: Node) -> list[Node]:
    """The values a schedule step writes, then those it reads."""
    if node.op == "fused":
        return [*node.attrs["group"].results, *node.inputs]
    if node.op == "group_output":
        return []                 # written by its fused node's step
    return [node, *node.inputs]


def liveness(order: list[Node], persistent: set, chains=()) -> dict[Node, tuple[int, int]]:
    """Temporary buffer -> (step that writes it, last step that reads it, directly or through a view). A
    chain's stages are one kernel whose blocks run them at different times: what a stage touches lives from
    the chain's first step to its last."""
    span = {}
    for stages in chains:
        steps = [order.index(s) for s in stages]
        span.update((s, (min(steps), max(steps))) for s in steps)
    lives = {}
    for step, node in enumerate(order):
        first, last = span.get(step, (step, step))
        for n in step_values(node):
            root = storage_root(n)
            if root not in persistent and not is_literal(root):
                lives[root] = (min(lives.get(root, (first,))[0], first), last)
    return lives


PLACEMENT_ORDERS = {   # (node, first, last) -> sort key; ties fall back to the schedule order
    "largest first": lambda n, first, last: (-n.nbytes, first),
    "earliest first": lambda n, first, last: (first, -n.nbytes),
    "longest-lived first": lambda n, first, last: (first - last, -n.nbytes, first),
}


def ordered_before(order: list[Node]) -> list[int]:
    """For each step, the set of steps that must run before it (a bitset): through the values it reads, and
    for a step that writes a variable, through every earlier step reading the variable's old value."""
    writer, readers, before = {}, {}, []
    for step, node in enumerate(order):
        values, written = step_values(node), step_writes(node)
        mask = 0
        for n in values:
            root = storage_root(n)
            if n in written:
                for r in readers.get(root, ()):
                    mask |= before[r] | (1 << r)
            elif root in writer:
                w = writer[root]
                mask |= before[w] | (1 << w)
        before.append(mask)
        for n in values:
            root = storage_root(n)
            if n in written:
                writer[root] = step
            else:
                readers.setdefault(root, []).append(step)
    return before


def first_fit(lives: dict, key, before: list[int] | None = None) -> dict[Node, int]:
    """Node -> offset within the temporary region, placing buffers in the order `key` gives, each at the
    lowest offset that overlaps no placed buffer live at the same time. With `before` (ordered_before),
    two buffers share bytes only when the first one's last reader must run before the other's writer."""
    def clash(first, last, f, l):
        if f <= last and first <= l:
            return True
        if before is None:
            return False
        return not (before[first] >> l & 1) if l < first else not (before[f] >> last & 1)
    starts, placed = {}, []   # placed: (start, end, first, last)
    for n, (first, last) in sorted(lives.items(), key=lambda item: key(item[0], *item[1])):
        size, start = aligned(n.nbytes), 0
        for lo, hi in sorted((lo, hi) for lo, hi, f, l in placed if clash(first, last, f, l)):
            if start + size <= lo:
                break
            start = max(start, hi)
        starts[n] = start
        placed.append((start, start + size, first, last))
    return starts


def region_bytes(starts: dict) -> int:
    return max((start + aligned(n.nbytes) for n, start in starts.items()), default=0)


def peak_live_bytes(lives: dict, steps: int) -> int:
    change = np.zeros(steps + 1, dtype=np.int64)
    for n, (first, last) in lives.items():
        change[first] += aligned(n.nbytes)
        change[last + 1] -= aligned(n.nbytes)
    return int(np.cumsum(change).max(initial=0))


def check_plan(plan: MemoryPlan) -> None:
    """Prove the plan safe without trusting how it was made; raise PlanError naming the buffers at fault.

    Every buffer is aligned, inside the arena and large enough; leaves live in persistent buffers; every
    read and write of every schedule step falls inside the lifetime of a buffer of that schedule (or a
    persistent one); and no two buffers that share a step (persistent ones share every step of every
    schedule) share a byte."""
    for b in plan.buffers:
        inside = 0 <= b.offset <= b.end <= plan.arena_bytes
        if b.offset % ALIGN or b.size % ALIGN or b.size < b.needed or not inside:
            raise PlanError(f"buffer {b.name} at [{b.offset}, {b.end}) for {b.needed} bytes is misaligned, "
                            f"too small or outside the arena of {plan.arena_bytes} bytes")
    owner = {(b.schedule, b.node): b for b in plan.buffers}
    for name, order in plan.schedules.items():
        for step, node in enumerate(order):
            for n in step_values(node):
                root = storage_root(n)
                b = owner.get((None, root)) or owner.get((name, root))
                if b is None and not is_literal(root):
                    raise PlanError(f"schedule {name} step {step}: {n.name} has no buffer")
                if b is None or b.first is None:
                    continue
                if root.op in PERSISTENT_KINDS:
                    raise PlanError(f"{root.op} {root.name} must have a persistent buffer, not a temporary")
                if not b.first <= step <= b.last:
                    raise PlanError(f"schedule {name} step {step}: {node.name} uses buffer {b.name} outside its "
                                    f"lifetime {b.first}..{b.last}")
    bufs = [b for b in plan.buffers if b.size]
    always = np.array([b.first is None for b in bufs])
    run = np.array([b.schedule or "" for b in bufs])
    space = overlapping([b.offset for b in bufs], [b.end for b in bufs])
    time = overlapping([b.first or 0 for b in bufs], [np.inf if b.last is None else b.last + 1 for b in bufs])
    same_run = (run[:, None] == run[None, :]) | always[:, None] | always[None, :]
    clash = np.argwhere(np.triu(space & time & same_run, k=1))
    if len(clash):
        a, b = (bufs[i] for i in clash[0])
        raise PlanError(f"buffers {a.name} [{a.offset}, {a.end}) and {b.name} [{b.offset}, {b.end}) overlap "
                        f"while both are live ({describe_life(a)}; {describe_life(b)})")


def overlapping(lo, hi) -> np.ndarray:
    """Matrix of which half-open intervals [lo, hi) intersect."""
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    return (lo[:, None] < hi[None, :]) & (lo[None, :] < hi[:, None])


def describe_life(b: Buffer) -> str:
    return f"{b.name}: persistent" if b.first is None else f"{b.name}: {b.schedule} steps {b.first}..{b.last}"
