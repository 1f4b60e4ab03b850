"""lower: the map kernels' vector loop — which accesses move as 16-byte vectors (aligned operands read and
values stored at the element's own index), which stay per element (broadcast, transposed, misaligned,
guarded), where the scalar tail starts — and compiled results against numpy: cpu here, cuda behind the gpu
marker."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import gcompile as gc
from gcompile.passes.lower import BLOCK, ELEMENT_REGISTERS, POST_SK_TILE, VECTOR, lower, prefetch_globals
from gcompile.pipeline import compile_program

from conftest import load_example
from graphs import mlp_program

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


def check_against_numpy(outputs, feeds, target, rtol, atol, executor=None) -> list:
    """Run the outputs compiled for `target` (or on `executor`) and compare each with the numpy executor's;
    the compiled results."""
    want = gc.NumpyExecutor(outputs).run(feeds)
    got = (executor or gc.Executor(outputs, target=target)).run(feeds)
    for node, w, g in zip(outputs, want, got):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=node.describe())
    return got


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
    m = gc.placeholder("m", (64, 256))   # (a whole-tensor sum of 32768+ is split: fuse.LONG_SLICE)
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
    check_against_numpy(*vector_maps(), target, rtol=1e-6, atol=1e-6)


# --- rows kernels: every thread shape of threads() -------------------------------------------------------
def row_reductions():
    """(outputs, feeds): sums, maxima and a two-phase softmax over slices of every thread shape of a rows
    kernel — a thread per short slice, a warp or the block per contiguous slice, 4 or 8 strided slices side
    by side — with lengths the slice's threads divide and lengths they do not, int32 sums and maxima, and
    global reductions after the slices over 2 and 12 blocks (a mean loss, an int32 sum)."""
    r = np.random.RandomState(5)
    outputs, feeds = [], {}
    for shape, axis in [((5, 7), 1), ((3, 100), 1), ((6, 64), 1), ((2, 2048), 1), ((2, 1500), 1),
                        ((96, 33), 0), ((50, 3), 0), ((7, 40), 0)]:
        x = gc.placeholder(f"x{len(feeds)}", shape)
        feeds[x] = r.standard_normal(shape).astype(np.float32)
        e = gc.exp(x - gc.reduce_max(x, axis, keepdims=True))
        outputs += [gc.reduce_sum(x, axis), gc.reduce_max(x, axis), e / gc.reduce_sum(e, axis, keepdims=True)]
        n = gc.placeholder(f"n{len(feeds)}", shape, dtype="int32")
        feeds[n] = r.randint(-1000, 1000, shape).astype(np.int32)
        outputs += [gc.reduce_sum(n, axis), gc.reduce_max(n, axis)]
    logits, labels = gc.placeholder("logits", (300, 10)), gc.placeholder("labels", (300,), dtype="int32")
    feeds.update({logits: r.standard_normal((300, 10)).astype(np.float32),
                  labels: r.randint(0, 10, 300).astype(np.int32)})
    outputs.append(gc.softmax_cross_entropy(logits, labels))
    counts = gc.placeholder("counts", (3000, 5), dtype="int32")     # an int32 global sum over 12 blocks
    feeds[counts] = r.randint(-1000, 1000, (3000, 5)).astype(np.int32)
    outputs.append(gc.reduce_sum(gc.reduce_max(counts, 1)))
    return outputs, feeds


def test_row_reductions_cover_every_thread_shape():
    shapes = {(s["sx"], s["sy"], s["length"] % s["sy"] == 0) for s in segments(row_reductions()[0])}
    assert {(256, 1, True), (8, 32, True), (8, 32, False), (1, 256, True), (1, 256, False),
            (4, 64, False)} <= shapes
    assert sorted(s["blocks"] for s in segments(row_reductions()[0]) if s["ticket"]) == [2, 12]


def test_row_reductions_compile_with_nvcc(tmp_path):
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    artifact = gc.compile(row_reductions()[0], target="cuda", out_dir=tmp_path, name="row_reductions")
    assert "gc_last_block" in open(artifact.source).read() and open(artifact.library, "rb").read(4) == b"\x7fELF"


@pytest.mark.parametrize("target", TARGETS)
def test_row_reductions_match_numpy(target):
    check_against_numpy(*row_reductions(), target, rtol=1e-5, atol=1e-5)


# --- chains: row-local GEMMs of <= 32 columns and the rows groups reducing their rows, one kernel ---------
def heads():
    """(outputs, feeds): softmax cross-entropy of x @ W + b and its gradients, for row counts a block's rows
    do not divide, 10 and 32 columns, a transposed operand, a short K, K = 784 (split over the block's warps),
    more blocks (375) than a block has threads (the last block's partial sums stride). The bias joins the
    rows group here (test_golden's training steps have it in the GEMM's epilogue: the eval graph's logits
    need it there)."""
    r = np.random.RandomState(6)
    outputs, feeds = [], {}
    for k, (m, kk, n, ta) in enumerate([(37, 200, 10, False), (128, 100, 32, False), (20, 3, 10, True),
                                         (3000, 16, 10, False), (16, 784, 10, False)]):
        x = gc.placeholder(f"x{k}", (kk, m) if ta else (m, kk))
        w, b = gc.placeholder(f"w{k}", (kk, n)), gc.placeholder(f"b{k}", (n,))
        labels = gc.placeholder(f"labels{k}", (m,), dtype="int32")
        loss = gc.softmax_cross_entropy((gc.transpose(x) if ta else x) @ w + b, labels)
        outputs += [loss] + gc.gradients(loss, [x, w, b])
        feeds.update({x: r.standard_normal(x.shape).astype(np.float32),
                      w: (r.standard_normal(w.shape) / np.sqrt(kk)).astype(np.float32),
                      b: r.standard_normal(n).astype(np.float32), labels: r.randint(0, n, m).astype(np.int32)})
    return outputs, feeds


def test_a_thread_taking_its_blocks_one_short_slice_computes_its_values_before_it_stores_them():
    """ELEMENT_REGISTERS (cuda): where a block takes one slice (a chain's rows stage at a row a block) and a
    thread the whole slice, of at most that many elements, the element loop's values go into arrays first,
    every definition before any store, and the stores follow; blocks of several slices (the fused kernels,
    chains of more rows a block) keep one loop. test_heads_match_numpy and the row reductions' comparisons run
    both forms."""
    src = compile_program(heads()[0], "cuda")
    stages = [st for k in lower(src.schedules, src.plan)["eval"] if k.kind == "chain"
              for st in k.values["stages"] if not st["gemm"] and st["element_loop"]]
    one = [st for st in stages if st["per"] == 1 and st["sy"] == 1 and st["length"] <= ELEMENT_REGISTERS]
    several = [st for st in stages if st["per"] > 1]
    fused = [s for s in segments(row_reductions()[0]) if s["element_loop"]]
    assert one and several and fused
    for s in one:
        stores = [st for st in s["element_loop"] if "] = " in st and not st.startswith("const ")]
        assert len(s["element_values"]) == len(stores) >= 1
        assert s["element_defs"] == [st for st in s["element_loop"] if st not in stores]
        for j, e in enumerate(s["element_values"]):
            assert e["name"] == f"el{j}" and e["store"].endswith(f"= el{j}[r];")
    assert all(not s["element_values"] and not s["element_defs"] for s in several + fused)


def test_a_chain_at_a_row_a_block_runs_a_small_gemm_its_rows_and_the_gemm_after_in_one_warp(monkeypatch):
    """warp_stages (cuda, a row a block): a GEMM stage of N <= 32 and K <= WARP_STAGE_MAX_K, the rows stage
    reading its C and the GEMM stage reading that stage's values become one function run by warp 0 — the
    rows stage's element code reads C from the registers `hc`, the last GEMM its A from the element array
    el0 — with no barrier between them. Not past WARP_STAGE_MAX_K (K 200, 784), not at several rows a block
    (3000 rows), not on the cpu target, not without a rows stage (the MLP's eval chain)."""
    import gcompile.passes.lower as lowering
    src = compile_program(heads()[0], "cuda")
    chains = {k.values["m"]: k for k in src.kernels["eval"] if k.kind == "chain"}
    warped = {m: [i for i, st in enumerate(k.values["stages"]) if st.get("warp")] for m, k in chains.items()}
    assert warped == {16: [], 20: [0], 37: [], 128: [0], 3000: []}
    for m in (20, 128):
        k = chains[m]
        a, rows, b = k.values["stages"]
        assert a["warp"]["last"] == 2 and rows["in_warp"] and b["in_warp"] and b["warp_a"] == "el0"
        code = " ".join(rows["element_defs"] + [st for p in rows["phases"] for st in p["loop"]])
        assert "hc[r]" in code and a["c"].replace("float*", "const float*") not in code
        body = src.source.split(f"{k.name}_kernel(unsigned char* __restrict__ A) {{")[1].split("\n}\n")[0]
        assert f"if (threadIdx.x < 32) {k.name}_w0(A, blockIdx.x" in body
        assert "gc_row_gemm<" not in body and "__syncthreads();   // the block's rows" not in body
        assert f"gc_warp_row_gemm<float, {str(bool(b['trans_b'])).lower()}, {b['n']}, {b['k']}>(el0, " in src.source
        assert "(stages 1 to 3 by one warp)" in k.comment
    mlp = compile_program(mlp_program(128), "cuda")
    chain = mlp.kernels["train"][1]
    assert [i for i, st in enumerate(chain.values["stages"]) if st.get("warp")] == [1]
    assert "g2 GEMM 128x10 K 100 (stages 2 to 4 by one warp)" in chain.comment
    assert not any(st.get("warp") for st in mlp.kernels["eval"][1].values["stages"])
    cpu = compile_program(mlp_program(128), "cpu")
    assert not any(st.get("warp") for st in cpu.kernels["train"][1].values["stages"])
    monkeypatch.setattr(lowering, "WARP_STAGE_MAX_K", 0)
    assert not any(st.get("warp") for st in compile_program(mlp_program(128), "cuda").kernels["train"][1].values["stages"])


def test_warp_stages_and_held_bs_compile_with_nvcc(tmp_path):
    """Both of heads()'s warp stages (N 10, K 3; N 32, K 100, its rows stage 32 long) and the wide chains' Bs
    held in registers (K 64 and 50) build for the GPU."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    artifact = gc.compile(heads()[0], target="cuda", out_dir=tmp_path / "heads", name="heads")
    source = open(artifact.source).read()
    assert source.count("gc_warp_row_head<float, ") == 2 and open(artifact.library, "rb").read(4) == b"\x7fELF"
    artifact = gc.compile(wide_chains()[0], target="cuda", out_dir=tmp_path / "wide", name="wide")
    source = open(artifact.source).read()
    assert "gc_reg_row_gemm_t<64, 100>(" in source and "gc_reg_row_gemm_t<50, 100>(" in source


def test_a_chain_holds_a_b_read_as_b_and_b_transposed_in_registers():
    """chain_registers (cuda, a row a block, Bs staged): the MLP's W2 (h2 = h1 W2, dh1 = dh2 W2^T) is read from
    its shared-memory copy once, by h2's stage, into registers the block keeps for dh1 (gc_reg_row_gemm,
    gc_reg_row_gemm_t); the split sums before it store h1's row where that stage reads it (STAGED). Also the
    64-row wide chain's w1 (K 50: warps of 7 rows, the last 1 short). Not where a B is read only once (the
    eval chain), not at several rows a block (b1000), not on the cpu target, not where a warp stage takes the
    B^T stage (heads' 128 rows)."""
    src = compile_program(mlp_program(128), "cuda")
    chain = src.kernels["train"][1]
    stages = chain.values["stages"]
    assert [(st.get("regs"), st.get("regs_of")) for st in stages] == [(4, None)] + [(None, None)] * 3 + [(None, 0)]
    assert stages[0]["a_staged"] and chain.values["sum"]["rows"]
    assert "W2 held in registers by stages 1 and 5" in chain.comment
    body = src.source.split(f"{chain.name}_kernel(unsigned char* __restrict__ A) {{")[1].split("\n}\n")[0]
    assert "_ep{A}, blockIdx.x * 1, (float*)work);" in body.split("gc_chain_sum_partials<")[1]
    assert body.index("gc_stage_wait(") < body.index("gc_reg_row_gemm<100, 256, true>(") < \
        body.index("_w1(A, blockIdx.x") < body.index("gc_reg_row_gemm_t<256, 100>(")
    assert "gc_row_gemm<" not in body and "gc_reg_row_gemm_shape<100, 256>::bytes" in body
    evalchain = src.kernels["eval"][1]
    assert not any(st.get("regs") is not None for st in evalchain.values["stages"])
    assert not evalchain.values["sum"]["rows"]
    for program, target in ((mlp_program(1000), "cuda"), (mlp_program(128), "cpu")):
        other = compile_program(program, target).kernels["train"][1]
        assert not any(st.get("regs") is not None or st.get("regs_of") is not None for st in other.values["stages"])
    wide = {k.values["m"]: k for k in compile_program(wide_chains()[0], "cuda").kernels["eval"] if k.kind == "chain"}
    held = {m: [(i, st.get("regs"), st.get("regs_of")) for i, st in enumerate(k.values["stages"])
                if st.get("regs") is not None or st.get("regs_of") is not None] for m, k in wide.items()}
    assert held == {40: [(0, 4, None), (4, None, 0)], 64: [(0, 4, None), (4, None, 0)], 1000: [], 1001: []}
    heads_chain = next(k for k in compile_program(heads()[0], "cuda").kernels["eval"] if k.values.get("m") == 128)
    assert not any(st.get("regs") is not None for st in heads_chain.values["stages"])


def mlp_builds_with_and_without(tmp_path, monkeypatch, marker: str, off: list[str], batch: int = 128,
                                constants: dict | None = None) -> dict:
    """The MLP (batch 128 unless said) built for cuda as the lowering makes it ("with": `marker` in its source)
    and with the Lowering methods named in `off` returning None and lower.py's `constants` set ("without": no
    `marker`): {label: artifact}. Skips without nvcc."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    import gcompile.passes.lower as lowering
    from gcompile.build import build, compile_flags, header_commands
    compiler, flags, _ = compile_flags("cuda", None)
    artifacts = {}
    for label in ("with", "without"):
        if label == "without":
            for name in off:
                monkeypatch.setattr(lowering.Lowering, name, lambda self, *args: None)
            for name, value in (constants or {}).items():
                monkeypatch.setattr(lowering, name, value)
        source = compile_program(mlp_program(batch), "cuda", "mlp",
                                 build_command=header_commands("cuda", compiler, flags))
        assert (marker in source.source) == (label == "with")
        artifacts[label] = build(source, tmp_path / label, None)
    return artifacts


@pytest.mark.gpu
def test_the_held_registers_train_as_the_block_stages_do(tmp_path, monkeypatch):
    """MLP b128: 5 train steps with W2 held in registers (chain_registers) and with the block stages reading it
    from shared memory give the same losses and parameters to float rounding (dh1's sums come in another
    order), and the eval logits alike."""
    artifacts = mlp_builds_with_and_without(tmp_path, monkeypatch, "gc_reg_row_gemm_t<", ["chain_registers"])
    rng = np.random.RandomState(8)
    x, y = rng.rand(128, 784).astype(np.float32), rng.randint(0, 10, 128).astype(np.int32)
    with gc.load(artifacts["with"]) as a, gc.load(artifacts["without"]) as b:
        losses = np.array([(a.train_step(x, y), b.train_step(x, y)) for _ in range(5)])
        np.testing.assert_allclose(losses[:, 0], losses[:, 1], rtol=1e-5)
        for name in a.variables:
            np.testing.assert_allclose(a.get(name), b.get(name), rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(a.forward(x)["logits"], b.forward(x)["logits"], rtol=1e-4, atol=1e-5)


def test_a_warp_stages_rows_read_registers_only_at_the_elements_own_index():
    """GroupCode.segment(registers=...): reads of the buffer at the element's own index `i` become array[r];
    a read anywhere else (the labels, read at the row's index i / 10) counts as a miss, so the rows stage
    does not qualify."""
    from gcompile.passes.lower import GroupCode, Lowering
    src = compile_program(mlp_program(128), "cuda")
    chain = src.kernels["train"][1]
    logits_at = chain.values["stages"][1]["c_at"]
    labels_at = next(b.offset for b in src.plan.buffers if b.node.name == "y")
    group = next(n for n in src.schedules["train"] if n.op == "fused" and n.attrs["group"].kind == "rows")
    lowering = Lowering(src.plan, "train")
    for at, hits, misses in ((logits_at, True, False), (labels_at, False, True)):
        code = GroupCode(lowering, group.attrs["group"])
        code.segment("probe", per=1, split=True, registers={at: "regs"})
        assert bool(code.register_reads) == hits and bool(code.register_misses) == misses


def test_a_warp_stage_loads_what_the_chain_does_not_write_at_its_start():
    """Lowering.warp_stages: the MLP b128 warp stage loads the label (read by the softmax at its row, the same
    for every element of the slice, written by no stage of the chain) once, at its start, before the head
    (GroupCode.early_load), and the head's epilogue (the logits' bias) comes with packs of one column
    (GroupCode.epilogue_ones: load1 / run1), which gc_warp_row_head loads before its sums. The rows segment
    without `early`, or with the labels among the kernel's writes, loads nothing early."""
    from gcompile.passes.lower import GroupCode, Lowering
    src = compile_program(mlp_program(128), "cuda")
    chain = src.kernels["train"][1]
    head, rows = chain.values["stages"][1], chain.values["stages"][2]
    at = {b.node.name: b.offset for b in src.plan.buffers}
    label = f"((const int32_t*)(A + {at['y']}))"
    assert rows["early"] == [f"const int32_t pre0 = gc_pack_load({label} + o);"]
    code = " ".join(rows["element_defs"] + [st for p in rows["phases"] for st in p["loop"]])
    assert "pre0 == " in code and label not in code
    ones = head["epilogue"]["ones"]
    assert [(f["pointer"], f["index"], f["vector"]) for f in ones["fields"]] == \
        [(f"((const float*)(A + {at['b3']}))", "(int64_t)n", False)]
    assert "q.f0" in " ".join(ones["stmts"]) and "static constexpr bool ones = true;" in src.source
    # the stage that loads the held W2 (gc_reg_row_gemm) loads h2's bias when it starts, anchored (chain_ones)
    h2 = chain.values["stages"][0]
    assert h2.get("regs") is not None and [f["pointer"] for f in h2["epilogue"]["ones"]["fields"]] == \
        [f"((const float*)(A + {at['b2']}))"]
    assert not any(st["epilogue"].get("ones") for st in chain.values["stages"][3:] if st["gemm"])
    # LeNet's held-B stage stores its dropout-masked values beside C: its functor keeps its own loads
    lenet = compile_program(load_example("mnist_lenet").program(batch_size=8, dropout=0.3), "cuda")
    held = [st for k in lenet.kernels["train"] if k.kind == "chain" for st in k.values["stages"]
            if st["gemm"] and st.get("regs") is not None]
    assert held and all(st["epilogue"]["stores"] and not st["epilogue"].get("ones") for st in held)
    stage = src.source.split(f"{chain.name}_w1(unsigned char* __restrict__ A")[1].split("\n}\n")[0]
    assert stage.index("gc_pack_load(" + label) < stage.index("gc_warp_row_head<")
    assert not any(st.get("epilogue") and st["epilogue"].get("ones") for k in src.kernels["eval"]
                   if k.kind == "chain" for st in k.values["stages"])
    group = next(n for n in src.schedules["train"] if n.op == "fused" and n.attrs["group"].kind == "rows")
    lowering = Lowering(src.plan, "train")
    for early in (None, [(at["y"], at["y"] + 4)]):
        segment = GroupCode(lowering, group.attrs["group"]).segment("probe", per=1, split=True,
                                                                   registers={head["c_at"]: "hc"}, early=early)
        assert segment["early"] == []


def test_one_column_packs_leave_out_an_epilogue_that_stores_values_of_its_own():
    """GroupCode.epilogue_ones: run1 computes C's value only, so a GEMM epilogue that also stores a value of its
    own (LeNet's dropout-masked activations beside the ReLU's) gets no packs of one column, while one that
    stores nothing (the MLP's bias and ReLU) does."""
    from gcompile.passes.lower import GroupCode, Lowering
    checked = {True: 0, False: 0}
    for program in (load_example("mnist_lenet").program(batch_size=8, dropout=0.3), mlp_program(128)):
        src = compile_program(program, "cuda")
        lowering = Lowering(src.plan, "train")
        for node in src.schedules["train"]:
            if node.op == "fused" and node.attrs["group"].kind == "gemm":
                epilogue, _ = GroupCode(lowering, node.attrs["group"]).epilogue()
                ones = GroupCode(lowering, node.attrs["group"]).epilogue_ones()
                stores = bool(epilogue["stores"])
                reads = "(A + " in " ".join(epilogue["stmts"])   # (an operand it loads from the arena)
                assert (ones is None) if stores else (ones is not None) == reads, node.name
                checked[stores] += 1
    assert checked[True] and checked[False]


def chain_shapes(kernels) -> list[tuple]:
    """(M, rows a block, blocks, [(N, K) of each GEMM stage or 'rows']) of each chain kernel."""
    return sorted((k.values["m"], k.values["rows"], k.values["blocks"],
                   [(v["n"], v["k"]) if v["gemm"] else "rows" for v in k.values["stages"]])
                  for k in kernels if k.kind == "chain")


def test_a_gemm_and_the_rows_reducing_it_become_one_chain_kernel():
    src = compile_program(heads()[0], "cuda")
    kernels = src.kernels["eval"]
    # x's gradient dlogits @ W^T joins (16 x 784: scheduled past the CHAIN_WINDOW, it stays a tiled GEMM)
    assert chain_shapes(kernels) == [(16, 1, 16, [(10, 784), "rows"]), (20, 1, 20, [(10, 3), "rows", (3, 10)]),
                                     (37, 1, 37, [(10, 200), "rows", (200, 10)]),
                                     (128, 1, 128, [(32, 100), "rows", (100, 32)]),
                                     (3000, 8, 375, [(10, 16), "rows", (16, 10)])]
    chains = [k for k in kernels if k.kind == "chain"]
    assert all(k.values["stages"][1]["ticket"] and k.values["stages"][1]["tail"] for k in chains)
    # the loss's float partials are summed by one more block, the collector, launched after the stage blocks
    assert all(k.values["collector"] and k.values["stages"][1]["collect"] for k in chains)
    for k in chains:
        assert f"if (blockIdx.x == {k.values['blocks']}) {{   // the collector" in src.source
        assert f"({k.name}_kernel, {k.values['blocks'] + 1}, GC_BLOCK" in src.source   # gc_launch or gc_launch_smem
    offsets = [src.plan.workspaces[f"{k.name}_s1"] for k in chains]
    assert len(set(offsets)) == 5 and min(o for o, _ in offsets) >= max(b.end for b in src.plan.buffers)
    assert src.plan.arena_bytes == max(o + s for o, s in src.plan.workspaces.values())
    # the gradients over the batch (W's x^T @ dlogits, b's column sum) become one post kernel after the chain
    # (in the 16-row chain x's gradient dlogits @ W^T, a tiled GEMM, is left beside it), except where the
    # batch has more than POST_MAX_K rows (3000)
    posts = [(kernels[i - 1].values["m"], [(v["m"], v["n"], v["k"], v["rows_c"], v["blocks"]) for v in k.values["gemms"]])
             for i, k in enumerate(kernels) if k.kind == "post"]
    assert all(kernels[i - 1].kind == "chain" for i, k in enumerate(kernels) if k.kind == "post")
    assert sorted(posts) == [(16, [(784, 10, 16, 3, 262)]), (20, [(3, 10, 20, 3, 1)]), (37, [(200, 10, 37, 3, 67)]),
                             (128, [(100, 32, 128, 1, 100)])]


def test_logistic_regression_trains_in_two_kernels_a_step():
    """The chain takes the weight and bias gradients and their updates as post stages, one kernel after it:
    dW = x^T @ dlogits on most of its blocks, the bias's column sum and the guard's and step's assigns on the
    rest; no second stream, no tiled GEMM."""
    x, y = gc.placeholder("x", (128, 784)), gc.placeholder("y", (128,), dtype="int32")
    W, b = gc.variable("W", (784, 10), init=gc.init.zeros()), gc.variable("b", (10,), init=gc.init.zeros())
    loss = gc.softmax_cross_entropy(x @ W + b, y)
    src = compile_program(gc.Program(loss, params=[W, b], optimizer=gc.SGD(lr=0.5)), "cuda")
    chain, post = src.kernels["train"]
    assert chain.kind == "chain" and chain.values["blocks"] == 128 and post.kind == "post"
    assert [(v["m"], v["n"], v["k"], v["first"], v["blocks"], v["rows"]) for v in post.values["gemms"]] == \
        [(784, 10, 128, 5, 262, False)]   # (the trainer reads x in place: True)
    segments = [s for v in post.values["stages"] for s in v.get("segments", [])]
    assert [(s["first"], s["end"]) for s in segments] == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert post.comment.endswith("after chain k0, 2 stages: g2 multi on 5 blocks; g1 GEMM 784x10 K 128 (A^T B) on "
                                 "262 blocks")
    assert "gc_col_gemm<float, 784, 10, 128, 3>" in src.source and "1 stream(s)" in src.source


def test_the_mlp_post_kernel_runs_beside_the_large_weight_gradient():
    """MLP b128: dW3, dW2 (256 x 100 x 128) and the bias gradients become the chain's post kernel; dW1
    (784 x 256 x 128, past POST_MAX_FMA) stays a tiled GEMM, on another stream beside it. At batch 1000 a
    warp would sum 125 rows one after another (past POST_MAX_K): no post kernel."""
    src = compile_program(mlp_program(128), "cuda")
    kinds = [k.kind for k in src.kernels["train"]]
    assert kinds == ["matmul", "chain", "post", "matmul"]
    post = src.kernels["train"][2]
    # dW3 through gc_col_gemm; dW2 (3.3M multiply-adds, N a multiple of 4) on the short-K tensor-core tile
    assert [(v["m"], v["n"], v["k"]) for v in post.values["gemms"]] == [(100, 10, 128)]
    sk = [v for v in post.values["stages"] if v.get("sk")]
    assert [(v["m"], v["n"], v["k"], v["blocks"]) for v in sk] == [(256, 100, 128, 32)]
    assert post.values["sk_smem"] == POST_SK_TILE.smem_bytes() and "gc_gemm_sk_post<gc_tile<32, 32, 64" in src.source
    assert "GEMM 256x100 K 128 (A^T B) on 32 blocks of 32x32x64/16x8/3xtf32sk/cp2" in post.comment
    assert "train: 4 kernels on 2 stream(s)" in src.source
    assert "post" not in [k.kind for k in compile_program(mlp_program(1000), "cuda").kernels["train"]]


@pytest.mark.gpu
def test_the_post_kernels_short_k_weight_gradient_trains_as_its_column_gemm_does(tmp_path, monkeypatch):
    """MLP b128: 5 train steps with dW2 (and W2's update, its epilogue) on the post kernel's short-K tensor-core
    tile (gc_gemm_sk_post: three tf32 parts a product) and on gc_col_gemm (float32 FMAs) give the same losses,
    parameters and eval logits to float rounding; the first loss is numpy's."""
    artifacts = mlp_builds_with_and_without(tmp_path, monkeypatch, "gc_gemm_sk_post<gc_tile", ["post_short_k"])
    rng = np.random.RandomState(9)
    x, y = rng.rand(128, 784).astype(np.float32), rng.randint(0, 10, 128).astype(np.int32)
    with gc.load(artifacts["with"]) as a, gc.load(artifacts["without"]) as b:
        w2 = a.get("W2")
        losses = np.array([(a.train_step(x, y), b.train_step(x, y)) for _ in range(5)])
        assert np.abs(a.get("W2") - w2).max() > 1e-4   # (W2 moved: the update ran)
        np.testing.assert_allclose(losses[:, 0], losses[:, 1], rtol=1e-5)
        for name in a.variables:
            np.testing.assert_allclose(a.get(name), b.get(name), rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(a.forward(x)["logits"], b.forward(x)["logits"], rtol=1e-4, atol=1e-5)
    program = mlp_program(128)
    placeholders = {p.name: p for p in program.inputs}
    reference = gc.NumpyExecutor([program.loss]).run({placeholders["x"]: x, placeholders["y"]: y})[0]
    assert np.isclose(losses[0, 0], reference, rtol=1e-4)


def test_the_mlp_train_step_chains_its_row_local_kernels():
    src = compile_program(mlp_program(128), "cuda")
    kinds = [k.kind for k in src.kernels["train"]]
    assert kinds == ["matmul", "chain", "post", "matmul"]
    # h2, logits (+ b3), softmax cross-entropy, dh2, dh1; dW3 (scheduled between dh2 and dh1) moves after
    assert chain_shapes(src.kernels["train"]) == [(128, 1, 128, [(100, 256), (10, 100), "rows", (100, 10), (256, 100)])]
    chain = src.kernels["train"][1]
    assert chain.values["stages"][1]["epilogue"] and "b3" in " ".join(chain.details)
    assert chain_shapes(src.kernels["eval"]) == [(128, 1, 128, [(100, 256), (10, 100)])]
    assert "chain of 5 stages" in src.stages["lower"] and "kernel:  k1_" in src.stages["fuse"]


def test_a_chain_sums_the_split_partials_of_the_gemm_before_it():
    """MLP b128 on cuda: x @ W1 (split K, default tile) stores its splits' partial tiles into a workspace instead
    of summing them over a cluster, and the chain after it sums them at its rows (the GEMM's epilogue
    applied) before its first stage — in the train and the eval step, which share the workspace. The kernels'
    byte ranges say so (streams order by them). Not on the cpu target, not past PARTIALS_MAX (b1000), not
    for a GEMM without a split."""
    from gcompile.gemm_tiles import Tile
    from gcompile.passes.lower import PARTIALS_MAX
    src = compile_program(mlp_program(128), "cuda")
    for graph in ("train", "eval"):
        gemm, chain = src.kernels[graph][:2]
        split = Tile.parse(gemm.values["tile"])[1]
        assert split > 1 and gemm.values["partials"] and chain.values["sum"]["split"] == split
        part = int(gemm.values["c"].split("A + ")[1].rstrip("))"))   # the workspace the GEMM now writes
        nbytes = split * 128 * 256 * 4
        assert (part, part + nbytes) in gemm.writes and (part, part + nbytes) in chain.reads
        h1 = gemm.values["c_at"]
        assert any(lo <= h1 < hi for lo, hi in chain.writes) and not any(lo <= h1 < hi for lo, hi in gemm.writes)
        assert chain.values["stages"][0]["a_at"] == h1 and chain.values["sum"]["c"] == f"((float*)(A + {h1}))"
    assert src.kernels["train"][0].values["c"] == src.kernels["eval"][0].values["c"]   # one workspace
    assert "gc_ep_partial()" in src.source and "gc_chain_sum_partials<float, 8, 128, 256, 1>" in src.source
    assert "its 8 splits' partial tiles summed by" in src.stages["lower"]
    assert "gc_chain_sum_partials<" not in compile_program(mlp_program(128), "cpu").source
    big = compile_program(mlp_program(1000), "cuda")   # 2 x 1000 x 256 floats: past the workspace's bound
    assert 2 * 1000 * 256 * 4 > PARTIALS_MAX and not big.kernels["train"][0].values.get("partials")
    one = compile_program(mlp_program(128), "cuda", tiles={"k0": ("32x32x16/4x4/fp32", 1)})
    assert not one.kernels["train"][0].values.get("partials") and not one.kernels["train"][1].values.get("sum")


@pytest.mark.gpu
def test_the_chains_sum_of_split_partials_gives_the_clusters_bits(tmp_path, monkeypatch):
    """MLP b128: parameters after steps and the eval logits are bit for bit those of the build whose x @ W1 sums
    its splits over a cluster (the same order of sums), and agree with the numpy reference."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    import gcompile.passes.lower as lowering
    from gcompile.build import build, compile_flags, header_commands
    program = mlp_program(128)
    compiler, flags, _ = compile_flags("cuda", None)
    artifacts = {}
    for label, bound in (("folded", lowering.PARTIALS_MAX), ("clustered", 0)):
        monkeypatch.setattr(lowering, "PARTIALS_MAX", bound)   # (gc.compile's cache would not see it: built here)
        source = compile_program(program, "cuda", "mlp", build_command=header_commands("cuda", compiler, flags))
        artifacts[label] = build(source, tmp_path / label, None)
    folded, clustered = artifacts["folded"], artifacts["clustered"]
    rng = np.random.RandomState(5)
    x, y = rng.rand(128, 784).astype(np.float32), rng.randint(0, 10, 128).astype(np.int32)
    with gc.load(folded) as a, gc.load(clustered) as b:
        assert "gc_ep_partial()" in open(folded.source).read() and "gc_ep_partial()" not in open(clustered.source).read()
        losses = [(a.train_step(x, y), b.train_step(x, y)) for _ in range(4)]
        assert all(la == lb for la, lb in losses)
        for name in a.variables:
            np.testing.assert_array_equal(a.get(name), b.get(name))
        np.testing.assert_array_equal(a.forward(x)["logits"], b.forward(x)["logits"])
    placeholders = {p.name: p for p in program.inputs}
    xs, ys = placeholders["x"], placeholders["y"]
    reference = gc.NumpyExecutor([program.loss]).run({xs: x, ys: y})[0]
    assert np.isclose(losses[0][0], reference, rtol=1e-4)


def test_a_chain_copies_its_stages_bs_into_shared_memory():
    """MLP b128 on cuda: the chain's GEMM stages read W2 (h2 = h1 W2, dh1 = dh2 W2^T) and W3 (the logits, dh2),
    which no stage writes: each chain block copies both into its shared memory when it starts (bulk copies on
    one mbarrier, gc_stage_copy), waits for them before its first GEMM stage, and the stages read them there;
    the launch asks for the dynamic shared memory. Not where the grid has more blocks than SMs (b2000: 250 of
    8 rows), not on the cpu target."""
    from gcompile.gemm_tiles import SMS
    src = compile_program(mlp_program(128), "cuda")
    chain = src.kernels["train"][1]
    staged, stages = chain.values["staged"], chain.values["stages"]
    buf = {b.node.name: b for b in src.plan.buffers if b.node.name in ("W2", "W3")}
    w2, w3 = buf["W2"].offset, buf["W3"].offset
    assert staged == {"parts": [{"ptr": f"((const float*)(A + {w2}))", "bytes": 102400, "name": "W2",
                                 "at": 0, "span": (w2, w2 + 102400)},
                                {"ptr": f"((const float*)(A + {w3}))", "bytes": 4000, "name": "W3",
                                 "at": 102400, "span": (w3, w3 + 4000)}],
                      "bytes": 102400 + 4096, "tx": 106400, "first": 0, "names": ["W2", "W3"],
                      "early": True}   # (x @ W1, the kernel before it, writes neither: streams.early_copies)
    assert [st.get("b_staged") for st in stages] == [0, 102400, None, 102400, 0]
    for b in buf.values():
        assert not any(lo < b.offset + b.size and b.offset < hi for lo, hi in chain.writes)
    assert chain.values["blocks"] + chain.values["collector"] <= SMS
    body = src.source.split(f"{chain.name}_kernel(unsigned char* __restrict__ A) {{")[1].split("\n}\n")[0]
    # W2 read by h2 (into the registers dh1 reads: chain_registers), W3 by the logits and dh2 (the warp stage's,
    # warp_stages)
    warp = src.source.split(f"void {chain.name}_w1(")[1].split("\n}\n")[0]
    assert body.count("(const float*)(staged + 0)") == 1 and warp.count("(const float*)(staged + 102400)") == 2
    assert body.index("gc_stage_expect(&staged_bar, 106400)") < body.index("gc_stage_copy(staged + 102400") < \
        body.index("gc_chain_sum_partials<") < body.index("gc_stage_wait(&staged_bar)") < body.index("gc_reg_row_gemm<")
    assert f"gc_raise_smem<{chain.name}_kernel>(106496)" in src.source
    assert "W2, W3 copied into shared memory (106400 bytes)" in src.stages["lower"]
    big = compile_program(mlp_program(2000), "cuda").kernels["train"][1]
    assert big.kind == "chain" and big.values["blocks"] > SMS and not big.values["staged"]
    cpu = compile_program(mlp_program(128), "cpu")
    assert not cpu.kernels["train"][1].values["staged"] and "gc_stage_copy(" not in cpu.source


@pytest.mark.gpu
def test_the_chain_reading_its_staged_bs_gives_the_same_bits(tmp_path, monkeypatch):
    """MLP b128: parameters after steps and the eval logits are bit for bit those of the build whose chain reads
    W2 and W3 from global memory (the same sums in the same order)."""
    import gcompile.passes.lower as lowering
    # (a B held in registers, which needs the copy, sums dh1 in another order: chain_registers is off in both)
    monkeypatch.setattr(lowering.Lowering, "chain_registers", lambda self, values: None)
    artifacts = mlp_builds_with_and_without(tmp_path, monkeypatch, "gc_stage_copy(staged", ["chain_staged"])
    rng = np.random.RandomState(6)
    x, y = rng.rand(128, 784).astype(np.float32), rng.randint(0, 10, 128).astype(np.int32)
    with gc.load(artifacts["with"]) as a, gc.load(artifacts["without"]) as b:
        losses = [(a.train_step(x, y), b.train_step(x, y)) for _ in range(4)]
        assert all(la == lb for la, lb in losses)
        for name in a.variables:
            np.testing.assert_array_equal(a.get(name), b.get(name))
        np.testing.assert_array_equal(a.forward(x)["logits"], b.forward(x)["logits"])


def test_a_chain_stage_reading_w_transposed_reads_ws_mirror():
    """MLP b2000 on cuda (the chain's 250 blocks outnumber the SMs: its Bs stay in global memory): dh1 = dh2
    W2^T (N 256, K 100) reads W2's mirror (W2^T, 100 x 256) without TB, which dW2's GEMM stores at its end and
    the host's writes refresh; dh2 = dlogits W3^T (K 10, below CHAIN_MIRROR_MIN_K) reads W3 itself. Not at b128
    (the chain copies W2 into shared memory and holds it in registers) nor b1000 (its chain on tensor cores
    reads W2 from its copy in shared memory: chain_mma), not on the cpu target."""
    from gcompile.passes.lower import CHAIN_MIRROR_MIN_K
    assert 10 < CHAIN_MIRROR_MIN_K <= 100
    src = compile_program(mlp_program(2000), "cuda")
    (mirror,) = src.plan.mirrors
    buf = {b.node.name: b for b in src.plan.buffers if b.node.name in ("W2", "W3")}
    offset, size = src.plan.workspaces["mirror of W2"]
    assert (mirror["name"], mirror["src"], mirror["dst"], mirror["rows"], mirror["cols"], size) == \
        ("W2", buf["W2"].offset, offset, 256, 100, 256 * 100 * 4)
    chain = next(k for k in src.kernels["train"] if k.kind == "chain")
    gemms = [(st["n"], st["k"], st["trans_b"], st["b_at"]) for st in chain.values["stages"] if st["gemm"]]
    assert gemms == [(100, 256, 0, buf["W2"].offset), (10, 100, 0, buf["W3"].offset),
                     (100, 10, 1, buf["W3"].offset), (256, 100, 0, offset)]
    assert (offset, offset + size) in chain.reads and "reads W2^T, its mirror" in chain.comment
    (writer,) = [k for k in src.kernels["train"] if (offset, offset + size) in k.writes]
    assert writer.kind == "matmul" and writer.values["c_at"] == buf["W2"].offset
    assert writer.values["epilogue"]["mirror"] == offset
    assert chain.values["stages"][-1]["b_mirror"] and not chain.values["stages"][2].get("b_mirror")
    assert f"gc_row_gemm<float, false, 2000, 256, 100, 8, true>(\n        gc_row_matrix<float>{{" in src.source
    assert f"((const float*)(A + {offset})), " in src.source.split(f"{chain.name}_kernel(")[1].split("\n}\n")[0]
    assert f"gc_transpose((const float*)(A + {buf['W2'].offset}), (float*)(A + {offset}), 256, 100)" in src.source
    assert not compile_program(mlp_program(128), "cuda").plan.mirrors
    assert not compile_program(mlp_program(1000), "cuda").plan.mirrors
    assert not compile_program(mlp_program(2000), "cpu").plan.mirrors


@pytest.mark.gpu
def test_the_chain_reading_ws_mirror_trains_as_reading_w_does(tmp_path, monkeypatch):
    """MLP b2000: the chain's dh1 stage on W2's mirror (a column a thread, k in order) gives the bits of the
    build reading W2 itself — losses, parameters and eval logits — over steps, after the host sets W2 and
    after a checkpoint's load (both refresh the mirror)."""
    marker = "gc_row_gemm<float, false, 2000, 256, 100, 8, true>("
    artifacts = mlp_builds_with_and_without(tmp_path, monkeypatch, marker, [], batch=2000,
                                            constants={"CHAIN_MIRROR_MIN_K": 1 << 30})
    rng = np.random.RandomState(9)
    x, y = rng.rand(2000, 784).astype(np.float32), rng.randint(0, 10, 2000).astype(np.int32)
    with gc.load(artifacts["with"]) as a, gc.load(artifacts["without"]) as b:
        def same(what):
            assert a.train_step(x, y) == b.train_step(x, y), what
            for name in a.variables:
                np.testing.assert_array_equal(a.get(name), b.get(name), err_msg=f"{what}: {name}")
        for step in range(4):
            same(f"step {step}")
        w2 = rng.normal(0, 0.1, (256, 100)).astype(np.float32)
        a.set("W2", w2)
        b.set("W2", w2)
        same("after set")
        a.save(tmp_path / "a.ckpt")
        a.set("W2", np.zeros((256, 100), np.float32))
        a.load(tmp_path / "a.ckpt")
        b.save(tmp_path / "b.ckpt")
        b.load(tmp_path / "b.ckpt")
        same("after load")
        np.testing.assert_array_equal(a.forward(x)["logits"], b.forward(x)["logits"])


def test_a_block_sums_its_global_accumulators_over_the_threads_that_take_slices():
    # a thread per slice: the first `per` threads hold values (x < per, y = 0), the block's tree spans them
    assert {(s["sx"], s["per"], s["contributors"]) for s in segments(row_reductions()[0])} >= \
        {(256, 256, 256), (8, 8, 8), (1, 1, 1), (4, 4, 4)}
    chains = [k for k in compile_program(heads()[0], "cuda").kernels["eval"] if k.kind == "chain"]
    assert sorted((k.values["rows"], k.values["stages"][1]["contributors"]) for k in chains) == \
        [(1, 1)] * 4 + [(8, 8)]


def test_the_chains_last_block_prefetches_the_scalars_its_tail_reads():
    src = compile_program(mlp_program(128), "cuda")
    chain = src.kernels["train"][1]
    tail = chain.values["stages"][2]
    names = ["guard.halted_at", "guard.nonfinite_steps", "guard.skip", "step"]
    offsets = {b.node.name: b.offset for b in src.plan.buffers if b.node.name in names}
    assert tail["tail"] and tail["prefetch"] == [f"((const int32_t*)(A + {offsets[n]}))" for n in names]


def test_only_what_the_kernel_does_not_write_is_prefetched():
    segments_ = [{"global_reads": [("p", [(0, 8)]), ("q", [(16, 24)]), ("r", [(32, 40)])]}]
    prefetch_globals(segments_, [(4, 20)])
    assert segments_ == [{"prefetch": ["r"]}]


def test_a_chain_reads_the_image_input_in_place():
    # logistic regression on 16 features: the logits GEMM reads x's rows in place (plan_memory.batch_rows),
    # through the row indices (gc_row_input)
    r = np.random.RandomState(0)
    w = gc.variable("W", init=r.standard_normal((16, 10)).astype(np.float32))
    b = gc.variable("b", init=np.zeros(10, np.float32))
    x, y = gc.placeholder("x", (8, 16)), gc.placeholder("y", (8,), dtype="int32")
    logits = x @ w + b
    program = gc.Program(gc.softmax_cross_entropy(logits, y), params=[w, b], optimizer=gc.SGD(lr=0.1),
                         outputs={"logits": logits})
    src = compile_program(program, "cuda")
    assert src.plan.buffer_of(x).rows
    chain = src.kernels["train"][0]
    assert chain.kind == "chain" and chain.values["rows_input"] and chain.values["stages"][0]["rows"]
    assert "gc_row_input{rows, 16}" in src.source


def test_tf32_programs_chain_their_small_gemms_in_fp32():
    # the chain's row GEMMs compute in fp32 (gc_row_gemm has no tf32 form); x @ W1 outside keeps a tf32 tile.
    # Under tf32 the chain takes post stages only where every dependent it leaves goes on a plain tf32 short-K
    # tile (chain.beside_post): at b128 dW1 (784 x 256 x 128) does, so the step is fp32's four kernels, x @ W1
    # (split: short_k_choice), dW1 and the post kernel's dW2 on TF32 = 7 tiles, fp32's on their tf32-parts form
    fp32, tf32 = (compile_program(mlp_program(128), "cuda", precision=p) for p in ("fp32", "tf32"))
    assert chain_shapes(tf32.kernels["train"]) == chain_shapes(fp32.kernels["train"])
    assert [k.kind for k in fp32.kernels["train"]] == ["matmul", "chain", "post", "matmul"]
    assert [k.kind for k in tf32.kernels["train"]] == ["matmul", "chain", "post", "matmul"]
    tf32_field = [int(k.values["tile"].split("<")[1].split(",")[5]) for k in tf32.kernels["train"] if k.kind == "matmul"]
    assert tf32_field == [7, 7]   # gc_tile's TF32: x @ W1 and dW1 on short-K tiles
    fp32_field = [int(k.values["tile"].split("<")[1].split(",")[5]) for k in fp32.kernels["train"] if k.kind == "matmul"]
    assert fp32_field == [5, 5]   # the same on their tf32-parts form
    assert "gc_gemm_sk_post<gc_tile<32, 32, 64, 16, 8, 7, 1, 256, 100, 128, 2>" in tf32.source
    assert "gc_gemm_sk_post<gc_tile<32, 32, 64, 16, 8, 5, 1, 256, 100, 128, 2>" in fp32.source
    # at b256 dW1 and dW2 (K 256) would be left beside the post stages on other tensor-core tiles: none taken
    # under tf32 (fp32 takes dW3 and the bias gradients), the weight gradients keep tensor cores
    fp32, tf32 = (compile_program(mlp_program(256), "cuda", precision=p) for p in ("fp32", "tf32"))
    assert [k.kind for k in fp32.kernels["train"]] == ["matmul", "chain", "post", "matmul", "matmul"]
    assert [k.kind for k in tf32.kernels["train"]] == ["matmul", "chain", "matmul", "matmul", "fused", "matmul"]
    tf32_field = [int(k.values["tile"].split("<")[1].split(",")[5]) for k in tf32.kernels["train"] if k.kind == "matmul"]
    assert all(tf32_field) and len(tf32_field) == 4 and 7 not in tf32_field
    # where every dependent can be a post stage (logistic regression), tf32 programs take them too
    x, y = gc.placeholder("x", (128, 784)), gc.placeholder("y", (128,), dtype="int32")
    W, b = gc.variable("W", (784, 10), init=gc.init.zeros()), gc.variable("b", (10,), init=gc.init.zeros())
    logreg = gc.Program(gc.softmax_cross_entropy(x @ W + b, y), params=[W, b], optimizer=gc.SGD(lr=0.5))
    assert [k.kind for k in compile_program(logreg, "cuda", precision="tf32").kernels["train"]] == ["chain", "post"]


def test_chains_of_a_large_batch_run_their_gemm_stages_on_tensor_cores():
    """On cuda, a chain that would take CHAIN_MMA_MIN_ROWS rows a block or more (the MLP's at b1000: 4) takes
    CHAIN_MMA_ROWS (8: 125 blocks and the collector, so W2 and W3 are staged in shared memory and W2 has no
    mirror) and runs every GEMM stage on tensor cores (gc_row_mma, the first waiting for the staged copy
    itself, after staging its A rows); the train and eval chains alike; under fp32 each operand as tf32 parts
    (gc_row_mma's X3: its error at fp32's). Not at b128 (a row a block), not where the blocks and the collector
    outnumber the SMs (b2000), not on the cpu target; the wide chains of 1000 and 1001 rows too (the last
    block's row clamped), not those of 40 and 64."""
    from gcompile.gemm_tiles import SMS
    from gcompile.passes.lower import CHAIN_MMA_MIN_ROWS, CHAIN_MMA_ROWS
    assert (CHAIN_MMA_MIN_ROWS, CHAIN_MMA_ROWS) == (4, 8)
    for precision in ("tf32", "fp32"):
        src = compile_program(mlp_program(1000), "cuda", precision=precision)
        parts = precision == "fp32"
        for direction in ("train", "eval"):
            (chain,) = [k for k in src.kernels[direction] if k.kind == "chain"]
            gemms = [st for st in chain.values["stages"] if st["gemm"]]
            assert chain.values["rows"] == 8 and chain.values["blocks"] == 125
            assert all(st["mma"] and st["parts"] == parts for st in gemms)
            assert ("(tensor cores, tf32 parts)" in chain.comment) == parts and "(tensor cores" in chain.comment
            assert chain.values["staged"]["names"] == ["W2", "W3"]
        assert "W2" not in [m["name"] for m in src.plan.mirrors]   # (tf32's x @ W1 reads W1's: test_tune's)
        body = src.source.split(f"{src.kernels['train'][1].name}_kernel(unsigned char* __restrict__ A) {{")[1]
        body = body.split("\n}\n")[0]
        assert "gc_stage_wait(" not in body and body.count(", work, &staged_bar);") == 1
        x3 = ", true" if parts else ""
        assert [line.split("(")[0].strip() for line in body.splitlines() if "gc_row_mma<" in line] == [
            f"gc_row_mma<false, 1000, 100, 256, 8{x3}>", f"gc_row_mma<false, 1000, 10, 100, 8{x3}>",
            f"gc_row_mma<true, 1000, 100, 10, 8{x3}>", f"gc_row_mma<true, 1000, 256, 100, 8{x3}>"]
        assert "gc_row_mma_shape<false, 100, 256, 8>::bytes" in body
        # its rows stage (softmax cross-entropy, 10 long) takes a warp a row: the block's 8 rows on its 8 warps,
        # a lane an element, the row's sums by shuffles and the loss partials of the warps' lane 0 in row order
        (rows,) = [st for st in src.kernels["train"][1].values["stages"] if not st["gemm"]]
        assert rows["warp_rows"] and (rows["sx"], rows["sy"], rows["per"]) == (8, 32, 8)
        assert not rows["element_values"]
        stage = src.source.split(f"void {src.kernels['train'][1].name}_s2(")[1].split("\n}\n")[0]
        assert "const int x = threadIdx.x / 32, y = threadIdx.x % 32;" in stage and "gc_reduce_columns" not in stage
        assert stage.count("gc_reduce_lanes<float, ") == 4 and "gc_reduce_warp_leads<float, false, 8>(" in stage
    for program, target, precision, rows in ((mlp_program(128), "cuda", "tf32", 1),
                                             (mlp_program(128), "cuda", "fp32", 1),
                                             (mlp_program(1000), "cpu", "tf32", 4),
                                             (mlp_program(1000), "cpu", "fp32", 4)):
        chain = compile_program(program, target, precision=precision).kernels["train"][1]
        assert chain.values["rows"] == rows and not any(st.get("mma") for st in chain.values["stages"])
        # a thread a row where a block takes fewer rows than its 8 warps, and on the cpu target
        assert not any(st["warp_rows"] for st in chain.values["stages"] if not st["gemm"])
    for precision in ("tf32", "fp32"):   # 250 blocks of 8 rows: the fp32 row GEMMs
        chain = compile_program(mlp_program(2000), "cuda", precision=precision).kernels["train"][1]
        assert chain.values["rows"] == 8 and chain.values["blocks"] + 1 > SMS
        assert not any(st.get("mma") for st in chain.values["stages"])
    # not where a GEMM stage's A is the image input read in place (logistic regression's x @ W)
    logreg = compile_program(load_example("mnist_logreg").program(batch_size=1000), "cuda", precision="tf32")
    (chain,) = [k for k in logreg.kernels["train"] if k.kind == "chain"]
    assert chain.values["rows"] == 4 and chain.values["stages"][0]["rows"] and not chain.values["stages"][0]["mma"]
    # a chain whose static shared memory (the stages' work) and staged copy pass 48 KB only together: its
    # launch raises the kernel's dynamic limit all the same (gc_raise_smem)
    x, y = gc.placeholder("x", (1000, 784)), gc.placeholder("y", (1000,), dtype="int32")
    w0, w1 = (gc.variable(n, s, init=gc.init.zeros()) for n, s in (("w0", (784, 784)), ("w1", (784, 10))))
    loss = gc.softmax_cross_entropy(gc.relu(x @ w0) @ w1, y)
    wide = compile_program(gc.Program(loss, params=[w0, w1], optimizer=gc.SGD(lr=0.1)), "cuda", precision="tf32")
    (chain,) = [k for k in wide.kernels["train"] if k.kind == "chain"]
    assert chain.values["staged"]["bytes"] == 31360 and all(st["mma"] for st in chain.values["stages"] if st["gemm"])
    assert "gc_row_mma_shape<false, 10, 784, 8>::bytes" in wide.source
    assert f"GC_TRY(gc_raise_smem<{chain.name}_kernel>(31360));" in wide.source
    assert "        if (smem > 0)\n            GC_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize" \
        in wide.source
    wide = compile_program(wide_chains()[0], "cuda", precision="tf32")
    assert [s[:3] for s in chain_shapes(wide.kernels["eval"])] == [(40, 1, 40), (64, 1, 64), (1000, 8, 125),
                                                                   (1001, 8, 126)]
    assert {k.values["m"] for k in wide.kernels["eval"] if k.kind == "chain"
            and all(st["mma"] for st in k.values["stages"] if st["gemm"])} == {1000, 1001}


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_tensor_core_chains_compile_with_nvcc(tmp_path, precision):
    """The wide chains' tensor-core stages (N 256 and 48, K 48 and 256; N 100 and 50, K 50 and 100: columns
    interleaved where B's rows are 4 mod 32 apart; N 10) build for the GPU; under fp32 as tf32 parts (X3)."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    artifact = gc.compile(wide_chains()[0], target="cuda", out_dir=tmp_path, name="wide", precision=precision)
    source = open(artifact.source).read()
    assert source.count("gc_row_mma<") == 8 and open(artifact.library, "rb").read(4) == b"\x7fELF"
    x3 = ", true" if precision == "fp32" else ""
    for stage in ("false, 1000, 256, 48, 8", "true, 1000, 48, 256, 8", "false, 1001, 100, 50, 8",
                  "false, 1001, 10, 100, 8", "true, 1001, 50, 100, 8"):
        assert f"gc_row_mma<{stage}{x3}>(" in source


def tf32_wide_chain(x, w1, w2, labels):
    """A wide chain's loss and dx as tensor cores compute its GEMMs: each operand truncated to tf32 (its top 19
    bits, the mma's), the sums in float64."""
    def t(a):
        bits = np.ascontiguousarray(a, np.float32).view(np.uint32) & np.uint32(0xffffe000)
        return bits.view(np.float32).astype(np.float64)
    h = np.maximum(t(x) @ t(w1), 0).astype(np.float32)
    logits = (t(h) @ t(w2)).astype(np.float32).astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    p = e / e.sum(axis=1, keepdims=True)
    m = len(labels)
    loss = np.mean(np.log(e.sum(axis=1)) - shifted[np.arange(m), labels])
    onehot = np.eye(w2.shape[1])[labels]
    dlogits = ((p - onehot) / m).astype(np.float32)
    dh = ((t(dlogits) @ t(w2).T) * (h > 0)).astype(np.float32)
    return loss, t(dh) @ t(w1).T


@pytest.mark.gpu
def test_tensor_core_chains_match_numpy():
    """The wide chains under tf32: those of 1000 and 1001 rows (on tensor cores) against their GEMMs computed
    in numpy from tf32-truncated operands (the loss and dx, 1e-4 norm-wise; dx, made of p - y's cancelling
    sums, is 1.4-1.7% off the float32 values); the others (fp32 row GEMMs) against the numpy executor."""
    outputs, feeds = wide_chains()
    want = gc.NumpyExecutor(outputs).run(feeds)
    got = gc.Executor(outputs, target="cuda", precision="tf32").run(feeds)
    by_name = {node.name: value for node, value in feeds.items()}
    for k in range(4):
        loss, dx = got[2 * k], got[2 * k + 1]
        if len(dx) in (1000, 1001):
            want_loss, want_dx = tf32_wide_chain(*(by_name[f"{n}{k}"] for n in ("x", "w1", "w2", "labels")))
        else:
            want_loss, want_dx = want[2 * k], want[2 * k + 1]
        assert abs(loss - want_loss) <= 1e-4 * abs(want_loss), (k, loss, want_loss)
        error = np.linalg.norm(dx - want_dx) / np.linalg.norm(want_dx)
        assert np.isfinite(dx).all() and error <= 1e-4, f"chain {k} ({len(dx)} rows): dx's relative error {error:.3g}"


def wide_chains():
    """(outputs, feeds): chains of GEMMs of more than 32 columns (gc_row_gemm's other form): relu layers and
    their row-local backward GEMMs at 40, 1000, 1001 (4 rows a block on the cpu target, the last block's 1 of
    them; K of 50 and 10, not multiples of 4, and N of 50; on cuda 8 rows a block on tensor cores, chain_mma,
    as tf32 parts under fp32) and 64 rows (at a row a block, w1 held in registers for dx: K 50, not
    a multiple of the 8 warps); and two chains that must not form: a GEMM whose B is written
    by the GEMM before it, and an epilogue reading the earlier GEMM's result transposed."""
    r = np.random.RandomState(7)
    outputs, feeds = [], {}
    for k, (m, d, h) in enumerate([(40, 64, 100), (1000, 48, 256), (1001, 50, 100), (64, 50, 100)]):
        x, w1, w2 = gc.placeholder(f"x{k}", (m, d)), gc.placeholder(f"w1{k}", (d, h)), gc.placeholder(f"w2{k}", (h, 10))
        labels = gc.placeholder(f"labels{k}", (m,), dtype="int32")
        loss = gc.softmax_cross_entropy(gc.relu(x @ w1) @ w2, labels)
        outputs += [loss] + gc.gradients(loss, [x])
        feeds.update({x: r.standard_normal(x.shape).astype(np.float32),
                      w1: (r.standard_normal(w1.shape) / np.sqrt(d)).astype(np.float32),
                      w2: (r.standard_normal(w2.shape) / np.sqrt(h)).astype(np.float32),
                      labels: r.randint(0, 10, m).astype(np.int32)})
    a, v = gc.placeholder("a", (48, 48)), gc.placeholder("v", (48, 48))
    g = a @ v
    outputs += [a @ g, a @ v * 2.0 + gc.transpose(g)]
    feeds.update({a: r.standard_normal((48, 48)).astype(np.float32), v: r.standard_normal((48, 48)).astype(np.float32)})
    return outputs, feeds


def test_wide_chains():
    src = compile_program(wide_chains()[0], "cuda")
    shapes = chain_shapes(src.kernels["eval"])
    # (those of 1000 and 1001 rows on tensor cores, 8 rows a block: chain_mma)
    assert [s[:3] for s in shapes] == [(40, 1, 40), (64, 1, 64), (1000, 8, 125), (1001, 8, 126)]
    assert [(100, 64), (10, 100), "rows", (100, 10), (64, 100)] in [s[3] for s in shapes]
    assert [(100, 50), (10, 100), "rows", (100, 10), (50, 100)] in [s[3] for s in shapes]
    assert all(48 not in (k.values["m"],) for k in src.kernels["eval"] if k.kind == "chain")


@pytest.mark.parametrize("target", TARGETS)
def test_wide_chains_match_numpy(target):
    check_against_numpy(*wide_chains(), target, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_heads_match_numpy(target):
    outputs, feeds = heads()
    executor = gc.Executor(outputs, target=target)
    got = check_against_numpy(outputs, feeds, target, rtol=1e-4, atol=1e-5, executor=executor)
    for a, b in zip(got, executor.run(feeds)):          # the blocks' partials are summed in a fixed order
        assert a.tobytes() == b.tobytes()


def test_gemm_epilogues_on_runs_of_four_columns():
    """A GEMM epilogue's runs (cuda, gc_gemm_cuda.cuh): operands along C's row (the bias b1 at n, W1 at
    (m, n) in the update) move as 16-byte vectors, those that do not depend on n (lr, the guard's flag) as
    one value a run; an epilogue reading an operand across the row (transposed) has none."""
    src = compile_program(mlp_program(128), "cuda")
    forward, dw1 = src.kernels["train"][0].values, src.kernels["train"][3].values
    assert [(f["vector"], f["index"]) for f in forward["epilogue"]["runs"]["fields"]] == [(True, "(int64_t)n")]
    fields = dw1["epilogue"]["runs"]["fields"]
    assert sorted((f["vector"], f["ctype"], f["index"]) for f in fields) == [
        (False, "float", "0"), (False, "int32_t", "0"), (True, "float", "(int64_t)m * 256 + (int64_t)n")]
    # the lanes read the pack: q.f<i>.v[j] for a vector, q.f<i> for one value
    body = " ".join(dw1["epilogue"]["runs"]["stmts"])
    assert ".v[j]" in body and "(A + " not in body
    assert "static constexpr bool runs = true;" in src.source and "run4(const pack& q" in src.source

    x, w, t = gc.placeholder("x", (64, 32)), gc.placeholder("w", (32, 48)), gc.placeholder("t", (48, 64))
    y = gc.relu(x @ w + gc.transpose(t))
    gemm = next(k for k in compile_program([y], "cuda").kernels["eval"] if k.kind == "matmul")
    assert gemm.values["epilogue"] and gemm.values["epilogue"]["runs"] is None


@pytest.mark.parametrize("target", TARGETS)
def test_gemm_epilogues_on_runs_match_numpy(target):
    """A GEMM whose epilogue reads a row, a matrix at C's own index and a scalar (runs with vector and scalar
    fields, N a multiple of the tile's), against numpy."""
    r = np.random.RandomState(5)
    x, w = gc.placeholder("x", (100, 96)), gc.placeholder("w", (96, 128))
    bias, skip, s = gc.placeholder("bias", (128,)), gc.placeholder("skip", (100, 128)), gc.placeholder("s", ())
    y = gc.relu(x @ w + bias) * s + skip
    feeds = {n: r.uniform(-1, 1, n.shape).astype(np.float32) for n in (x, w, bias, skip, s)}
    check_against_numpy([y], feeds, target, rtol=1e-5, atol=1e-5)


def test_executor_takes_the_feeds_of_every_target(tmp_path, monkeypatch):
    """A placeholder that simplify leaves unread (the gradient of an unused input is zeros_like of it) is
    fed as NumpyExecutor needs; the compiled Executor took it for an unknown feed. Names of no placeholder
    of the graph are still refused, and a feed the program reads must be given."""
    monkeypatch.setenv("GCOMPILE_CACHE", str(tmp_path))
    s, x = gc.placeholder("s", ()), gc.placeholder("x", (3,))
    outputs = [x * 2.0, gc.zeros_like(s)]
    feed = {x: np.ones(3, np.float32), s: np.float32(1.0)}
    want = gc.NumpyExecutor(outputs).run(feed)
    got = gc.Executor(outputs, target="cpu").run(feed)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    with pytest.raises(gc.GCompileError, match=r"missing feeds \[\], unknown feeds \['z'\]"):
        gc.Executor(outputs, target="cpu").run({**feed, "z": 1.0})
    with pytest.raises(gc.GCompileError, match=r"missing feeds \['x'\]"):
        gc.Executor(outputs, target="cpu").run({s: np.float32(1.0)})


def test_executor_runs_keep_numpy_state_semantics(tmp_path, monkeypatch):
    """Every read of a run sees the run's starting values: an output that is a variable the run assigns was read
    back after the assign (the new value). And the train updates a node list carries (batch norm's running
    statistics), which NumpyExecutor applies at every run, were dropped by the compiled program."""
    monkeypatch.setenv("GCOMPILE_CACHE", str(tmp_path))
    V = gc.variable("V", (3,), init=gc.init.zeros())
    nodes = [gc.assign(V, V + 1.0), V * 1.0, gc.reshape(V, (1, 3)), V]
    reference, compiled = gc.Executor(nodes, target="numpy"), gc.Executor(nodes, target="cpu")
    for _ in range(3):
        for got, want in zip(compiled.run({}), reference.run({})):
            np.testing.assert_array_equal(got, want)
    xb = gc.placeholder("xb", (8, 4))
    stats = [gc.variable("rm", (4,), init=gc.init.zeros(), trainable=False),
             gc.variable("rv", (4,), init=gc.init.ones(), trainable=False)]
    nodes = [gc.batch_norm(xb, gc.variable("g", (4,), init=gc.init.ones()),
                           gc.variable("b", (4,), init=gc.init.zeros()), *stats), stats[0] * 2.0, stats[1]]
    feed = {xb: np.random.RandomState(0).standard_normal((8, 4)).astype(np.float32) + 1}
    reference, compiled = gc.Executor(nodes, target="numpy"), gc.Executor(nodes, target="cpu")
    for _ in range(3):
        got, want = compiled.run(feed), reference.run(feed)
        assert len(got) == len(want) == 3
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_the_source_does_not_depend_on_the_nodes_made_before(target, monkeypatch):
    """Node names end in a process-wide counter; the kernels' global reads were sorted by name, so that
    reduce_sum_10 came before reduce_sum_8 and after it as reduce_sum_12: with the names' numbers erased, the
    same model's source differed with the number of nodes made before it."""
    import itertools
    import re
    import gcompile.graph as graph

    def program():
        x, y = gc.placeholder("x", (1000, 32)), gc.placeholder("y", (1000,), dtype="int32")
        w = gc.variable("w", (32, 10), init=gc.init.he_normal(1))
        v = gc.variable("v", (7, 5), init=gc.init.he_normal(2))
        u = gc.variable("u", (3, 11), init=gc.init.he_normal(3))
        loss = gc.softmax_cross_entropy(x @ w, y) * gc.reduce_sum(v * v) + gc.reduce_sum(gc.exp(u))
        return gc.Program(loss, [w, v, u], gc.SGD(lr=0.1), name="m")

    sources = set()
    for first in (0, 2):   # reduce_sum_8 / reduce_sum_10 or reduce_sum_10 / reduce_sum_12
        monkeypatch.setattr(graph, "NODE_IDS", itertools.count(first))
        source = compile_program(program(), target, "m").source
        sources.add(re.sub(r"[ ]+", " ", re.sub(r"_\d+", "_N", source)))
    assert len(sources) == 1


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_gemm_too_large_for_int_sizes_is_refused(target):
    """gc_gemm takes int M, N, K: a K of 3e9 compiled, then the C++ build failed on a narrowing conversion."""
    x = gc.placeholder("x", (2, 3_000_000_000))
    w = gc.variable("w", (3_000_000_000, 1), init=gc.init.zeros())
    program = gc.Program(gc.reduce_mean(x @ w), [w], gc.SGD(lr=0.1), name="huge")
    with pytest.raises(gc.GCompileError, match=r"lower: matmul_\d+ .* is a GEMM of batch 1, M 2, N 1, "
                                               r"K 3000000000: each must be below 2\^31"):
        compile_program(program, target, "huge")


def test_a_batch_of_gemms_beyond_the_grid_is_refused_for_cuda():
    """A batched GEMM runs its batch along the grid's z (65535 at most): LeNet at batch 65536 compiled for cuda,
    then every step failed (gc_gemm_launch: too large for one launch). The cpu target has no such limit."""
    a = gc.placeholder("a", (70000, 4, 8))
    w = gc.variable("w", (70000, 8, 2), init=gc.init.zeros())
    program = gc.Program(gc.reduce_mean(gc.matmul(a, w)), [w], gc.SGD(lr=0.1), name="many")
    with pytest.raises(gc.GCompileError, match=r"is a batch of 70000 GEMMs.*at most 65535 blocks along a grid's z"):
        compile_program(program, "cuda", "many")
    compile_program(program, "cpu", "many")


@pytest.mark.parametrize("target", TARGETS)
def test_a_float_cast_to_an_integer_type_is_numpys_on_every_target(target, tmp_path, monkeypatch):
    """A C cast of NaN, an infinity or 3e9 to int32 is undefined (the cpu gave x86's INT32_MIN by chance, the GPU
    saturates): gc_float_to_int32 gives what the numpy executor's astype gives on x86-64 — truncation toward
    zero where the value fits, else INT32_MIN; a uint8 the low byte of that."""
    monkeypatch.setenv("GCOMPILE_CACHE", str(tmp_path))
    x = gc.placeholder("x", (12,))
    outputs = [gc.cast(x, "int32"), gc.cast(gc.cast(x, "uint8"), "int32")]
    values = np.array([np.nan, 3e9, -3e9, 2.7, -2.7, 300, -1, 2147483520, -2147483648.0, np.inf, -np.inf, 0.5],
                      np.float32)
    with np.errstate(invalid="ignore"):
        want = gc.NumpyExecutor(outputs).run({x: values})
    got = gc.Executor(outputs, target=target).run({x: values})
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert want[0].tolist()[:3] == [-2**31] * 3 and want[1].tolist()[4:7] == [254, 44, 255]
