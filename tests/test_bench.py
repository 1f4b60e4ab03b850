"""The benchmark's own logic on fake numbers: timing statistics, ratios, the table, the JSON file, the
HLO kernel estimate and the gcompile binary's log reading. No torch, no jax, no GPU: `make bench` itself
runs on the GPU machine."""
import json
import sys

import pytest

from conftest import ROOT, load_bench


def bench_modules():
    """The bench package (conftest.load_bench) with the modules these tests use."""
    load_bench()
    import bench.determinism
    import bench.floors
    import bench.gc_side
    import bench.jax_peers
    import bench.report
    import bench.run
    import bench.timeline
    import bench.timing
    import bench.tune
    return bench


bench = bench_modules()
report, timing = bench.report, bench.timing


def fake_rows():
    r = report.row
    return [
        r("mnist", "mnist_mlp", 128, "gcompile", precision="fp32", step_s=10e-6, p10_s=9e-6, p90_s=12e-6,
          compile_cold_s=2.5, compile_cached_s=0.05, mem_bytes=1_500_000, kernels=9, tta_s=0.03, tta_epochs=4,
          start_to_target_s=0.6),
        r("mnist", "mnist_mlp", 128, "gcompile", precision="tf32", step_s=8e-6, p10_s=7e-6, p90_s=9e-6),
        r("mnist", "mnist_mlp", 128, "jax-scan", precision="fp32", step_s=40e-6, p10_s=39e-6, p90_s=45e-6,
          kernels=14, tta_s=None, tta_epochs=30),
        report.row("mnist", "mnist_mlp", 1000, "torch-eager", precision="fp32", step_s=900e-6, p10_s=880e-6,
                   p90_s=950e-6),
        report.row("gemm", "gemm_bench", None, "-", skipped="bench/gemm_bench.py is not in this tree"),
    ]


def test_ratios_are_against_gcompile_fp32_of_the_same_model_and_batch():
    rows = fake_rows()
    report.add_ratios(rows)
    assert "peer_over_gc" not in rows[0]
    assert rows[1]["peer_over_gc"] == pytest.approx(0.8)
    assert rows[2]["peer_over_gc"] == pytest.approx(4.0)
    assert "peer_over_gc" not in rows[3]  # no gcompile row at batch 1000


def test_table_shows_times_ratios_and_skip_reasons():
    rows = fake_rows()
    report.add_ratios(rows)
    table = report.format_table(rows)
    lines = table.splitlines()
    assert lines[0].startswith("model") and "[mnist]" in lines and "[gemm]" in lines
    scan = next(line for line in lines if "jax-scan" in line)
    assert "| 40.0 " in scan and "4.00x" in scan and "no (30ep)" in scan
    gc_line = next(line for line in lines if "gcompile" in line and "fp32" in line)
    assert "10.0" in gc_line and "0.030 (4ep)" in gc_line and "2.50/0.050" in gc_line and "1.50" in gc_line
    assert "SKIPPED: bench/gemm_bench.py is not in this tree" in table


def test_json_is_named_after_gpu_and_commit_and_round_trips(tmp_path):
    meta = {"gpu": "NVIDIA H200", "commit": "abc123", "date": "2026-11-22T00:00:00+00:00"}
    results = {"meta": meta, "rows": fake_rows()}
    path = report.write_json(results, tmp_path / "results")
    assert path.name == "nvidia-h200-abc123.json"
    assert json.loads(path.read_text()) == results


def test_commit_comes_from_the_environment_first(monkeypatch):
    monkeypatch.setenv("GCOMPILE_COMMIT", "0123abcd")
    assert report.git_commit(ROOT) == "0123abcd"


def test_commit_without_the_environment_is_heads_and_says_when_the_files_differ(tmp_path, monkeypatch):
    """A copy of the tree may carry the .git of an older commit (the GPU machine's did): its tracked files then
    differ from HEAD, and the results are named '<HEAD>-dirty', not after a commit they were not measured at."""
    import shutil
    import subprocess
    if shutil.which("git") is None:
        pytest.skip("no git")
    monkeypatch.delenv("GCOMPILE_COMMIT", raising=False)
    assert report.git_commit(tmp_path) == "unknown"   # no repository
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f.txt").write_text("one\n")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / "new.txt").write_text("untracked\n")   # untracked files: not the measured tree's
    assert report.git_commit(tmp_path) == head
    (tmp_path / "f.txt").write_text("two\n")
    assert report.git_commit(tmp_path) == head + "-dirty"
    monkeypatch.setenv("GCOMPILE_COMMIT", "0123abcd")
    assert report.git_commit(tmp_path) == "0123abcd"


