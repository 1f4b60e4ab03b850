"""fuse: chains of elementwise ops, broadcasts and reductions along one set of axes become ONE kernel each.

`fuse(graphs)` takes the simplified graphs ({"train": outputs, "eval": outputs}) and returns them with every
group replaced by one `fused` node (inputs: the values the group reads from outside) and one `group_output`
node per value that leaves the group (its buffer, written by the group's kernel). Values internal to a group
are no nodes of the returned graph, so plan_memory never allocates them.

Steps:
1. expand: softmax, log_softmax and softmax_cross_entropy become reductions and elementwise ops, and
   relu_grad(x, g) reads relu(x) where the graph has it (x > 0 exactly where relu(x) > 0), so the
   pre-activation stays internal to the forward GEMM's epilogue. `simplify` then merges the copies (the
   loss and its gradient share one max and one sum). A reduction that would run on fewer than FEW_BLOCKS
   blocks of SPLIT_WORK elements or more each (an MSE over a whole output, a bias gradient at a large
   batch) becomes two, over many shorter slices (`split_reduction`): a block's slices are its work.
   So does a GEMM A^T B over a long K with few tiles (a weight gradient at a large batch: `split_matmul`,
   a stack of GEMMs over parts of K and their sum).
2. group (vertical fusion), greedily in a topological order: a fusable node joins the group of an input,
   and may merge the groups of several inputs, when the result is
   - convex (no path leaves the group and comes back, each other group counting as one node; assigns
     count as reading after every other reader of their variable's old value),
   - needed by the same graphs (train, eval) — eval must not run training-only work,
   - placeable: one domain shape D and one set of reduced axes R for the whole group (`Layout`). A
     *rows* kernel walks the slices of D (the index over the kept axes): it reduces over R in phases (a
     reduction that needs another's result waits one phase), then computes the elementwise outputs of the
     slice. Values constant over a slice (reductions, per-slice maps) are computed once per slice; means of
     per-slice values over all slices ("global", e.g. the batch-mean loss) at the end (one block).
     A group without reductions is a map (R = ()).
   Identical reductions of one input share an accumulator in the kernel (a sum and a mean of x: one sum).
   A reduction does not join a map that reads a matmul result, so that map can become the GEMM's epilogue.
3. epilogues: a map group that is the only reader of a matmul result, reading it at the same index,
   becomes that matmul's GEMM epilogue (bias + ReLU; the ReLU mask of the backward; SGD updates of the
   weight whose gradient the GEMM computes), unless it writes a buffer the GEMM reads.
4. horizontal fusion: independent groups that assign variables (the optimizer's updates, the bias
   gradients feeding them) become one `multi` kernel over a table of segments.

Left to later passes: the order of the groups (schedule), their buffers (plan_memory), the C code and
launch shapes of each kernel (lower).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from .. import graph as G
from ..errors import GCompileError
from ..graph import Node
from ..ops import Op, get_op, register
from ..ops.elementwise import Elementwise
from .schedule import dependences, old_value_of
from .simplify import simplify

REDUCTIONS = ("reduce_sum", "reduce_mean", "reduce_max")
MAPS = ("cast", "broadcast_to", "one_hot", "zeros_like", "ones_like", "transpose", "assign", "reshape")


# ---------------------------------------------------------------------------------------------
# The nodes a group becomes
# ---------------------------------------------------------------------------------------------
@register
class Fused(Op):
    """fused(inputs...) {group}: the group's kernel. Its values are the group_output nodes reading it."""
    name, differentiable = "fused", False

    def infer(self, node):
        return (), "float32"

    def writes(self, node):
        return node.attrs["group"].variables


@register
class GroupOutput(Op):
    """group_output(fused) {index}: a value the group's kernel writes into its own buffer — or, for an assign,
    the variable after the step (its buffer is the variable's)."""
    name, differentiable = "group_output", False

    def infer(self, node):
        member = written_member(node)
        return member.shape, member.dtype


def written_member(result: Node) -> Node:
    """The group member a group_output node holds."""
    return result.inputs[0].attrs["group"].outputs[result.attrs["index"]]


