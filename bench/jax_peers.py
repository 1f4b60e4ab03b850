"""JAX peers: one jitted training step per call, and a whole epoch in one lax.scan.

Both run the same step function: gather the batch from the dataset resident on the device by shuffled
indices, forward, cross-entropy, gradient, SGD; parameters are donated so updates happen in place.
Functions are compiled ahead of time (`jit(...).lower(...).compile()`), which gives the compile time, the
XLA temporary memory (memory_analysis) and the optimized HLO, from which kernels per step are estimated
(one per fusion, custom call or other non-trivial instruction of the step's computation — the while
body for the scan). The persistent compilation cache (a fresh folder per run) gives the cached compile
time: the same function compiled again after jax.clear_caches().
"""
from __future__ import annotations

import re
import time
import warnings

import numpy as np

from .report import failed, row, skipped
from .tasks import Task, check_loss
from .timing import time_to_accuracy, time_windows

IMPLS = ("jax-jit", "jax-scan")
NOT_KERNELS = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id",
               "replica-id", "opt-barrier", "add-dependency", "copy-start", "copy-done"}
PRECISION = {"fp32": "float32", "tf32": "tensorfloat32"}
_state = {}
_resident = {}  # dataset name -> (X, Y, VX, VY) on the default device


def setup(cache_dir) -> None:
    """Once per process, before anything compiles: the persistent compilation cache in a fresh folder."""
    import jax
    if not _state:
        jax.config.update("jax_compilation_cache_dir", str(cache_dir))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
        _state["ready"] = True


def versions() -> dict:
    import jax
    import jaxlib
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "jax_backend": jax.default_backend()}


def hlo_kernels(text: str, scan: bool) -> int | None:
    """Kernels per step estimated from optimized HLO text: instructions that launch work, in the entry
    computation (or, for a scan, in its while loop's body), looking through calls and nested loops."""
    comps, current, entry = {}, None, None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            m = re.match(r"(ENTRY\s+)?%?([^\s(]+)", line)
            current = m.group(2)
            comps[current] = []
            entry = current if m.group(1) else entry
        elif current is not None and " = " in line:
            m = re.search(r"=\s*(\(.*?\)|\S+)\s+([\w\-]+)\((.*)", line)
            if m:
                comps[current].append((m.group(2), m.group(3)))

    def called(args, key):
        m = re.search(rf"{key}=%?([\w.\-]+)", args)
        return m.group(1) if m and m.group(1) in comps else None

    def count(name):
        total = 0
        for op, args in comps[name]:
            if op in NOT_KERNELS:
                continue
            inner = called(args, "body") if op == "while" else called(args, "to_apply") if op == "call" else None
            total += count(inner) if inner else 1
        return total
    if entry is None:
        return None
    if scan:
        bodies = [called(args, "body") for op, args in comps[entry] if op == "while"]
        return count(bodies[0]) if bodies and bodies[0] else None
    return count(entry)


def make_functions(jax, depth: int, batch: int, steps: int, lr: float):
    import jax.numpy as jnp
    from jax import lax

    def loss_fn(params, x, y):
        h = x
        for i, (W, b) in enumerate(params):
            h = h @ W + b
            if i < depth - 1:
                h = jax.nn.relu(h)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(h), y[:, None], axis=1))

    def step(params, X, Y, perm, s):
        idx = lax.dynamic_slice_in_dim(perm, s * batch, batch)
        loss, grads = jax.value_and_grad(loss_fn)(params, X[idx], Y[idx])
        return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss

    def epoch(params, X, Y, perm):
        params, losses = lax.scan(lambda p, s: step(p, X, Y, perm, s), params, jnp.arange(steps, dtype=jnp.int32))
        return params, losses[-1]

    def predict(params, X):
        h = X
        for i, (W, b) in enumerate(params):
            h = h @ W + b
            if i < depth - 1:
                h = jax.nn.relu(h)
        return jnp.argmax(h, axis=1)
    return step, epoch, predict


def compile_timed(jax, fn, args, donate: bool):
    t0 = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=(0,) if donate else ()).lower(*args).compile()
    return compiled, time.perf_counter() - t0


def jax_rows(task: Task, impls, precision: str, settings, budget, device: str, with_accuracy: bool) -> list:
    try:
        import jax
    except ImportError as e:
        return [skipped(task.section, task.model, task.batch, impl, f"JAX missing: {e}") for impl in impls]
    if task.section != "mnist":
        return [skipped(task.section, task.model, task.batch, impl, "JAX peers cover the dense models only")
                for impl in impls]
    rows = []
    for impl in impls:
        try:
            with jax.default_matmul_precision(PRECISION[precision]):
                rows.append(jax_row(jax, task, impl, precision, settings, budget, with_accuracy))
        except Exception as e:  # a peer that fails is reported and skipped, the benchmark goes on
            rows.append(failed(task.section, task.model, task.batch, impl, e, precision=precision))
    return rows