def test_step_statistics_come_from_the_timed_windows():
    settings = timing.Settings(quick=True)
    calls = []

    def run_window(n):
        calls.append(n)
        return n * 5e-6
    stats = timing.time_windows(run_window, settings)
    assert stats["step_s"] == pytest.approx(5e-6) and stats["p10_s"] == pytest.approx(5e-6)
    assert stats["windows"] == settings.windows == len(calls) - 2  # after the warm-up and the probe
    assert calls[0] == settings.warmup_steps and stats["steps_per_window"] == calls[-1]
    scanned = timing.time_windows(lambda n: n * 390 * 5e-6, settings, warmup=1, steps_per_call=390)
    assert scanned["step_s"] == pytest.approx(5e-6)


def test_time_to_accuracy_counts_training_epochs_until_the_target():
    accuracies = iter([0.90, 0.95, 0.971, 0.98])
    result = timing.time_to_accuracy(lambda e: 0.01 * (e + 1), lambda: next(accuracies), 0.97, 10)
    assert result == {"tta_s": pytest.approx(0.06), "tta_epochs": 3, "tta_acc": 0.971}
    never = timing.time_to_accuracy(lambda e: 1.0, lambda: 0.5, 0.97, 2)
    assert never["tta_s"] is None and never["tta_epochs"] == 2 and "not reached" in never["tta_note"]


def test_budget_gives_a_reason_when_work_does_not_fit():
    budget = timing.Budget(100)
    assert budget.allows(10) is None
    assert "time budget" in budget.allows(1000)


def test_binary_epoch_log_gives_time_to_accuracy():
    run = {"epochs": [{"epoch": 1, "val_acc": 0.95, "train_s": 0.01, "since_start_s": 0.4},
                      {"epoch": 2, "val_acc": 0.972, "train_s": 0.012, "since_start_s": 0.45}]}
    fields = bench.gc_side.accuracy_fields(run, 0.97)
    assert fields == {"tta_s": pytest.approx(0.022), "tta_epochs": 2, "tta_acc": 0.972, "start_to_target_s": 0.45}
    assert bench.gc_side.accuracy_fields(run, 0.99)["tta_s"] is None
    run["target_line"] = {"target_acc": 0.97, "epoch": 2, "train_seconds": 0.0215, "since_start_seconds": 0.41}
    fields = bench.gc_side.accuracy_fields(run, 0.97)
    assert fields["tta_s"] == 0.0215 and fields["binary_since_start_s"] == 0.41 and fields["start_to_target_s"] == 0.45
    line = "epoch 2/30  loss 0.1234 (mean 0.2000)  val_acc 0.9720  1234567 examples/s  0.050 s"
    assert bench.gc_side.EPOCH_LINE.search(line).groups() == ("2", "0.9720")


def test_arena_beyond_parameters():
    manifest = {"arena_bytes": 10_000, "variables": [
        {"name": "W", "shape": [10, 20], "dtype": "float32", "trainable": True},
        {"name": "lr", "shape": [], "dtype": "float32", "trainable": False}]}
    assert bench.gc_side.memory_fields(manifest) == {"arena_bytes": 10_000, "mem_bytes": 10_000 - 800}