# ---------------------------------------------------------------------------------------------
# Index arithmetic: where a value lives at a point of the domain
# ---------------------------------------------------------------------------------------------
def strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def broadcast_coefficients(in_shape, out_shape) -> list[int]:
    """Strides of the input, aligned to the output's dimensions, 0 where the input is broadcast."""
    lead = len(out_shape) - len(in_shape)
    st = strides(in_shape)
    return [0 if d < lead or in_shape[d - lead] == 1 else st[d - lead] for d in range(len(out_shape))]


def broadcasts_to(shape, target) -> bool:
    return len(shape) <= len(target) and all(s in (1, t) for s, t in zip(shape[::-1], target[::-1]))


@dataclass
class Layout:
    """How a group's kernel walks its domain. Every member has coefficients over the domain's axes: its
    flat index at point p of the domain is sum_d coef[d] * p[d] (0 on the axes it is broadcast along).
    Its context says where it is computed: per element of the domain, once per slice (constant along the
    reduced axes), or once for the whole group after every slice ("global")."""
    domain: tuple
    axes: tuple                                   # reduced axes of the domain; () for a map
    coef: dict = field(default_factory=dict)      # member -> coefficients
    context: dict = field(default_factory=dict)   # member -> "element" | "slice" | "global"
    level: dict = field(default_factory=dict)     # member -> reduction phases it waits for

    @property
    def kept(self) -> tuple:
        return tuple(d for d in range(len(self.domain)) if d not in self.axes)

    @property
    def kept_shape(self) -> tuple:
        return tuple(self.domain[d] for d in self.kept)

    @property
    def slices(self) -> int:
        return int(np.prod(self.kept_shape, dtype=np.int64))

    @property
    def length(self) -> int:
        return int(np.prod([self.domain[d] for d in self.axes], dtype=np.int64))

    def identity(self) -> list[int]:
        return broadcast_coefficients(self.domain, self.domain)

    def slice_identity(self) -> list[int]:
        return self.spread(broadcast_coefficients(self.kept_shape, self.kept_shape), list(self.kept))

    def spread(self, per_axis, axis_map) -> list[int]:
        out = [0] * len(self.domain)
        for c, d in zip(per_axis, axis_map):
            out[d] = c if self.domain[d] != 1 else 0
        return out

    def axis_map(self, shape) -> list[int] | None:
        """The domain axis each axis of a value of `shape` runs along: numpy broadcasting (right-aligned), or
        the kept axes for a value of the kept dimensions only (a reduction without keepdims)."""
        if broadcasts_to(shape, self.domain):
            return list(range(len(self.domain) - len(shape), len(self.domain)))
        if self.axes and tuple(shape) == self.kept_shape:
            return list(self.kept)
        return None

    def natural(self, shape) -> list[int] | None:
        amap = self.axis_map(shape)
        return None if amap is None else self.spread(broadcast_coefficients(shape, shape), amap)

    def operand_coef(self, m: Node, k: int) -> list[int] | None:
        """Coefficients at which member m reads its k-th input (None: m does not fit the domain)."""
        x = m.inputs[k]
        if m.op in ("reshape", "assign"):          # same flat index as the result
            return self.coef[m]
        if m.op in REDUCTIONS:
            return self.identity() if self.context[m] != "global" else self.slice_identity()
        if m.op == "matmul":
            return None                            # read by the GEMM itself
        amap = self.axis_map(m.shape)
        if amap is None:
            return None
        if m.op == "one_hot":
            per_axis = broadcast_coefficients(x.shape, x.shape) + [0]
        elif m.op == "transpose":
            xs = strides(x.shape)
            per_axis = [xs[p] if m.shape[e] != 1 else 0 for e, p in enumerate(m.attrs["perm"])]
        else:
            per_axis = broadcast_coefficients(x.shape, m.shape)
        return self.spread(per_axis, amap)


def is_reduction_of(m: Node, layout: Layout) -> bool:
    """m reduces the domain over the layout's axes (as opposed to a global reduction of per-slice values)."""
    return m.inputs[0].shape == layout.domain and m.attrs["axes"] == layout.axes


