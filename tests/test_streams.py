"""streams: a step's kernels on several streams. Every two kernels whose arena bytes conflict must stay
ordered (same stream in schedule order, or an event between them); kernels of independent branches may run
side by side; the memory plan shares buffers only along dependences while that fits its slack. The
compiled results are the golden tests' business (cpu here, cuda on the GPU machine)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gcompile.passes.lower import Kernel, lower
from gcompile.passes.plan_memory import CONCURRENT_SLACK
from gcompile.passes.streams import MAX_STREAMS, assign_streams, conflicts, early_copies
from gcompile.pipeline import compile_program
from graphs import mlp_program


def kernel(reads=(), writes=()) -> Kernel:
    return Kernel("fused", "k", "", reads=list(reads), writes=list(writes))


def happens_before(kernels) -> list[set]:
    """For each kernel, the kernels certain to have completed when it starts, as the runtime orders them:
    the earlier kernels of its stream, and whatever preceded the record of each event it waits for."""
    done, tail, recorded = [], {}, {}
    for j, k in enumerate(kernels):
        s = k.values.get("stream", 0)
        before = set()
        if s in tail:
            before |= done[tail[s]] | {tail[s]}
        for e in k.values.get("waits", []):
            i = recorded[e]
            before |= done[i] | {i}
        done.append(before)
        tail[s] = j
        if k.values.get("record") is not None:
            recorded[k.values["record"]] = j
    return done


def assert_ordered(kernels):
    done = happens_before(kernels)
    for j in range(len(kernels)):
        for i in range(j):
            if conflicts(kernels[i], kernels[j]):
                assert i in done[j], f"kernels {i} and {j} conflict but may run at the same time"


def test_conflicts_are_read_after_write_write_after_read_and_write_after_write():
    a = kernel(reads=[(0, 100)], writes=[(100, 200)])
    assert conflicts(a, kernel(reads=[(150, 160)]))                 # reads what a wrote
    assert conflicts(a, kernel(writes=[(50, 60)]))                  # overwrites what a read
    assert conflicts(a, kernel(writes=[(199, 300)]))                # overwrites what a wrote
    assert not conflicts(a, kernel(reads=[(0, 100)], writes=[(200, 300)]))   # both read: independent


def test_a_diamond_runs_its_two_middle_kernels_on_two_streams():
    ks = [kernel(writes=[(0, 10)]),                                 # 0 writes A
          kernel(reads=[(0, 10)], writes=[(10, 20)]),               # 1 reads A, writes B
          kernel(reads=[(0, 10)], writes=[(20, 30)]),               # 2 reads A, writes C: independent of 1
          kernel(reads=[(10, 30)], writes=[(30, 40)])]              # 3 reads B and C
    assert assign_streams(ks) == 2
    assert ks[1].values["stream"] != ks[2].values["stream"]
    assert_ordered(ks)
    assert 1 not in happens_before(ks)[2]


def test_the_stream_goes_on_with_the_heir_of_a_fork():
    """Of a kernel's successors the one with the most GEMM work on its path to the step's end continues its
    stream (launched programmatically right after it); the others wait for an event on streams of their own.
    A chain's post kernel whose GEMM stages run on CUDA cores is the chain's heir; one with a stage on the
    short-K tensor-core tile ("sk") is not preferred."""
    def gemm(m, n, k, reads, writes, kind="matmul"):
        g = Kernel(kind, "k", "", reads=list(reads), writes=list(writes))
        g.values.update(m=m, n=n, k=k) if kind == "matmul" else g.values.update(
            stages=[{"gemm": True, "m": m, "n": n, "k": k}])
        return g
    ks = [kernel(writes=[(0, 10)]),                                 # 0 writes A
          gemm(8, 8, 8, [(0, 10)], [(10, 20)]),                     # 1: small, first in schedule order
          gemm(64, 64, 64, [(0, 10)], [(20, 30)])]                  # 2: the large one
    assert assign_streams(ks) == 2
    assert ks[2].values["stream"] == ks[0].values["stream"] == 0 and ks[2].values["waits"] == []
    assert ks[1].values["stream"] == 1 and ks[1].values["waits"] == [ks[0].values["record"]]
    assert_ordered(ks)
    ks = [kernel(writes=[(0, 10)]),
          gemm(8, 8, 8, [(0, 10)], [(10, 20)], kind="post"),
          gemm(64, 64, 64, [(0, 10)], [(20, 30)])]
    assert assign_streams(ks) == 2
    assert ks[1].values["stream"] == 0 and ks[2].values["stream"] == 1
    assert_ordered(ks)
    ks[1].values["stages"][0]["sk"] = "gc_tile<...>"
    assert assign_streams(ks) == 2
    assert ks[2].values["stream"] == 0 and ks[1].values["stream"] == 1
    assert_ordered(ks)
    src = compile_program(mlp_program(1000), "cuda")   # dW1 = x^T dh1 (the largest GEMM) after the chain
    train = src.kernels["train"]
    chain = next(j for j, k in enumerate(train) if k.kind == "chain")
    heir = max((k for k in train[chain + 1:]), key=lambda k: k.values.get("m", 0) * k.values.get("k", 0))
    assert heir.values["rows"] and heir.values["m"] == 784 and heir.values["stream"] == train[chain].values["stream"]


def test_a_chain_stays_on_one_stream():
    ks = [kernel(reads=[(i, i + 1)], writes=[(i + 1, i + 2)]) for i in range(6)]
    assert assign_streams(ks) == 1
    assert all(k.values["waits"] == [] and k.values["record"] is None for k in ks)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 11), max_size=3), st.lists(st.integers(0, 11), max_size=2)),
                max_size=24))
def test_every_conflict_stays_ordered(spec):
    """Random kernels over 12 one-byte buffers: whatever the streams, conflicting kernels stay ordered."""
    ks = [kernel([(b, b + 1) for b in reads], [(b, b + 1) for b in writes]) for reads, writes in spec]
    n = assign_streams(ks)
    assert 1 <= n <= MAX_STREAMS or not ks
    assert all(0 <= k.values["stream"] < max(n, 1) for k in ks)
    assert_ordered(ks)


def test_mlp_backward_runs_branches_side_by_side_within_the_memory_slack():
    """Batch 128: the first layer's weight gradient (and its update) runs beside the chain's post kernel (the
    other weight and bias gradients and their updates); the plan pays for it with at most CONCURRENT_SLACK
    of the lower bound."""
    src = compile_program(mlp_program(128), "cuda")
    kernels = lower(src.schedules, src.plan)["train"]
    assert [k.kind for k in kernels] == ["matmul", "chain", "post", "matmul"]
    assert assign_streams(kernels) == 2
    assert_ordered(kernels)
    done = happens_before(kernels)
    parallel = [(i, j) for j in range(len(kernels)) for i in range(j) if i not in done[j]]
    assert parallel == [(2, 3)]
    assert src.plan.arena_bytes <= CONCURRENT_SLACK * src.plan.lower_bound


def test_the_plan_falls_back_to_the_schedule_order_when_branches_cost_too_much():
    """Batch 1000: keeping h2 apart from dh1 would pass the slack (x is most of the persistent region, and
    the temporaries grow by 0.4 MB), so buffers are shared along the schedule: arena = lower bound, and the
    dh1 GEMM waits for the last reader of h2's buffer."""
    src = compile_program(mlp_program(1000), "cuda")
    assert src.plan.arena_bytes == src.plan.lower_bound
    kernels = lower(src.schedules, src.plan)["train"]
    assign_streams(kernels)
    assert_ordered(kernels)