HLO = """\
HloModule jit_epoch, entry_computation_layout={(f32[784,10]{1,0})->f32[784,10]{1,0}}

%fused_add (param_0: f32[10], param_1: f32[10]) -> f32[10] {
  %param_0 = f32[10]{0} parameter(0)
  %param_1 = f32[10]{0} parameter(1)
  ROOT %add.1 = f32[10]{0} add(f32[10]{0} %param_0, f32[10]{0} %param_1)
}

%body (state: (s32[], f32[784,10])) -> (s32[], f32[784,10]) {
  %state = (s32[], f32[784,10]{1,0}) parameter(0)
  %gte.0 = s32[] get-tuple-element((s32[], f32[784,10]{1,0}) %state), index=0
  %gemm = (f32[128,10]{1,0}, s8[4]{0}) custom-call(f32[128,784]{1,0} %x), custom_call_target="__cublas$gemm"
  %fusion.2 = f32[10]{0} fusion(f32[10]{0} %a, f32[10]{0} %b), kind=kLoop, calls=%fused_add
  %fusion.3 = f32[784,10]{1,0} fusion(f32[10]{0} %a), kind=kLoop, calls=%fused_add
  ROOT %tuple.1 = (s32[], f32[784,10]{1,0}) tuple(s32[] %gte.0, f32[784,10]{1,0} %fusion.3)
}

%cond (state.1: (s32[], f32[784,10])) -> pred[] {
  %state.1 = (s32[], f32[784,10]{1,0}) parameter(0)
  ROOT %lt = pred[] compare(s32[] %a, s32[] %b), direction=LT
}

ENTRY %main.9 (Arg_0.1: f32[784,10]) -> f32[784,10] {
  %Arg_0.1 = f32[784,10]{1,0} parameter(0)
  %constant.1 = s32[] constant(0)
  %fusion.9 = f32[784,10]{1,0} fusion(f32[784,10]{1,0} %Arg_0.1), kind=kLoop, calls=%fused_add
  %tuple.2 = (s32[], f32[784,10]{1,0}) tuple(s32[] %constant.1, f32[784,10]{1,0} %fusion.9)
  %while.1 = (s32[], f32[784,10]{1,0}) while((s32[], f32[784,10]{1,0}) %tuple.2), condition=%cond, body=%body
  ROOT %gte.9 = f32[784,10]{1,0} get-tuple-element((s32[], f32[784,10]{1,0}) %while.1), index=1
}
"""


def test_hlo_kernel_estimate_counts_launching_instructions():
    assert bench.jax_peers.hlo_kernels(HLO, scan=True) == 3      # the loop body: gemm + 2 fusions per step
    assert bench.jax_peers.hlo_kernels(HLO, scan=False) == 1 + 3  # a fusion, then the loop's body
    assert bench.jax_peers.hlo_kernels("not hlo", scan=False) is None


GEMM_RESULT = {"gpu": "fake", "rows": [
    {"name": "4096^3", "m": 4096, "n": 4096, "k": 4096, "precision": "fp32", "epilogue": "none",
     "tile": "gc_tile<128, 128, 8, 8, 8, 0>", "chosen": True, "own_us": 3000.0, "cublas_us": 2700.0},
    {"name": "b128 fwd  h1 = x @ W1", "m": 128, "n": 256, "k": 784, "precision": "tf32", "epilogue": "bias_relu",
     "tile": "t", "chosen": True, "own_us": 4.0, "cublas_tf32_us": 5.0},
    {"name": "4096^3", "m": 4096, "n": 4096, "k": 4096, "precision": "fp32", "epilogue": "none", "tile": "other",
     "chosen": False, "own_us": 4000.0, "cublas_us": 2700.0}],
    "summary": {"fp32_4096_vs_cublas": 0.9, "fused_vs_cublas_min": 0.95}}


def test_gemm_results_become_rows_and_targets():
    rows = bench.run.gemm_rows(GEMM_RESULT)
    assert [(r["model"], r["impl"], r["precision"]) for r in rows] == [
        ("4096^3", "gc_gemm", "fp32"), ("b128 fwd  h1 = x @ W1", "gc_gemm+bias_relu", "tf32")]
    assert rows[0]["step_s"] == pytest.approx(3e-3) and rows[0]["peer_over_gc"] == pytest.approx(0.9)
    assert "45.8 TFLOP/s" in rows[0]["note"] and rows[1]["peer_over_gc"] == pytest.approx(1.25)
    checks = bench.run.gemm_targets(GEMM_RESULT["summary"])
    assert [(c["value"], c["ok"]) for c in checks] == [(pytest.approx(90), True), (pytest.approx(0.95), False)]
    ordered = bench.run.sort_rows(rows + fake_rows())
    assert [r["section"] for r in ordered] == ["mnist"] * 4 + ["gemm"] * 3
    assert [r["impl"] for r in ordered[:4]] == ["gcompile", "gcompile", "jax-scan", "torch-eager"]
    assert "| 3000 " in report.format_table(ordered)


