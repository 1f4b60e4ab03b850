"""PyTorch peers: eager, torch.compile of the whole step, and the step captured in a CUDA graph by hand.

Every variant runs the same Python step: gather the batch from the dataset resident on the device by
shuffled indices, forward, cross-entropy, backward, optimizer step. The CUDA-graph variant captures exactly
that (the index vector is a static input: one device copy before each replay). Per-step time is measured
with CUDA events around windows of steps; memory is torch.cuda.max_memory_allocated() during warm-up and
timing minus what was allocated before (parameters and the dataset); kernels per step come from
torch.profiler over 5 steps.
"""
from __future__ import annotations

import time

from .report import failed, row, skipped
from .tasks import Task, check_loss
from .timing import time_to_accuracy, time_windows

IMPLS = ("torch-eager", "torch-graph", "torch-compile")
_resident = {}  # (dataset, device) -> tensors on the device


def versions() -> dict:
    import torch
    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None}


def set_precision(torch, precision: str) -> str:
    """fp32: IEEE float32 matmuls and convolutions; tf32: tensor cores for both. Returns what was set."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return (f"torch.backends.cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32} (float32 matmul "
            f"precision {torch.get_float32_matmul_precision()!r}), cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}")


def resident(torch, task: Task, device: str):
    key = (task.data.name, device)
    if key not in _resident:
        d = task.data
        _resident[key] = tuple(torch.from_numpy(a).to(device) for a in (d.train_x, d.train_y.astype("int64"),
                                                                          d.valid_x, d.valid_y.astype("int64")))
    X, Y, VX, VY = _resident[key]
    shape = (-1,) + task.input_shape
    return X.view(shape), Y, VX.view(shape), VY


class Sync:
    """Device timing: CUDA events on cuda, the host clock on cpu."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device == "cuda"

    def __call__(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def window(self, run):
        if not self.cuda:
            t0 = time.perf_counter()
            run()
            return time.perf_counter() - t0
        start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def make_step(torch, impl, model, opt, X, Y, batch, device, sync) -> dict:
    """{"step": step(idx) -> loss tensor, "loss0": the first step's loss on examples 0..batch-1,
    and for torch.compile "compile_s" (first call) and "recompile" (dynamo reset, compile again: cached)}."""
    F = torch.nn.functional

    def train_step(idx):
        loss = F.cross_entropy(model(X[idx]), Y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    first = torch.arange(batch, device=device)
    if impl == "torch-eager":
        return {"step": train_step, "loss0": float(train_step(first).detach())}
    if impl == "torch-compile":
        def compile_and_call():
            compiled = torch.compile(train_step)
            sync()
            t0 = time.perf_counter()
            loss = float(compiled(first).detach())
            return compiled, loss, time.perf_counter() - t0

        def recompile():
            torch._dynamo.reset()
            compiled, _, seconds = compile_and_call()
            return compiled, seconds
        compiled, loss0, seconds = compile_and_call()
        return {"step": compiled, "loss0": loss0, "compile_s": seconds, "recompile": recompile}
    # torch-graph: warm up on a side stream, capture forward + backward + step (PyTorch's documented
    # whole-network capture), then each step copies its indices into the static input and replays.
    static_idx = first.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        loss0 = float(train_step(static_idx).detach())
        for _ in range(2):
            train_step(static_idx)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = F.cross_entropy(model(X[static_idx]), Y[static_idx])
        static_loss.backward()
        opt.step()

    def replay(idx):
        static_idx.copy_(idx)
        graph.replay()
        return static_loss
    return {"step": replay, "loss0": loss0}


def count_kernels(torch, step, batches, steps=5):
    """(kernels, copies/sets) per step seen by torch.profiler on the device, or (None, None)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(batches[i])
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    copies = sum(n.startswith(("Memcpy", "Memset")) for n in names)
    if len(names) == copies:  # nothing seen (or a graph replay the profiler did not resolve into kernels)
        return None, round(copies / steps, 1)
    return round((len(names) - copies) / steps, 1), round(copies / steps, 1)


def accuracy_run(torch, task, model, initial, step, sync, device, max_epochs):
    """Reset to the initial values (in place: a captured graph holds these tensors), then train epochs in the
    recipe's order (shuffled, or the file's) until the target accuracy."""
    X, Y, VX, VY = resident(torch, task, device)
    with torch.no_grad():
        for p, p0 in zip(model.parameters(), initial):
            p.copy_(p0)
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    n, b = len(Y), task.batch

    def train_epoch(_):
        sync()
        t0 = time.perf_counter()
        perm = (torch.randperm(n, device=device, generator=gen) if task.recipe.shuffle else
                torch.arange(n, device=device))
        for s in range(n // b):
            step(perm[s * b:(s + 1) * b])
        sync()
        return time.perf_counter() - t0

    def evaluate():
        with torch.no_grad():
            return float((model(VX).argmax(1) == VY).float().mean())
    return time_to_accuracy(train_epoch, evaluate, task.target, max_epochs)


def torch_rows(task: Task, impls, precision: str, settings, budget, device: str, with_accuracy: bool) -> list:
    try:
        import torch

        from .torch_models import optimizer_for, twin
    except ImportError as e:
        return [skipped(task.section, task.model, task.batch, impl, f"PyTorch missing: {e}") for impl in impls]
    mode = set_precision(torch, precision)
    torch.backends.cudnn.benchmark = True
    rows = []
    for impl in impls:
        if impl == "torch-graph" and device != "cuda":
            rows.append(skipped(task.section, task.model, task.batch, impl, "CUDA graphs need a GPU",
                                precision=precision))
            continue
        if impl == "torch-compile":
            reason = budget.allows(60)
            if reason:
                rows.append(skipped(task.section, task.model, task.batch, impl, reason, precision=precision))
                continue
        try:
            rows.append(torch_row(torch, task, impl, precision, mode, settings, budget, device, with_accuracy,
                                  twin, optimizer_for))
        except Exception as e:  # a peer that fails is reported and skipped, the benchmark goes on
            rows.append(failed(task.section, task.model, task.batch, impl, e, precision=precision))
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def torch_row(torch, task, impl, precision, mode, settings, budget, device, with_accuracy, twin, optimizer_for):
    model, arch = twin(task)
    if model is None:
        return skipped(task.section, task.model, task.batch, impl, arch, precision=precision)
    model = model.to(device).train()
    initial = [p.detach().clone() for p in model.parameters()]
    opt = optimizer_for(task, model.parameters(), capturable=impl == "torch-graph")
    X, Y, _, _ = resident(torch, task, device)
    sync = Sync(torch, device)
    cuda = device == "cuda"
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    made = make_step(torch, impl, model, opt, X, Y, task.batch, device, sync)
    step = made["step"]
    notes = [n for n in [check_loss(made["loss0"], task.reference_loss, precision)] if n]
    fields = dict(precision=precision, matmul_mode=mode, architecture=arch)
    if "compile_s" in made:
        fields["compile_cold_s"] = made["compile_s"]
        if budget.allows(60) is None:
            step, fields["compile_cached_s"] = made["recompile"]()
    perm = torch.randperm(len(Y), device=device, generator=torch.Generator(device=device).manual_seed(1))
    batches = [perm[s * task.batch:(s + 1) * task.batch] for s in range(len(Y) // task.batch)]

    def run_window(n):
        def run():
            for i in range(n):
                step(batches[i % len(batches)])
        return sync.window(run)
    fields.update(time_windows(run_window, settings))
    if cuda:
        fields["mem_bytes"] = torch.cuda.max_memory_allocated() - base
        fields["kernels"], copies = count_kernels(torch, step, batches)
        if copies:
            notes.append(f"+{copies} memcpy/memset per step")
    if with_accuracy and task.target is not None and task.recipe is not None:
        reason = budget.allows(settings.max_epochs * len(batches) * fields["step_s"] * 1.5)
        if reason:
            notes.append(f"no accuracy run: {reason}")
        else:
            fields.update(accuracy_run(torch, task, model, initial, step, sync, device, settings.max_epochs))
    return row(task.section, task.model, task.batch, impl, note="; ".join(notes), **fields)


def copy_row(model_name: str, n: int, settings, device: str) -> dict:
    """A device-to-device copy of n float32 values (dst.copy_(src)): the bandwidth the fused elementwise
    kernel is compared with, counting bytes read + written."""
    try:
        import torch
    except ImportError as e:
        return skipped("eltwise", model_name, None, "torch copy_", f"PyTorch missing: {e}")
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    sync = Sync(torch, device)

    def run_window(k):
        def run():
            for _ in range(k):
                dst.copy_(src)
        return sync.window(run)
    fields = time_windows(run_window, settings, warmup=3)
    fields.update(bytes_moved=2 * 4 * n, bandwidth_Bps=2 * 4 * n / fields["step_s"], precision="fp32")
    return row("eltwise", model_name, None, "torch copy_", **fields)