def place(members: list[Node], gemm: Node | None = None) -> Layout | None:
    """The layout of a group (members in topological order), or None when they cannot be one kernel.
    Any member may be needed outside: its kernel writes it wherever it is computed (a value smaller than
    the domain by the threads at coordinate 0 of the axes it is broadcast along)."""
    inside = set(members)
    reductions = [m for m in members if m.op in REDUCTIONS]
    if gemm is not None:
        if reductions:
            return None
        layout = Layout(tuple(gemm.shape), ())
    elif reductions:
        main = max(reductions, key=lambda r: r.inputs[0].size)
        layout = Layout(tuple(main.inputs[0].shape), tuple(main.attrs["axes"]))
    else:
        layout = Layout(tuple(max((m.shape for m in members), key=lambda s: int(np.prod(s, dtype=np.int64)))), ())
    coef, context, level = layout.coef, layout.context, layout.level
    for m in members:
        operands = [(k, x) for k, x in enumerate(m.inputs) if not (m.op == "assign" and k == 0)]
        internal = [x for _, x in operands if x in inside]
        if m.op == "matmul":
            if m is not gemm:
                return None
            coef[m], context[m], level[m] = layout.identity(), "slice", 0
            continue
        if m.op == "reshape":
            if not internal:
                return None
            x = internal[0]
            coef[m], context[m], level[m] = coef[x], context[x], level[x]
            continue
        if m.op in REDUCTIONS:
            x = m.inputs[0]
            if is_reduction_of(m, layout):
                # a slice reduction reads its input in the slice loop: not a global value, computed after it
                # (a domain of size-1 axes gives both the same coefficients)
                if x in inside and (coef[x] != layout.identity() or context[x] == "global"):
                    return None
                coef[m], context[m] = layout.slice_identity(), "slice"
                level[m] = (level[x] if x in inside else 0) + 1
            elif (x in inside and context[x] == "slice" and coef[x] == layout.slice_identity()
                  and x.size == layout.slices and len(m.attrs["axes"]) == x.ndim):
                coef[m], context[m], level[m] = [0] * len(layout.domain), "global", level[x]
            else:
                return None
            continue
        if any(context[x] == "global" for x in internal):
            if m.size != 1 or any(context[x] != "global" for x in internal):
                return None
            coef[m], context[m] = [0] * len(layout.domain), "global"
        else:
            target = m.inputs[1] if m.op == "assign" else m
            if m.op == "assign" and target in inside:
                coef[m] = coef[target]
            else:
                if m.op in ("one_hot", "transpose") and internal:
                    return None          # they read their input at an index of their own, not the domain's
                coef[m] = layout.natural(target.shape)
                if coef[m] is None:
                    return None
            context[m] = "element" if any(coef[m][d] for d in layout.axes) else "slice"
        level[m] = max((level[x] for x in internal), default=0)
        for k, x in operands:
            if x in inside and layout.operand_coef(m, k) != coef[x]:
                return None
    for a in (m for m in members if m.op == "assign"):
        if not writes_safely(a, members, layout, gemm):
            return None
    return layout


def writes_safely(a: Node, members: list[Node], layout: Layout, gemm: Node | None) -> bool:
    """assign a writes its variable in place: safe when every read of the variable's old value in the group
    happens in the same thread, at the same index, before the write — reads at the written element only,
    in the written element's context, and each element written by one thread (an identity layout)."""
    var = a.inputs[0]
    if gemm is not None and any(old_value_of(i) is var for i in gemm.inputs):
        return False
    reads = [(m, k) for m in members for k, x in enumerate(m.inputs)
             if old_value_of(x) is var and not (m.op == "assign" and k == 0)]
    if not reads:
        return True
    ctx = layout.context[a]
    own = {"element": layout.identity(), "slice": layout.slice_identity()}.get(ctx)
    if own is None or layout.coef[a] != own:
        return False
    for m, k in reads:
        read_ctx = "element" if m.op in REDUCTIONS and layout.context[m] == "slice" else layout.context[m]
        if read_ctx != ctx or layout.operand_coef(m, k) != own:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------------------------