def test_command_line_checks_sections():
    args = bench.run.parse_args(["--quick", "--only", "mnist,eltwise", "--device", "cpu"])
    assert args.only == ["mnist", "eltwise"] and args.quick and args.batches == [128, 1000]
    with pytest.raises(SystemExit):
        bench.run.parse_args(["--only", "nonsense"])
    assert bench.run.parse_args(["--impls", "gcompile,jax-scan", "--device", "cpu"]).impls == {"gcompile", "jax-scan"}
    assert bench.run.parse_args(["--device", "cpu"]).impls == set(bench.run.IMPLS)
    with pytest.raises(SystemExit):   # a misspelt implementation ran nothing of it, silently
        bench.run.parse_args(["--impls", "gcompile,torch_eager"])


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from bench.plot import plot
    results = {"meta": {"gpu": "fake", "commit": "abc", "date": "2026-11-22"}, "rows": fake_rows()}
    path = plot(results, tmp_path / "chart.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


FAKE_BINARY = """#!{python}
import json, sys
args = sys.argv[1:]
if args == ["--help"]:
    print("usage: ... [--target-acc X]")
    sys.exit(0)
log = args[args.index("--log") + 1]
assert args[:1] == ["train"] and args[args.index("--target-acc") + 1] == "0.97"
with open(log + ".args", "w") as f:
    json.dump(args, f)
print("training fake: 50000 examples, batch 128, 390 steps per epoch, cuda", flush=True)
with open(log, "a") as f:
    for epoch, acc in ((1, 0.95), (2, 0.975)):
        print(f"epoch {{epoch}}/30  loss 0.2 (mean 0.3)  val_acc {{acc:.4f}}  2496000 examples/s  0.030 s", flush=True)
        f.write(json.dumps({{"epoch": epoch, "val_acc": acc, "examples_per_s": 2496000.0, "seconds": 0.03}}) + "\\n")
    f.write(json.dumps({{"target_acc": 0.97, "epoch": 2, "train_seconds": 0.04, "since_start_seconds": 0.5}}) + "\\n")
print("target val_acc 0.9700 reached at epoch 2", flush=True)
"""


def test_binary_run_reads_epoch_lines_and_the_log(tmp_path):
    binary = tmp_path / "fake"
    binary.write_text(FAKE_BINARY.format(python=sys.executable))
    binary.chmod(0o755)
    artifact = type("Artifact", (), {"binary": str(binary), "out_dir": str(tmp_path)})
    run = bench.gc_side.run_binary(artifact, str(tmp_path), 30, 128, 50000, 0.97, timeout=60)
    assert [e["epoch"] for e in run["epochs"]] == [1, 2] and run["target_line"]["epoch"] == 2
    assert run["epochs"][0]["train_s"] == pytest.approx(390 * 128 / 2496000.0)
    assert "--target-acc" in run["command"]
    fields = bench.gc_side.accuracy_fields(run, 0.97)
    assert fields["tta_epochs"] == 2 and fields["tta_s"] == 0.04 and 0 < fields["start_to_target_s"] < 60
    args = json.loads((tmp_path / "bench-train.jsonl.args").read_text())
    assert args[args.index("--lr") + 1] == "0.1" and "--no-shuffle" not in args   # no recipe: lr 0.1, shuffled


def test_binary_runs_each_batch_size_s_recipe(tmp_path):
    """Batch 128 trains at lr 0.1 shuffled, batch 1000 the reference experiment's way (lr 1.0, file order):
    the binary is told both, on the command line."""
    from bench.tasks import RECIPES
    binary = tmp_path / "fake"
    binary.write_text(FAKE_BINARY.format(python=sys.executable))
    binary.chmod(0o755)
    artifact = type("Artifact", (), {"binary": str(binary), "out_dir": str(tmp_path)})
    seen = {}
    for batch in (128, 1000):
        bench.gc_side.run_binary(artifact, str(tmp_path), 30, batch, 50000, 0.97, timeout=60, recipe=RECIPES[batch])
        args = json.loads((tmp_path / "bench-train.jsonl.args").read_text())
        seen[batch] = (float(args[args.index("--lr") + 1]), "--no-shuffle" in args)
    assert seen == {128: (0.1, False), 1000: (1.0, True)}
    assert RECIPES[1000].lr == 1.0 and not RECIPES[1000].shuffle and "reference" in RECIPES[1000].label


def test_a_task_trains_at_its_recipes_rate_else_its_programs():
    from bench.tasks import LR, RECIPES, Task
    program = type("Program", (), {"optimizer": type("SGD", (), {"lr": 0.05})()})()
    assert Task("m", 1000, program, None, recipe=RECIPES[1000]).lr == 1.0
    assert Task("m", 128, program, None).lr == 0.05
    assert Task("m", 128, type("Program", (), {"optimizer": None})(), None).lr == LR


def test_targets_are_checked_on_the_rows_of_the_run():
    checks = {c["label"]: c for c in report.check_targets(fake_rows())}
    assert checks["MLP step, batch 128, fp32"]["ok"] and checks["MLP step, batch 128, fp32"]["value"] == 10
    assert checks["MLP b128: JAX scan fp32 / gcompile"]["value"] == pytest.approx(4.0)
    assert checks["MLP time to 97% (training loop), b128 lr 0.1 shuffled"]["value"] == pytest.approx(30.0)
    assert checks["MLP process start to 97% printed, b128"]["ok"] and checks["MLP compile, cold"]["ok"]
    assert "MLP step, batch 1000, fp32" not in checks  # no gcompile row at batch 1000
    text = report.format_targets(list(checks.values()))
    assert "ok   MLP step, batch 128, fp32: 10 us (target <= 15 us)" in text
    bandwidth = report.row("eltwise", "eltwise 256MB", None, "gcompile", precision="fp32", step_s=1e-4,
                           fraction_of_copy=0.8)
    check = report.check_targets([bandwidth])[0]
    assert check["label"] == "fused elementwise, of copy bandwidth" and check["value"] == 80 and not check["ok"]
    slow = [dict(r, step_s=r["step_s"] * 20) if r["impl"] == "gcompile" else r for r in fake_rows()]
    assert not {c["label"]: c for c in report.check_targets(slow)}["MLP step, batch 128, fp32"]["ok"]


def fake_trace(steps, per_step=3):
    """A Chrome trace of `steps` steps: a GEMM, then two kernels side by side, the second launched early."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::zeros", "ts": 0.0, "dur": 1.0}]
    for i in range(steps):
        t = 100.0 + 20.0 * i
        events += [
            {"ph": "X", "cat": "kernel", "ts": t, "dur": 7.0,
             "name": "void gc_gemm_pipe_kernel<float, false, false, gc_tile<64, 64, 16, 8, 4, 0, 8, 128, 256, "
                     "784, 4>, k0_fused_relu_ep, false>(gc_gemm_params<float, k0_fused_relu_ep>)"},
            {"ph": "X", "cat": "kernel", "name": "k1_chain_kernel", "ts": t + 6.5, "dur": 8.0 + (i % 2)},
            {"ph": "X", "cat": "kernel", "name": "k2_update_kernel", "ts": t + 14.0, "dur": 5.0},
        ][:per_step]
    return {"traceEvents": events[::-1]}


def test_timeline_places_each_kernel_in_its_step():
    tl = bench.timeline
    events = tl.kernel_events(fake_trace(8))
    assert [e["name"] for e in events[:3]] == [
        "gc_gemm_pipe_kernel gc_tile<64, 64, 16, 8, 4, 0, 8, 128, 256, 784, 4>", "k1_chain_kernel",
        "k2_update_kernel"]
    steps = tl.steps_of(events, 3)
    assert len(steps) == 4 and steps[0][0]["ts"] == 140.0   # the middle half of 8 steps
    summary = tl.summarize(steps)
    assert summary["period"] == 20.0
    chain = summary["kernels"][1]
    assert (chain["name"], chain["start"], chain["end"], chain["count"]) == ("k1_chain_kernel", 6.5, 15.0, 4)
    assert chain["dur"] == 8.5   # the median of 8, 9, 8, 9
    text = tl.table(summary)
    assert "k2_update_kernel" in text and text.count("ends last") == 1 and "period" in text
    assert "ends last" in next(line for line in text.splitlines() if "k2_update_kernel" in line)


def test_timeline_refuses_records_that_are_not_whole_steps():
    tl = bench.timeline
    with pytest.raises(ValueError, match="not steps of 2 kernels"):
        tl.steps_of(tl.kernel_events(fake_trace(4)), 2)
    with pytest.raises(ValueError, match="kernel records for steps of 3"):
        tl.steps_of(tl.kernel_events(fake_trace(1, per_step=2)), 3)


def test_trainer_timeline_cuts_steps_at_the_first_kernel_and_lists_occasional_ones_apart():
    """The trainer's records are not whole steps of a fixed count (an evaluation after an epoch, a graph
    launch's bookkeeping): steps are cut at each start of the step's first kernel, and kernels that run in
    fewer than half of them are listed apart with their count, not taken for the step's last."""
    tl = bench.timeline
    trace = fake_trace(8)
    head = "gc_gemm_pipe_kernel gc_tile<64, 64, 16, 8, 4, 0, 8, 128, 256, 784, 4>"
    trace["traceEvents"] += [{"ph": "X", "cat": "kernel", "name": "k7_eval_kernel", "ts": 100.0 + 20 * 3 + 15.0,
                              "dur": 30.0}]   # after step 3's update: longer than every step's kernel
    events = tl.kernel_events(trace)
    with pytest.raises(ValueError, match="not steps of 3 kernels"):
        tl.steps_of(events, 3)
    steps = tl.steps_at(events, head)
    assert [s[0]["ts"] for s in steps] == [120.0, 140.0, 160.0, 180.0, 200.0]   # 7 whole steps, 1 cut off each end
    assert sum(e["name"] == "k7_eval_kernel" for s in steps for e in s) == 1
    summary = tl.summarize(steps)
    assert summary["steps"] == 5 and summary["period"] == 20.0
    text = tl.table(summary)
    assert "ends last" in next(line for line in text.splitlines() if "k2_update_kernel" in line)
    assert "k7_eval_kernel  (1 launch in 5 steps)" in text and text.count("ends last") == 1
    with pytest.raises(ValueError, match="1 launches of k1_chain_kernel"):
        tl.steps_at(tl.kernel_events(fake_trace(1)), "k1_chain_kernel")


def test_gcompile_step_is_the_trainers():
    """The gcompile row's step is its trainer's (the binary's epochs: training seconds / steps, the batch's
    selection included as in the peers' steps); the library's Model.time_steps figure stays beside it."""
    from bench.gc_side import trainer_step
    fields = {"step_s": 20e-6, "p10_s": 19e-6, "p90_s": 21e-6, "timing": "Model.time_steps (...)"}
    run = {"epochs": [{"train_s": 390 * t} for t in (25e-6, 24e-6, 26e-6)], "stdout_tail": []}
    notes = trainer_step(fields, run, 390)
    assert abs(fields["step_s"] - 25e-6) < 1e-12 and abs(fields["p10_s"] - 24e-6) < 1e-12
    assert abs(fields["p90_s"] - 26e-6) < 1e-12 and fields["trainer_epochs"] == 3
    assert fields["library_step_s"] == 20e-6 and fields["library_p10_s"] == 19e-6
    assert fields["timing"].startswith("trainer") and "library step 20.00 us" in notes[0]
    fields = {"step_s": 20e-6, "p10_s": 19e-6, "p90_s": 21e-6}
    notes = trainer_step(fields, {"epochs": [], "stdout_tail": ["boom"]}, 390)
    assert fields["step_s"] == 20e-6 and "finished no epoch (boom)" in notes[0]


FLOORS_OUT = "".join(json.dumps(line) + "\n" for line in [
    {"gpu": "NVIDIA H100 80GB HBM3", "sms": 132},
    {"kind": "boundary", "form": "programmatic", "blocks": 132, "threads": 256, "kb": 16, "us": 1.75},
    {"kind": "boundary", "form": "persistent", "blocks": 264, "threads": 1024, "kb": 0,
     "skipped": "264 blocks are not resident at once (1 an SM)"},
    {"kind": "pull", "form": "cp.async", "blocks": 128, "threads": 384, "kb": 208, "us": 3.6, "empty_us": 0.87,
     "bytes": 27262976, "tb_per_s": 7.573},
    {"kind": "operands", "form": "A uint8 rows + B box", "blocks": 128, "threads": 256, "kb": 120, "steps": 12,
     "us": 2.9, "empty_us": 1.4, "ns_per_step": 241.7, "bytes": 15728640, "tb_per_s": 5.424}])


def test_floors_output_becomes_rows_and_errors_name_what_failed():
    """floors.cu's JSON lines: the GPU line, then one row a measurement in the table's "floors" section (a phase
    boundary's time a phase; a pull's time beyond an empty launch, its rate in the note; a measurement that
    could not run, skipped with its reason). An error line or a missing GPU line raises with what it said."""
    floors = bench.floors
    result = floors.parse(FLOORS_OUT)
    assert result["gpu"] == "NVIDIA H100 80GB HBM3" and result["sms"] == 132 and len(result["rows"]) == 4
    boundary, skipped, pull, operands = floors.table_rows(result)
    assert boundary["section"] == "floors" and boundary["impl"] == "programmatic"
    assert boundary["model"] == "phase boundary 132x256, 16 KB a block" and abs(boundary["step_s"] - 1.75e-6) < 1e-12
    assert skipped["skipped"] == "264 blocks are not resident at once (1 an SM)" and "step_s" not in skipped
    assert pull["impl"] == "cp.async" and abs(pull["step_s"] - 3.6e-6) < 1e-12
    assert "7.57 TB/s (27.3 MB) beyond an empty launch (0.87 us)" in pull["note"]
    assert operands["model"] == "x @ W1 operands 128x256, 12 K steps" and operands["impl"] == "A uint8 rows + B box"
    assert operands["note"] == "242 ns a K step, 5.42 TB/s (15.7 MB) beyond an empty launch (1.40 us)"
    table = report.format_table(floors.table_rows(result))
    assert "[floors]" in table and "SKIPPED: 264 blocks are not resident" in table
    with pytest.raises(RuntimeError, match="compute capability 8.0: these kernels need 9.0"):
        floors.parse('{"error": "NVIDIA A100 is of compute capability 8.0: these kernels need 9.0"}\n')
    with pytest.raises(RuntimeError, match="printed no GPU line"):
        floors.parse("Segmentation fault\n")


@pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="needs nvcc")
def test_floors_source_builds(tmp_path):
    """bench/floors.cu compiles (sm_90a code and compute_90 PTX) with the nvcc on this machine; it runs on the
    GPU machine only (make bench)."""
    exe = bench.floors.build(tmp_path)
    assert exe.exists() and exe.stat().st_size > 0