def jax_row(jax, task, impl, precision, settings, budget, with_accuracy) -> dict:
    import jax.numpy as jnp
    d, b = task.data, task.batch
    n = len(d.train_y)
    steps = n // b
    depth = len([k for k in task.init if k.startswith("W")])
    initial = [(task.init[f"W{i}"], task.init[f"b{i}"]) for i in range(1, depth + 1)]
    if d.name not in _resident:
        _resident[d.name] = tuple(jax.device_put(a) for a in (d.train_x, d.train_y, d.valid_x, d.valid_y))
    X, Y, VX, VY = _resident[d.name]
    step, epoch, predict = make_functions(jax, depth, b, steps, task.lr)
    params = jax.device_put(initial)
    order = jnp.arange(n, dtype=jnp.int32)
    scan = impl == "jax-scan"
    fn, args = (epoch, (params, X, Y, order)) if scan else (step, (params, X, Y, order, jnp.int32(0)))
    compiled, cold = compile_timed(jax, fn, args, donate=True)
    jax.clear_caches()
    compiled, cached = compile_timed(jax, fn, args, donate=True)
    notes = []
    if not scan:  # the first step on examples 0..batch-1 against the numpy reference
        params, loss0 = compiled(params, X, Y, order, jnp.int32(0))
        note = check_loss(float(loss0), task.reference_loss, precision)
        notes += [note] if note else []
    memory = compiled.memory_analysis()
    fields = dict(precision=precision, matmul_mode=f"jax.default_matmul_precision({PRECISION[precision]!r})",
                  compile_cold_s=cold, compile_cached_s=cached,
                  mem_bytes=getattr(memory, "temp_size_in_bytes", None) if memory is not None else None,
                  kernels=hlo_kernels(compiled.as_text(), scan), kernels_source="HLO estimate")
    perm = jax.random.permutation(jax.random.PRNGKey(1), n).astype(jnp.int32)
    indices = [jax.device_put(np.int32(s)) for s in range(steps)]
    state = {"params": params}

    def run_window(k):
        p = state["params"]
        t0 = time.perf_counter()
        for i in range(k):
            p, loss = compiled(p, X, Y, perm) if scan else compiled(p, X, Y, perm, indices[i % steps])
        jax.block_until_ready(p)
        state["params"] = p
        return time.perf_counter() - t0
    fields.update(time_windows(run_window, settings, warmup=2 if scan else None, steps_per_call=steps if scan else 1))
    if with_accuracy and task.target is not None and task.recipe is not None:
        reason = budget.allows(settings.max_epochs * steps * fields["step_s"] * 1.5 + 5)
        if reason:
            notes.append(f"no accuracy run: {reason}")
        else:
            fields.update(accuracy_run(jax, compiled, scan, predict, initial, X, Y, VX, VY, indices, n,
                                       task.target, settings.max_epochs, task.recipe.shuffle))
    return row(task.section, task.model, b, impl, note="; ".join(notes), **fields)


def accuracy_run(jax, compiled, scan, predict, initial, X, Y, VX, VY, indices, n, target, max_epochs,
                 shuffle: bool = True) -> dict:
    """Train epochs from the initial values, in a new permutation each (shuffle) or the file's order, until the
    target accuracy."""
    import jax.numpy as jnp
    predict = jax.jit(predict)

    @jax.jit
    def next_permutation(key):
        key, sub = jax.random.split(key)
        return key, jax.random.permutation(sub, n).astype("int32")
    jax.block_until_ready(next_permutation(jax.random.PRNGKey(1)))  # compiled before the clock starts
    state = {"params": jax.device_put(initial), "key": jax.random.PRNGKey(0)}
    in_order = jax.block_until_ready(jnp.arange(n, dtype=jnp.int32))

    def train_epoch(_):
        jax.block_until_ready(state["params"])
        t0 = time.perf_counter()
        if shuffle:
            state["key"], perm = next_permutation(state["key"])
        else:
            perm = in_order
        p = state["params"]
        if scan:
            p, _ = compiled(p, X, Y, perm)
        else:
            for s in indices:
                p, _ = compiled(p, X, Y, perm, s)
        jax.block_until_ready(p)
        state["params"] = p
        return time.perf_counter() - t0

    def evaluate():
        return float((predict(state["params"], VX) == VY).mean())
    return time_to_accuracy(train_epoch, evaluate, target, max_epochs)