@dataclass(eq=False)
class Group:
    """Nodes computed by one kernel. kind: "rows" (maps and reductions), "gemm" (a matmul and its epilogue,
    the matmul first) or "multi" (independent rows groups launched together, its `segments`)."""
    id: int | str
    kind: str
    members: list[Node]
    layout: Layout | None = None
    segments: list["Group"] = field(default_factory=list)
    outputs: list[Node] = field(default_factory=list)      # members read outside or graph outputs
    results: list[Node] = field(default_factory=list)      # their group_output nodes, in the same order
    external: dict = field(default_factory=dict)           # input read from outside -> the node holding it

    @property
    def assigns(self) -> list[Node]:
        return [m for m in self.members if m.op == "assign"]

    @property
    def variables(self) -> list[Node]:
        return [a.inputs[0] for a in self.assigns]

    def result_of(self, member: Node) -> Node:
        return self.results[self.outputs.index(member)]

    def describe(self) -> str:
        return f"g{self.id}"

    def kernel_text(self) -> str:
        """What the group's kernel is, in a few words."""
        if self.kind == "multi":
            return f"one kernel over {len(self.segments)} segments " + ", ".join(s.describe() for s in self.segments)
        lay = self.layout
        if self.kind == "gemm":
            shape = "x".join(map(str, self.members[0].shape))
            return f"GEMM {shape} with an epilogue of {len(self.members) - 1} node(s)"
        if not lay.axes:
            return f"map over {lay.slices} elements of {list(lay.domain)}"
        phases = max((lay.level[m] for m in self.members if m.op in REDUCTIONS), default=0)
        last = ", then a global reduction" if "global" in lay.context.values() else ""
        return (f"{lay.slices} slices of {lay.length} (reduced axes {list(lay.axes)} of {list(lay.domain)}), "
                f"{phases} reduction phase(s){last}")

    def summary(self, indent: str = "", kernels: dict | None = None) -> str:
        """The group as `inspect --after fuse` shows it: kernel, members, what it writes; `kernels`: group name
        -> the names of the kernels lower made of it."""
        head = f"{indent}{self.describe()} {self.kind}: {self.kernel_text()}"
        if kernels and kernels.get(self.describe()):
            head += f"\n{indent}    kernel:  {', '.join(kernels[self.describe()])}"
        if self.segments:
            return "\n".join([head] + [s.summary(indent + "  ") for s in self.segments])
        leaving = [m.name for m in self.outputs if m.op != "assign"] + [f"{v.name} (assigned)" for v in self.variables]
        return (f"{head}\n{indent}    members: {', '.join(m.name for m in self.members)}"
                f"\n{indent}    writes:  {', '.join(leaving)}")


def epilogue_candidate(g: Group) -> bool:
    """A map reading a matmul result: it may become the GEMM's epilogue, which a reduction would prevent."""
    return (not any(m.op in REDUCTIONS for m in g.members)
            and any(i.op == "matmul" for m in g.members for i in m.inputs))


def fusable(n: Node) -> bool:
    """Whether n may join a group: not a split's view (split_view), which stays a view of its input's buffer."""
    return (n.op in REDUCTIONS or n.op in MAPS or isinstance(get_op(n.op), Elementwise)) and not n.attrs.get("view")


def fuse(graphs: dict[str, list[Node]]) -> tuple[dict[str, list[Node]], list[Group]]:
    """The graphs with every group replaced by its fused node, and the groups (in topological order)."""
    names = list(graphs)
    flat = [o for g in names for o in graphs[g]]
    flat = simplify(expand(flat))
    outs, start = {}, 0
    for g in names:
        outs[g], start = flat[start:start + len(graphs[g])], start + len(graphs[g])
    return Grouping(outs).run()