def test_determinism_groups_checkpoints_and_names_what_differs(tmp_path):
    """bench.determinism's comparison: runs grouped by their checkpoint's bytes, the most common first; one
    group reports deterministic, two name the runs that differ and the tensors (how many elements, by how much)."""
    import numpy as np
    from gcompile import checkpoint as ck
    det = bench.determinism
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    paths = []
    for i, tensors in enumerate([{"W": w, "step": np.int32(5)}] * 3 + [{"W": w + np.float32(0.5) * (w > 3),
                                                                          "step": np.int32(5)}]):
        paths.append(tmp_path / f"run{i}.ckpt")
        ck.write_checkpoint(paths[-1], ck.Checkpoint(dict(tensors), 7, step=5))
    groups = det.outcomes(paths)
    assert [len(g) for g in groups] == [3, 1] and groups[1] == [paths[3]]
    text, same = det.report(groups, "the model")
    assert not same
    assert "4 runs, 2 different checkpoints (runs each: 3, 1); 1 differ from the most common" in text
    assert "W: 2 of 6 elements differ, the largest by 0.5" in text and "step:" not in text
    text, same = det.report(det.outcomes(paths[:3]), "the model")
    assert same and text == "the model: 3 runs, one checkpoint: deterministic"


@pytest.mark.skipif(not __import__("shutil").which("c++") and not __import__("shutil").which("g++"),
                    reason="needs a C++ compiler")