def test_a_chain_copies_its_bs_before_its_wait_where_the_kernel_before_it_writes_none():
    """streams.early_copies: a chain whose staged Bs the kernel before it on its stream does not write issues
    their copies before its gc_wait_prior, and that kernel, where it is a GEMM, releases it after its main
    loop; not where that kernel writes a B's bytes, nor for a chain that opens its stream in the step."""
    def step(before_kind, before_writes, first=False):
        gemm = Kernel(before_kind, "p", "", reads=[(600, 700)], writes=list(before_writes))
        chain = Kernel("chain", "c", "", {"staged": {"parts": [{"span": (200, 300)}, {"span": (320, 340)}]}},
                       reads=[(0, 100), (200, 300), (320, 340)], writes=[(400, 500)])
        kernels = [chain] if first else [gemm, chain]
        assign_streams(kernels)
        early_copies(kernels)
        return gemm, chain
    gemm, chain = step("matmul", [(0, 100)])
    assert chain.values["staged"].get("early") and gemm.values.get("release")
    gemm, chain = step("fused", [(0, 100)])
    assert chain.values["staged"].get("early") and not gemm.values.get("release")
    for writes in ([(0, 100), (330, 331)], [(0, 100), (299, 320)]):   # it writes a B's bytes
        gemm, chain = step("matmul", writes)
        assert not chain.values["staged"].get("early") and not gemm.values.get("release")
    _, chain = step("matmul", [(0, 100)], first=True)
    assert not chain.values["staged"].get("early")
    # a B written earlier in the step by a kernel that the one before the chain does not follow (the chain
    # waits for it on another stream), and by one that it follows (done by the time the chain starts)
    for gemm_reads, early in (([(600, 700)], False), ([(600, 700), (205, 206)], True)):
        side = Kernel("fused", "w", "", reads=[(800, 900)], writes=[(200, 210)])
        gemm = Kernel("matmul", "p", "", reads=gemm_reads, writes=[(0, 100)])
        chain = Kernel("chain", "c", "", {"staged": {"parts": [{"span": (200, 300)}]}},
                       reads=[(0, 100), (200, 300)], writes=[(400, 500)])
        kernels = [side, gemm, chain]
        assign_streams(kernels)
        early_copies(kernels)
        assert chain.values["stream"] == gemm.values["stream"]
        assert bool(chain.values["staged"].get("early")) == early == bool(gemm.values.get("release"))


