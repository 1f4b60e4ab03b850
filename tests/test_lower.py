"""lower: the map kernels' vector loop — which accesses move as 16-byte vectors (aligned operands read and
values stored at the element's own index), which stay per element (broadcast, transposed, misaligned,
guarded), where the scalar tail starts — and compiled results against numpy: cpu here, cuda behind the gpu
marker."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import gcompile as gc
from gcompile.passes.lower import BLOCK, VECTOR, lower
from gcompile.pipeline import compile_program

TILE = BLOCK * VECTOR
TARGETS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def broadcast_map():
    """(outputs, feeds): a map over (300, 70) = 20 whole tiles of 1024 and a tail of 520 elements, reading two
    operands at the element's index, a row, a column and a transposed operand."""
    r = np.random.RandomState(3)
    x, y = gc.placeholder("x", (300, 70)), gc.placeholder("y", (300, 70))
    row, col, t = gc.placeholder("row", (70,)), gc.placeholder("col", (300, 1)), gc.placeholder("t", (70, 300))
    out = gc.relu(x * y + row - col) + gc.transpose(t) * 0.5
    feeds = {n: r.uniform(-1, 1, n.shape).astype(np.float32) for n in (x, y, row, col, t)}
    return [out], feeds


def segments(outputs, plan=None) -> list[dict]:
    """The segments of the eval graph's fused kernels (lowered again over `plan` when one is given)."""
    src = compile_program(outputs, "cuda")
    kernels = lower(src.schedules, plan(src.plan) if plan else src.plan)["eval"]
    return [s for k in kernels if k.kind == "fused" for s in k.values["segments"]]


def pointers(moves) -> list[str]:
    return [a["pointer"] for a in moves]


def test_aligned_operands_move_as_vectors_and_the_tail_is_scalar():
    outputs, feeds = broadcast_map()
    (s,) = segments(outputs)
    v = s["vector"]
    assert (v["tiles"], s["start"], s["blocks"]) == (21000 // TILE, 21000 // TILE * TILE, 21000 // TILE)
    # x and y as vectors; the row, the column and the transpose per element, by their own index
    assert [a["name"] for a in v["loads"]] == ["in0", "in1"] and [a["name"] for a in v["stores"]] == ["out0"]
    body = "\n".join(v["body"])
    assert body.startswith("const float v0 = (float)((in0.v[j] * in1.v[j]));")
    assert "[((o % 70))]" in body and "[(o / 70)]" in body and "[(o / 70) + ((o % 70)) * 300]" in body
    assert v["body"][-1].startswith("out0.v[j] = ")


class Shifted:
    """The memory plan with one node's buffer moved by `by` bytes (plan_memory aligns every buffer to 256
    bytes, so this is how a misaligned operand can be made)."""

    def __init__(self, plan, name: str, by: int):
        self.plan, self.name, self.by = plan, name, by

    def offset_of(self, node, schedule=None):
        return self.plan.offset_of(node, schedule) + (self.by if node.name == self.name else 0)

    def __getattr__(self, attr):   # everything else as the plan has it
        return getattr(self.plan, attr)


def test_a_misaligned_operand_is_read_per_element():
    outputs, _ = broadcast_map()
    aligned = pointers(segments(outputs)[0]["vector"]["loads"])
    (s,) = segments(outputs, lambda plan: Shifted(plan, "x", 4))
    loads = pointers(s["vector"]["loads"])
    assert len(loads) == 1 and loads[0] == aligned[1]             # y still moves as a vector, x does not
    x_offset = int(aligned[0].split("A + ")[1].rstrip(")")) + 4
    assert f"((const float*)(A + {x_offset}))[o]" in "\n".join(s["vector"]["body"])


def test_maps_below_a_tile_and_rows_have_no_vector_loop():
    x = gc.placeholder("x", (TILE - 1,))
    m = gc.placeholder("m", (64, 512))
    outputs = [x * 2.0, gc.softmax(m), m - gc.reduce_sum(m)]
    assert [s["vector"] for s in segments(outputs)] == [None] * 3


def test_a_broadcast_store_is_guarded_per_element():
    """A map member smaller than the domain (a row written once) is stored by the lanes at coordinate 0."""
    x, row = gc.placeholder("x", (64, 128)), gc.placeholder("row", (128,))
    scaled = row * 3.0
    outputs = [x + scaled, scaled]
    (s,) = segments(outputs)
    assert len(s["vector"]["loads"]) == 1 and len(s["vector"]["stores"]) == 1
    guarded = [st for st in s["slice_stores"] if st.startswith("if (o / 128 == 0) ")]
    assert len(guarded) == 1 and [st for st in s["vector"]["body"] if st.startswith("if (")] == guarded


def vector_maps():
    """(outputs, feeds): tiles and tails, broadcast and transposed operands, casts between 4- and 1-byte types,
    several outputs, in-place updates of variables (one multi kernel) and a map below one tile."""
    outputs, feeds = broadcast_map()
    r = np.random.RandomState(4)
    x = next(n for n in feeds if n.name == "x")
    n = gc.placeholder("n", (3 * TILE + 5,), dtype="int32")
    u = gc.placeholder("u", (TILE + 3,), dtype="uint8")
    vs = [gc.variable(f"v{k}", init=r.uniform(-1, 1, (300, 70)).astype(np.float32)) for k in range(2)]
    small = gc.placeholder("small", (100,))
    outputs += [gc.cast(n, "float32") * 0.5, gc.cast(gc.cast(u, "float32") * 0.5, "int32"), x * x,
                gc.assign(vs[0], vs[0] * 0.5 + x), gc.assign(vs[1], vs[1] - 1.0), small * 2.0]
    feeds.update({n: r.randint(-1000, 1000, n.shape).astype(np.int32), u: r.randint(0, 256, u.shape).astype(np.uint8),
                  small: r.uniform(-1, 1, 100).astype(np.float32)})
    return outputs, feeds


def test_vector_maps_compile_with_nvcc(tmp_path):
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    outputs, _ = vector_maps()
    vectors = [s["vector"] for s in segments(outputs) if s["vector"]]
    assert len(vectors) == 6      # the map of broadcast_map, x * x, the two casts, both updates; not `small`
    artifact = gc.compile(outputs, target="cuda", out_dir=tmp_path, name="vector_maps")
    assert open(artifact.library, "rb").read(4) == b"\x7fELF"


@pytest.mark.parametrize("target", TARGETS)
def test_vector_maps_match_numpy(target):
    outputs, feeds = vector_maps()
    want = gc.NumpyExecutor(outputs).run(feeds)
    got = gc.Executor(outputs, target=target).run(feeds)
    for node, w, g in zip(outputs, want, got):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=node.describe())