def test_determinism_runs_a_cpu_trainer(tmp_path, capsys):
    """bench.determinism end to end on the cpu target: a small model file and dataset, three runs of the
    standalone trainer, one checkpoint (exit 0); a failing run is exit 2 with the trainer's message."""
    import numpy as np
    model = tmp_path / "tiny.py"
    model.write_text(
        "import numpy as np\nimport gcompile as gc\n\n"
        "def program(batch_size=8):\n"
        "    x = gc.placeholder('x', (batch_size, 12))\n"
        "    y = gc.placeholder('y', (batch_size,), dtype='int32')\n"
        "    W = gc.variable('W', init=np.random.RandomState(0).normal(0, 0.1, (12, 3)).astype(np.float32))\n"
        "    logits = x @ W\n"
        "    return gc.Program(gc.softmax_cross_entropy(logits, y), [W], gc.SGD(lr=0.1), outputs={'logits': logits},\n"
        "                      name='tiny')\n")
    data = tmp_path / "data"
    data.mkdir()
    r = np.random.RandomState(1)
    for split, n in (("train", 40), ("valid", 16)):
        np.save(data / f"{split}_images.npy", r.randint(0, 256, (n, 12)).astype(np.uint8))
        np.save(data / f"{split}_labels.npy", r.randint(0, 3, n).astype(np.int32))
    det = bench.determinism
    args = [str(model), "--target", "cpu", "--batch-size", "8", "--runs", "3", "--epochs", "2", "--data", str(data)]
    assert det.main(args) == 0
    out = capsys.readouterr().out
    assert "3 runs, one checkpoint: deterministic" in out and "default tiles" in out and "plain launches" in out
    assert det.main(args[:-1] + [str(tmp_path / "nowhere")]) == 2
    assert "run 1 of" in capsys.readouterr().err


