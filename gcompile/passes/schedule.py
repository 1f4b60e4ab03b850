"""schedule: one deterministic order of every node reachable from the outputs, chosen to keep memory low.

Constraints (a networkx DiGraph from each node to what must run before it):
- every node after its inputs;
- every `assign(var, value)` (and every fused node holding one) after every other node that reads var's
  old value (var itself, or a reshape view of var): the assign overwrites var's buffer in place. A cycle
  (two assigns to one variable, or a read of var's old value that needs the assign's result) cannot be
  scheduled and raises GCompileError naming the nodes on it.

Heuristic, among the nodes whose constraints are met:
1. the one that grows the live set least: its result's bytes minus the bytes of the inputs it is the last
   reader of, reads through a reshape counting as reads of the reshaped node (so frees come early and
   allocations late);
2. ties go to the earlier node of a depth-first order that visits the operand with the largest
   `need - size` first, `need` being the peak of live bytes while computing a node, estimated as if the
   graph were a tree: for operands c_1..c_k in that order, with S_j = size(c_1) + ... + size(c_j),
       need(n) = max(max over j of S_(j-1) + need(c_j),  S_k + size(n)).
   On trees this order (Sethi-Ullman, generalized by Liu) has the smallest peak: the memory-hungry
   operand goes first, while few results wait for it.
Rule 1 sees one step ahead, rule 2 whole subtrees but not sharing; together they handle both the forward
pass and the backward pass's shared activations. networkx has no topological sort whose priorities change
as nodes are placed, hence the loop below.

Leaves (placeholders, variables, constants) appear in the schedule: free and always ready, they come
first. They emit no code. Sizes here are estimates: leaves, reshapes (views) and assigns (they write their
variable) count 0. A fused node (a group's kernel, see fuse.py) allocates the buffers of its group_output
nodes, which then allocate nothing themselves. Left to plan_memory: the buffers, their exact liveness under
this order, their offsets.
"""
from __future__ import annotations

import networkx as nx

from .. import graph as G
from ..errors import GCompileError
from ..graph import Node
from ..ops import get_op

NO_BUFFER = ("placeholder", "variable", "constant", "reshape", "assign", "fused")


def schedule(outputs: list[Node]) -> list[Node]:
    deps = dependences(outputs)
    rank = {n: i for i, n in enumerate(nx.dfs_postorder_nodes(deps, source="outputs"))}
    deps.remove_node("outputs")
    readers_left = dict.fromkeys(deps, 0)
    for n in deps:
        for i in buffers_read(n):
            readers_left[i] += 1
    waiting_on = {n: deps.out_degree(n) for n in deps}
    ready = {n for n, count in waiting_on.items() if count == 0}
    order = []

    def growth(n: Node) -> int:
        return allocated(n) - sum(size(i) for i in buffers_read(n) if readers_left[i] == 1)

    while ready:
        n = min(ready, key=lambda n: (growth(n), rank[n]))
        ready.remove(n)
        order.append(n)
        for i in buffers_read(n):
            readers_left[i] -= 1
        for user in deps.predecessors(n):
            waiting_on[user] -= 1
            if waiting_on[user] == 0:
                ready.add(user)
    return order


def dependences(outputs: list[Node]) -> nx.DiGraph:
    """Node -> what must run before it, operands in the depth-first visiting order (hungriest first);
    a node named "outputs" depends on the outputs."""
    nodes = G.topological_order(outputs)
    deps, need = nx.DiGraph(), {}
    for n in nodes:
        operands = hungriest_first(dict.fromkeys(n.inputs), need)
        deps.add_node(n)
        deps.add_edges_from((n, c) for c in operands)
        need[n] = peak_need(operands, n, need)
    writers = {}
    for a in nodes:
        for var in get_op(a.op).writes(a):
            writers.setdefault(var, []).append(a)
    for var, by in writers.items():
        if len(by) > 1:
            raise GCompileError(f"schedule: variable {var.describe()} is assigned {len(by)} times in one step "
                                f"({', '.join(a.name for a in by)}); a variable can be assigned once a step (two "
                                f"batch_norms given the same running statistics, or a parameter updated twice)")
    readers = {}   # a value -> the nodes reading it unchanged (in the nodes' order, each once)
    for reader in nodes:
        for value in dict.fromkeys(old_value_of(i) for i in reader.inputs):
            readers.setdefault(value, []).append(reader)
    for var, (a,) in writers.items():
        deps.add_edges_from((a, reader) for reader in readers.get(var, ()) if reader is not a)
    if not nx.is_directed_acyclic_graph(deps):
        cycle = [user.name for user, _ in nx.find_cycle(deps)]
        raise GCompileError(f"schedule: cannot order {' needs '.join(cycle + cycle[:1])}: an assign must come "
                            f"after every read of its variable's old value, so its old and new value cannot "
                            f"meet in one computation")
    deps.add_edges_from(("outputs", c) for c in hungriest_first(dict.fromkeys(outputs), need))
    return deps


def size(n: Node) -> int:
    """Bytes of the buffer holding n's value (0: it has none of its own)."""
    return 0 if n.op in NO_BUFFER else n.nbytes


def allocated(n: Node) -> int:
    """Bytes the step computing n allocates: a fused node's outputs (an assign's is its variable), nothing
    for a group_output."""
    if n.op == "fused":
        group = n.attrs["group"]
        return sum(size(r) for r, m in zip(group.results, group.outputs) if m.op != "assign")
    return 0 if n.op == "group_output" else size(n)


def hungriest_first(operands, need) -> list[Node]:
    return sorted(operands, key=lambda c: need[c] - size(c), reverse=True)


def peak_need(operands, n: Node, need) -> int:
    waiting, peak = 0, 0
    for c in operands:
        peak = max(peak, waiting + need[c])
        waiting += size(c)
    return max(peak, waiting + allocated(n))


def buffers_read(n: Node) -> set:
    """The nodes whose results n reads: its inputs, seen through reshapes (views); a reshape reads nothing, nor
    does a group_output (its fused node wrote it)."""
    return set() if n.op in ("reshape", "group_output") else {old_value_of(i) for i in n.inputs}


def old_value_of(n: Node) -> Node:
    """The node whose value n shows unchanged: n itself, or the source of a chain of reshapes."""
    while n.op == "reshape":
        n = n.inputs[0]
    return n