def test_the_mlp_chain_copies_w2_and_w3_while_x_at_w1_ends():
    """The MLP at batch 1000 under tf32 (a chain on tensor cores, W2 and W3 staged): in both steps the chain's
    copies come before its wait and x @ W1, the kernel before it, releases it; logistic regression's chain,
    the step's first kernel, waits first; the cpu target has neither."""
    import re
    src = compile_program(mlp_program(1000), "cuda", precision="tf32")
    for step in ("train", "eval"):
        ks = src.kernels[step]
        at = next(i for i, k in enumerate(ks) if k.kind == "chain")
        chain, gemm = ks[at], ks[at - 1]
        assert chain.values["staged"]["early"] and gemm.kind == "matmul" and gemm.values["release"]
        body = re.search(rf"__global__ void __launch_bounds__\(GC_BLOCK\) {chain.name}_kernel\(.*?\n}}\n",
                         src.source, re.S).group(0)
        assert body.index("gc_stage_copy(") < body.index("gc_wait_prior();") < body.index("__syncthreads();")
        call = re.search(rf"int {gemm.name}\(unsigned char\* A\) {{\n    return gc_gemm<.*?\);\n", src.source, re.S)
        assert call.group(0).endswith(", true);\n")
    logreg = compile_program(mlp_program(128, dims=(784, 10)), "cuda")   # logistic regression
    chain = next(k for k in logreg.kernels["train"] if k.kind == "chain")
    assert logreg.kernels["train"][0] is chain and not (chain.values.get("staged") or {}).get("early")
    cpu = compile_program(mlp_program(1000), "cpu", precision="tf32")
    assert not any(k.values.get("release") or (k.values.get("staged") or {}).get("early")
                   for ks in cpu.kernels.values() for k in ks)


def test_cpu_programs_run_kernels_in_schedule_order_and_cuda_ones_branch():
    calls = ("GC_TRY(gc_on(", "GC_TRY(gc_record(", "GC_TRY(gc_wait(")
    cpu, cuda = (compile_program(mlp_program(128), target).source for target in ("cpu", "cuda"))
    assert "GC_TRY(gc_fork(1))" in cpu and not any(c in cpu for c in calls)
    assert "GC_TRY(gc_fork(2))" in cuda and all(c in cuda for c in calls)