def test_determinism_builds_with_this_gpus_record(monkeypatch):
    """Which tuning record bench.determinism builds with: --tuning's file, none for `--tuning none`, else on the
    cuda target this GPU's record in bench/tuned/ for the model, batch and precision (make bench's), where it is."""
    import argparse
    import importlib
    tune = importlib.import_module("gcompile.tune")   # (gcompile.tune, the attribute, is the function)
    det = bench.determinism
    monkeypatch.setattr(tune, "gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    args = argparse.Namespace(tuning=None, target="cuda", model="examples/mnist_mlp.py", batch_size=1000,
                              precision="tf32", set=[])

    def record(**changed):
        return det.build_choice(argparse.Namespace(**{**vars(args), **changed}))[0]
    assert record() == str(ROOT / "bench/tuned/nvidia-h100-80gb-hbm3/mnist_mlp_b1000_tf32.json")
    assert record(batch_size=999) is None
    assert record(target="cpu") is None
    assert record(tuning="none") is None
    assert record(tuning="mine.json") == "mine.json"
    monkeypatch.setattr(tune, "gpu_name", lambda: None)
    assert record() is None


def test_determinism_builds_the_program_its_record_was_tuned_for(monkeypatch):
    """With this GPU's record, bench.determinism builds the MNIST models with make bench's learning rate (the
    records were tuned on those programs; the example's own lr 1.0 is another program), unless --set names one:
    every committed MNIST record then fits the program it builds (checked as gc.compile checks it). A record
    named by --tuning, or none, leaves the settings as given."""
    import argparse
    import importlib
    from gcompile.commands.model_file import load_program, parse_settings
    from gcompile.pipeline import compile_program
    tune = importlib.import_module("gcompile.tune")
    det = bench.determinism
    records = sorted((ROOT / "bench/tuned").glob("*/mnist_*_b*_*.json"))
    assert records
    for path in records:
        model, batch, precision = path.stem.rsplit("_", 2)
        record = json.loads(path.read_text())
        monkeypatch.setattr(tune, "gpu_name", lambda: record["gpu"])
        args = argparse.Namespace(tuning=None, target="cuda", model=f"examples/{model}.py",
                                  batch_size=int(batch[1:]), precision=precision, set=[])
        chosen, settings = det.build_choice(args)
        assert (chosen, settings) == (str(path), [f"lr={bench.tasks.LR}"])
        program = load_program(str(ROOT / args.model), args.batch_size, parse_settings(settings))
        compile_program(program, "cuda", model, precision=precision, tuning=record)
        assert det.build_choice(argparse.Namespace(**{**vars(args), "set": ["lr=0.5"]})) == (str(path), ["lr=0.5"])
        assert det.build_choice(argparse.Namespace(**{**vars(args), "tuning": str(path)})) == (str(path), [])
        assert det.build_choice(argparse.Namespace(**{**vars(args), "tuning": "none"})) == (None, [])