class Grouping:
    """The grouping of one set of graphs: the processing order, the dependences (data and assign order),
    and the groups formed so far (`group_of`)."""

    def __init__(self, graphs: dict[str, list[Node]]):
        self.graphs = graphs
        everything = [o for outs in graphs.values() for o in outs]
        deps = dependences(everything)           # node -> what must run before it (data and assign order)
        deps.remove_node("outputs")
        position = {n: k for k, n in enumerate(G.topological_order(everything))}
        self.order = list(nx.lexicographical_topological_sort(deps.reverse(copy=False), key=position.get))
        self.prereqs = {n: list(deps.successors(n)) for n in self.order}
        self.users = {n: [] for n in self.order}
        for n in self.order:
            for i in dict.fromkeys(n.inputs):
                self.users[i].append(n)
        self.graph_outputs = set(everything)
        reach = {g: set(G.topological_order(outs)) for g, outs in graphs.items()}
        self.needed_by = {n: frozenset(g for g in graphs if n in reach[g]) for n in self.order}
        self.successors = {n: [] for n in self.order}     # what must run after n (data and assign order)
        for n in self.order:
            for d in self.prereqs[n]:
                self.successors[d].append(n)
        self.placed = set()                              # the nodes seen so far, in order
        self.group_of: dict[Node, Group] = {}
        self.count = 0

    # --- checks -------------------------------------------------------------------------------
    def is_output(self, members) -> callable:
        inside = set(members)
        return lambda m: m in self.graph_outputs or any(u not in inside for u in self.users[m])

    def convex(self, members) -> bool:
        """No path leaves the group and comes back, each other group counting as one node (whatever reaches
        one of its members runs before all of them, and all of them before what follows any). Only nodes
        placed so far can lead back: later ones come after every member."""
        inside = set(members)
        stack = [u for m in members for u in self.successors[m] if u not in inside and u in self.placed]
        seen = set(stack)
        while stack:
            v = stack.pop()
            group = self.group_of.get(v)
            for u in self.successors[v] + (group.members if group else []):
                if u in inside:
                    return False
                if u not in seen and u in self.placed:
                    seen.add(u)
                    stack.append(u)
        return True

    def layout(self, members, gemm=None) -> Layout | None:
        if len({self.needed_by[m] for m in members}) != 1 or not self.convex(members):
            return None
        return place(members, gemm)

    def new_group(self, kind, members, layout) -> Group:
        self.count += 1
        g = Group(self.count - 1, kind, members, layout)
        for m in members:
            self.group_of[m] = g
        return g

    # --- the three steps ----------------------------------------------------------------------
    def run(self):
        position = {n: k for k, n in enumerate(self.order)}
        for n in self.order:
            self.placed.add(n)
            if fusable(n):
                self.join(n, position)
        self.epilogues()
        groups = sorted(set(self.group_of.values()), key=lambda g: position[g.members[0]])
        groups = self.horizontal(groups, position)
        for k, g in enumerate(groups):      # numbered in order, for stable printing
            g.id = k
            for j, s in enumerate(g.segments):
                s.id = f"{k}.{j}"
        return self.rebuild(), groups

    def join(self, n: Node, position):
        """Put n into the group of an input (merging the groups of several inputs where that works)."""
        candidates = list(dict.fromkeys(self.group_of[i] for i in n.inputs if i in self.group_of))
        members, layout = None, None
        for g in candidates:
            if n.op in REDUCTIONS and epilogue_candidate(g):
                continue
            trial = sorted(set(members or []) | set(g.members) | {n}, key=position.get)
            found = self.layout(trial)
            if found is not None:
                members, layout = trial, found
        if members is None:
            if n.op == "reshape":
                return                 # a view of a value computed elsewhere: no kernel
            members, layout = [n], self.layout([n])
            if layout is None:
                raise GCompileError(f"fuse: {n.describe()} ({n.op}) cannot be placed in a kernel of its own")
        self.new_group("rows", members, layout)

    def epilogues(self):
        for mm in (n for n in self.order if n.op == "matmul"):
            users = self.users[mm]
            groups = {self.group_of.get(u) for u in users}
            if not users or mm in self.graph_outputs or len(groups) != 1 or None in groups:
                continue
            g = groups.pop()
            if g.kind != "rows" or g.layout.axes:
                continue
            members = [mm] + g.members
            layout = self.layout(members, gemm=mm)
            # the GEMM stores one value per element in C: an output of the matmul's shape and dtype
            is_output = self.is_output(members)
            stored = layout is not None and any(
                (m.op == "assign" or is_output(m)) and layout.coef[m] == layout.identity() and m.dtype == mm.dtype
                and m.size == mm.size for m in g.members)
            if stored:
                g.kind, g.members, g.layout = "gemm", [mm] + g.members, layout
                self.group_of[mm] = g

    def horizontal(self, groups: list[Group], position) -> list[Group]:
        """Merge independent rows groups that assign variables into multi groups, greedily in order."""
        remaining = [g for g in groups if g.kind == "rows" and g.assigns]
        while remaining:
            dag = self.contracted(self.prereqs)
            reach = {g: nx.descendants(dag, g) for g in remaining}
            chosen, rest = [remaining[0]], []
            for g in remaining[1:]:
                independent = all(g not in reach[c] and c not in reach[g] for c in chosen)
                (chosen if independent else rest).append(g)
            remaining = rest
            if len(chosen) > 1:
                members = sorted((m for s in chosen for m in s.members), key=position.get)
                multi = self.new_group("multi", members, None)
                multi.segments = chosen
                groups = [g for g in groups if g not in chosen] + [multi]
        return sorted(groups, key=lambda g: position[g.members[0]])

    def contracted(self, edges: dict) -> nx.DiGraph:
        """The graph with each group as one vertex (ungrouped nodes stay themselves); `edges`: node -> the
        nodes it needs."""
        key = lambda n: self.group_of.get(n, n)  # noqa: E731
        dag = nx.DiGraph()
        for n in self.order:
            dag.add_node(key(n))
            dag.add_edges_from((key(d), key(n)) for d in edges[n] if key(d) is not key(n))
        return dag

    def rebuild(self) -> dict[str, list[Node]]:
        """The outer graphs: each group becomes a fused node and group_output nodes for what it writes."""
        position = {n: k for k, n in enumerate(self.order)}
        first = lambda v: position[v.members[0] if isinstance(v, Group) else v]  # noqa: E731
        outer: dict[Node, Node] = {}
        dag = self.contracted({n: n.inputs for n in self.order})       # groups are convex: a DAG
        for v in nx.lexicographical_topological_sort(dag, key=first):
            if isinstance(v, Group):
                self.close(v, outer)
            else:
                inputs = tuple(outer[i] for i in v.inputs)
                outer[v] = G.rebuilt(v, inputs)
        return {g: [outer[o] for o in outs] for g, outs in self.graphs.items()}

    def close(self, g: Group, outer: dict):
        is_output = self.is_output(g.members)
        inside = set(g.members)
        parts = g.segments or [g]
        reads = [x for m in g.members for x in m.inputs if x not in inside]
        g.external = {x: outer[x] for x in dict.fromkeys(reads)}
        g.outputs = [m for m in g.members if is_output(m)]
        name = (g.outputs or g.assigns)[-1].name
        fused = Node("fused", tuple(g.external.values()), {"group": g}, name=f"fused_{name}")
        g.results = [Node("group_output", (fused,), {"index": k}, name=m.name) for k, m in enumerate(g.outputs)]
        for s in g.segments:
            s.external = g.external
            s.outputs = [m for m in s.members if m in g.outputs]
            s.results = [g.result_of(m) for m in s.outputs]
        for part in parts:
            for m in part.members:
                if m in g.outputs:
                    outer[m] = part.result_of(m)