def test_next_batch_hook_runs_after_the_last_reader_of_the_labels():
    """The trainer's next batch (emit.next_batch_hook, runtime gc_hook_mark / gc_hook_run) is written beside the
    step's later kernels: after the last kernel that reads the labels or writes the loss, on its own stream
    that waits for theirs (events recorded there), launched after the step's kernels. The kernels after it
    touch neither; a step whose x is gathered (read by the step to its end) runs no hook and refuses one; the
    cpu runs it in place, in the same order."""
    import re
    import gcompile as gc
    from gcompile.passes.emit import next_batch_hook
    from gcompile.passes.lower import overlap
    for batch in (128, 1000):
        src = compile_program(mlp_program(batch), "cuda")
        train, plan, module = src.kernels["train"], src.plan, src.module
        hook = next_batch_hook(train, plan, module, "cuda")
        y, loss = plan.buffer_of(module.trainer["y"]), plan.buffer_of(module.loss)
        labels, lost = [(y.offset, y.offset + y.size)], [(loss.offset, loss.offset + loss.size)]
        assert train[hook["after"]].kind == "chain" and overlap(train[hook["after"]].reads, labels)
        for k in train[hook["after"] + 1:]:
            assert not overlap(k.reads + k.writes, labels) and not overlap(k.writes, lost), k.name
        assert hook["mask"] == 1 << train[hook["after"]].values["stream"]
        body = re.search(r"static int gc_run_train_branches\(unsigned char\* A, const gc_step_hook\* hook\) \{(.*?)\n}",
                         src.source, re.S).group(1)
        lines = [line.strip() for line in body.splitlines()]
        at = lines.index(f"GC_TRY(gc_hook_mark(hook, {hook['mask']}u));   // the labels are read, the loss written")
        # the hook itself is launched after every kernel of the step (its kernel would go ahead of the side
        # kernels), waiting for the events the mark recorded
        run = lines.index(f"GC_TRY(gc_hook_run(hook, {hook['mask']}u));   // after the step's launches, waiting for the mark")
        assert run > max(lines.index(f"GC_TRY({k.name}(A));") for k in train)
        # small batches (gathered values): the post kernel right after gathers the next batch itself, in its
        # last blocks, where the caller says what (hook->next); the hook's function runs otherwise
        assert hook["in_post"] == (batch == 128)
        if hook["in_post"]:
            post = train[hook["after"] + 1]
            assert post.kind == "post" and post.values["next"] == {"batch": 128, "row": 784}
            # (beside dW1, which continues the chain's stream: streams.heirs) after the chain's event
            chain = train[hook["after"]]
            assert post.values["stream"] != chain.values["stream"] and chain.values["record"] in post.values["waits"]
            assert lines[at - 1].startswith("if (!hook || !hook->next)")
            assert lines[run - 1].startswith("if (!hook || !hook->next)")
            at -= 1
        assert lines[at - 1] in (f"GC_TRY({train[hook['after']].name}(A));", f"GC_TRY(gc_record({train[hook['after']].values['record']}));")
        assert "#define GC_NEXT_BATCH 1" in src.source
        assert 'gc_run_eval: this step runs no hook' in src.source
    cpu = compile_program(mlp_program(128), "cpu")
    assert "#define GC_NEXT_BATCH 1" in cpu.source and "GC_TRY(gc_hook_mark(hook, 1u));" in cpu.source
    assert "GC_TRY(gc_hook_run(hook, 1u));" in cpu.source
    assert not next_batch_hook(cpu.kernels["train"], cpu.plan, cpu.module, "cpu")["in_post"]

    x = gc.placeholder("x", (8, 10))   # rows of 10 elements: gathered, not read in place
    y = gc.placeholder("y", (8,), dtype="int32")
    W = gc.variable("W", (10, 3), init=gc.init.normal(0.1, seed=1))
    logits = x @ W
    src = compile_program(gc.Program(gc.softmax_cross_entropy(logits, y), [W], optimizer=gc.SGD(lr=0.1),
                                     outputs={"logits": logits}), "cuda")
    assert next_batch_hook(src.kernels["train"], src.plan, src.module) is None
    assert "#define GC_NEXT_BATCH 0" in src.source and "GC_TRY(gc_hook_" not in src.source
    assert "gc_run_train: this step runs no hook" in src.source


def test_images_become_floats_where_a_pipelined_gemm_reads_them_in_place():
    """GC_X_FLOAT (emit.rows_as_floats): the cuda trainer converts uint8 images to floats only where a GEMM
    reading them in place through row indices has a tile that copies float rows (Tile.float_rows_only: the fp32
    pipelined, wgmma and short-K kernels; uint8 rows would take the register-staged kernel); not where the
    trainer gathers the batches' values (floats already: GC_X_GATHERED); never on the cpu."""
    from gcompile.gemm_tiles import Tile
    from gcompile.passes.emit import rows_as_floats
    from gcompile.passes.plan_memory import gathered_rows
    for batch in (128, 1000):
        for precision in ("fp32", "tf32"):
            src = compile_program(mlp_program(batch), "cuda", precision=precision)
            tiles = [Tile.parse(k.values["tile"])[0] for k in src.kernels["train"]
                     if k.kind == "matmul" and k.values["rows"]]
            pipelined = any(t.float_rows_only for t in tiles)
            gathered = gathered_rows(src.module.trainer["x"])
            assert gathered == (batch == 128)
            assert tiles and rows_as_floats(src.kernels["train"], "cuda") == pipelined
            assert f"#define GC_X_FLOAT {int(pipelined and not gathered)}" in src.source
            assert not rows_as_floats(src.kernels["train"], "cpu")
    # x @ W1's tile: tf32's warp-specialized one copies float rows, fp32's tf32 parts convert uint8 rows
    assert "#define GC_X_FLOAT 1" in compile_program(mlp_program(1000), "cuda", precision="tf32").source
    assert "#define GC_X_FLOAT 0" in compile_program(mlp_program(1000), "cuda").source
    assert "#define GC_X_FLOAT 0" in compile_program(mlp_program(1000), "cpu").source