def test_gpu_record_says_why_a_record_is_not_used(tmp_path):
    """bench.tune.gpu_record (make bench's and bench.determinism's lookup): this GPU's record, else why not —
    only other GPUs have one, or the file in this GPU's folder names another GPU — else nothing to say."""
    import shutil
    tune = bench.tune
    h100 = ROOT / "bench/tuned/nvidia-h100-80gb-hbm3/mnist_mlp_b1000_tf32.json"
    path, record, why = tune.gpu_record("mnist_mlp", 1000, "tf32", "NVIDIA H100 80GB HBM3")
    assert (path, why) == (h100, None) and record["gpu"] == "NVIDIA H100 80GB HBM3" and record["kernels"]
    (tmp_path / "nvidia-h100-80gb-hbm3").mkdir()
    shutil.copy(h100, tmp_path / "nvidia-h100-80gb-hbm3")
    path, record, why = tune.gpu_record("mnist_mlp", 1000, "tf32", "NVIDIA H200", root=tmp_path)
    assert path is None and record is None and why == ("mnist_mlp_b1000_tf32.json was tuned on nvidia-h100-80gb-hbm3, not on NVIDIA "
                                    "H200: default tiles")
    (tmp_path / "nvidia-h200").mkdir()
    shutil.copy(h100, tmp_path / "nvidia-h200")
    path, record, why = tune.gpu_record("mnist_mlp", 1000, "tf32", "NVIDIA H200", root=tmp_path)
    assert path is None and record is None and why.endswith("was tuned on NVIDIA H100 80GB HBM3, this GPU is NVIDIA H200: default tiles")
    assert tune.gpu_record("mnist_mlp", 64, "tf32", "NVIDIA H200", root=tmp_path) == (None, None, None)