def describe_groups(groups: list[Group], kernels: dict | None = None) -> str:
    return "\n".join(g.summary(kernels=kernels) for g in groups)


# ---------------------------------------------------------------------------------------------
# expand: row-wise ops as reductions and maps, so they fuse with what surrounds them
# ---------------------------------------------------------------------------------------------
def expand_softmax(n, x):
    e = G.exp(x - G.reduce_max(x, n.attrs["axis"], keepdims=True))
    return e / G.reduce_sum(e, n.attrs["axis"], keepdims=True)


def expand_log_softmax(n, x):
    shifted = x - G.reduce_max(x, n.attrs["axis"], keepdims=True)
    return shifted - G.log(G.reduce_sum(G.exp(shifted), n.attrs["axis"], keepdims=True))


def expand_softmax_cross_entropy(n, logits, labels):
    """mean_b(logsumexp(logits[b]) - logits[b, label]); the label's logit is a sum against one_hot divided by
    the number of hits, so a label outside [0, classes) gives NaN (0 / 0), as the op's own kernel did."""
    top = G.reduce_max(logits, 1, keepdims=True)
    lse = G.log(G.reduce_sum(G.exp(logits - top), 1, keepdims=True)) + top
    hot = G.one_hot(labels, logits.shape[1], logits.dtype)
    picked = G.reduce_sum(logits * hot, 1, keepdims=True) / G.reduce_sum(hot, 1, keepdims=True)
    return G.reduce_mean(lse - picked)


EXPANSIONS = {"softmax": expand_softmax, "log_softmax": expand_log_softmax,
              "softmax_cross_entropy": expand_softmax_cross_entropy}


# A reduction whose blocks would be few (FEW_BLOCKS) and each take SPLIT_WORK elements or more is split in
# two (split_reduction): a kernel's block takes one long contiguous slice, or 8 strided ones side by side
# (lower.threads), however long, and the cpu's thread one slice — an MSE over a (4096, 1024) output was one
# block reading 32 MB, a bias gradient at batch 65536 with 64 columns 8 blocks of 512K elements. Below
# SPLIT_WORK a block's slices cost less than the kernel the split adds (a softmax over (4, 40000): 4 blocks).
SPLIT_WORK = 1 << 18
FEW_BLOCKS = 128
LONG_SLICE = 1 << 15    # the inner reduction's slices are shorter
SPLIT_MIN = 32          # and at least this long


def split_view(x: Node, shape) -> Node:
    """reshape(x, shape) that stays a view of x's buffer: a split's, kept out of groups (fusable), where as a
    member it was written to a buffer of its own beside x's (a second copy of x)."""
    return Node("reshape", (x,), {"shape": tuple(shape), "view": True}, name=f"{x.name}_view")


def split_reduction(n: Node, x: Node) -> Node | None:
    """n = reduce(x) over long slices on few blocks as two reductions, or None where it stays one: the inner
    over the trailing reduced axes whose slices are SPLIT_MIN to LONG_SLICE long (many of them), then the
    outer over the rest (split again where it is long on few blocks itself). Where no trailing axes are, the
    reduced axis at which the trailing length reaches LONG_SLICE is first reshaped into two (split_view),
    (m / d, d), the inner taking d and the axes after it, d * (their length) at least SPLIT_MIN and about
    sqrt(the slice's length) (d a divisor of m: where none fits, not split). A reduction over every axis so
    becomes a per-slice reduction and a global one: one kernel on as many blocks as the slices need. Sums
    and maxima keep their values up to the order of the sums; a mean of means is the mean (every inner slice
    has the same count), for floats only (an integer mean truncates). The new nodes are named after n."""
    axes, keep = tuple(n.attrs["axes"]), n.attrs["keepdims"]
    length = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    slices = x.size // max(length, 1)
    per = min(8, slices) if x.ndim - 1 not in axes else 1     # the innermost axis kept: 8 slices a block
    if length * per < SPLIT_WORK or slices // per >= FEW_BLOCKS:
        return None
    if n.op == "reduce_mean" and x.dtype not in G.FLOAT_DTYPES:
        return None
    reduce = {"reduce_sum": G.reduce_sum, "reduce_mean": G.reduce_mean, "reduce_max": G.reduce_max}[n.op]
    sizes = [x.shape[a] for a in axes]
    trailing = [int(np.prod(sizes[k:], dtype=np.int64)) for k in range(len(axes))]   # of axes[k:]
    cut = next((k for k in range(1, len(axes)) if SPLIT_MIN <= trailing[k] < LONG_SLICE), None)
    if cut is None:     # no such axes: the reduced axis where the trailing length reaches LONG_SLICE is cut in two
        k = max((k for k in range(len(axes)) if trailing[k] >= LONG_SLICE), default=0)
        a, rest = axes[k], trailing[k] // sizes[k]            # the axis and the length of the axes after it
        top = min(math.isqrt(trailing[k]), LONG_SLICE - 1) // rest
        d = next((d for d in range(min(top, sizes[k] - 1), 1, -1) if sizes[k] % d == 0 and d * rest >= SPLIT_MIN),
                 None)
        if d is None:
            return None
        x = split_view(x, x.shape[:a] + (sizes[k] // d, d) + x.shape[a + 1:])
        axes, cut = axes[:k] + (a, a + 1) + tuple(b + 1 for b in axes[k + 1:]), k + 1
    inner = reduce(x, axes[cut:], keepdims=keep)
    inner.name = f"{n.name}_inner"
    # kept, the inner axes are 1s the outer reduces too (a reduction over every axis of the inner values is
    # what fuse makes a global one); dropped, they come after every outer axis, whose indices stay the same
    outer = reduce(inner, axes if keep else axes[:cut], keepdims=keep)
    outer.name = f"{n.name}_outer"
    outer = split_reduction(outer, inner) or outer
    if outer.shape != n.shape:
        outer = G.reshape(outer, n.shape)
        outer.name = f"{n.name}_shaped"
    return outer


# A GEMM A^T B over K of LONG_K or more (a weight gradient at a large batch, K the batch) whose tiles are few
# keeps few blocks: a tile's K is split at most 8 ways (a cluster), so each block walks K / 8. split_matmul
# makes it a stack of GEMMs over K / S each and their sum.
LONG_K = 1 << 14
STACK_BLOCKS = 256      # about what the stack's tiles come to (64 x 64 tiles)
GATHERED_MAX = 16 << 20   # an image input A of more bytes is not stacked: the trainer would gather it (below)


def split_matmul(n: Node, a: Node, b: Node) -> Node | None:
    """C = A^T B (A (K, M), B (K, N): their K axes lead, so a view makes the stack) over a long K with fewer
    than FEW_BLOCKS blocks at split 8, as reduce_sum(A_s^T B_s over s): S stacked GEMMs over K / S, S a
    divisor of K near STACK_BLOCKS / (the tiles of C), at least 2 and K / S at least 256; or None (other
    transposes, stacks, short K, no such divisor, and A an image input of more than GATHERED_MAX bytes: the
    trainer reads the image input in place only as a plain GEMM's A, plan_memory.batch_rows, and gathers it
    into a buffer of the arena otherwise — a regression's (65536, 16) x, 4 MB, pays for its stack; logistic
    regression's (20000, 784), 63 MB, would not). The sum over s is a short reduction per element of C (S of
    them), which takes the epilogue's work (an SGD update) with it."""
    if a.ndim != 2 or b.ndim != 2 or not n.attrs["trans_a"] or n.attrs["trans_b"]:
        return None
    if a.op == "placeholder" and a.nbytes > GATHERED_MAX:
        return None
    (k, m), cols = a.shape, b.shape[1]
    tiles = math.ceil(m / 64) * math.ceil(cols / 64)
    if k < LONG_K or tiles * 8 >= FEW_BLOCKS:
        return None
    want = max(2, STACK_BLOCKS // tiles)
    stacks = [s for s in range(2, min(2 * want, k // 256) + 1) if k % s == 0]
    if not stacks:
        return None
    s = min(stacks, key=lambda s: (abs(s - want), s))
    part = G.matmul(split_view(a, (s, k // s, m)), split_view(b, (s, k // s, cols)), trans_a=True)
    part.name = f"{n.name}_stack"
    return G.reduce_sum(part, 0)


def expand(outputs: list[Node]) -> list[Node]:
    order = G.topological_order(outputs)
    activated = {n.inputs[0] for n in order if n.op == "relu"}
    new: dict[Node, Node] = {}
    for n in order:
        inputs = tuple(new[i] for i in n.inputs)
        if n.op in EXPANSIONS:
            first = next(G.NODE_IDS)   # (the nodes the expansion makes come after it)
            with G.phase(n.phase):     # (the nodes an expansion makes are of the phase of what they expand)
                m = EXPANSIONS[n.op](n, *inputs)
            made = [x for x in G.topological_order([m]) if x.id > first]
            for k, x in enumerate(made):    # named after what they expand, not the process's node count
                x.name = f"{n.name}_{x.op}_{k}"
            m.name = n.name
        elif n.op == "relu_grad" and n.inputs[0] in activated:
            with G.phase(n.phase):
                m = Node("relu_grad", (G.relu(inputs[0]), inputs[1]), name=n.name)
        else:
            m = G.rebuilt(n, inputs)
        new[n] = m
    return split_reductions([new[o] for o in outputs])


def split_reductions(outputs: list[Node]) -> list[Node]:
    """The graph with every reduction split_reduction splits (the expansions' ones included) and every GEMM
    split_matmul splits split."""
    new: dict[Node, Node] = {}
    for n in G.topological_order(outputs):
        inputs = tuple(new[i] for i in n.inputs)
        m = None
        if n.op in REDUCTIONS or n.op == "matmul":
            with G.phase(n.phase):
                m = (split_reduction if n.op in REDUCTIONS else split_matmul)(n, *inputs)
        if m is None:
            m = G.rebuilt(n, inputs)
        m.name = n.name
        new[n] = m
    return [new[o] for o in outputs]
