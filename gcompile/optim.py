"""Optimizers as graph rewrites: `updates(params, grads, dtype, step)` returns `assign` nodes that write each
parameter (and its optimizer state) in place; `step` is the program's int32 step counter (LR schedules read
it). Hyperparameters that a user may change between runs (the learning rate) are scalar variables, so
compiled programs can set them without recompiling.

`guarded` is the numerical guard gc.Program puts around every optimizer's updates; it runs on the device,
so a trainer replaying many steps without looking at the loss still never applies a non-finite one."""
from __future__ import annotations

from . import graph as G
from .errors import GCompileError
from .init import Constant

# The guard's variables (int32 scalars, saved in checkpoints like every variable):
GUARD_SKIP = "guard.skip"                  # 0: a bad step stops every later update; 1: skip the bad step only
GUARD_NONFINITE = "guard.nonfinite_steps"  # how many steps had a non-finite loss or update
GUARD_HALTED_AT = "guard.halted_at"        # -1, or the step (counter value) that stopped the updates


class SGD:
    """p <- p - lr * v,  v <- momentum * v + (g + weight_decay * p)  (v = the gradient when momentum = 0)."""

    def __init__(self, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0):
        if lr <= 0 or momentum < 0 or weight_decay < 0:
            raise GCompileError(f"SGD: lr must be > 0 and momentum, weight_decay >= 0 (got lr={lr}, "
                                f"momentum={momentum}, weight_decay={weight_decay})")
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)

    def updates(self, params, grads, dtype="float32", step=None):
        lr = G.variable("lr", (), init=Constant(self.lr), dtype=dtype, trainable=False)
        out = []
        for p, g in zip(params, grads):
            step_dir = g + self.weight_decay * p if self.weight_decay else g
            if self.momentum:
                v = G.variable(f"{p.name}.velocity", p.shape, init=Constant(0.0), dtype=p.dtype, trainable=False)
                step_dir = self.momentum * v + step_dir
                out.append(G.assign(v, step_dir))
            out.append(G.assign(p, p - lr * step_dir))
        return out


def guard_variable(name: str, value: int):
    return G.variable(name, (), init=Constant(value), dtype="int32", trainable=False)


def guarded(updates, loss, step):
    """Rewrite each `assign(v, new)` into `assign(v, where(ok, new, v))`: ok when the loss and every value the
    step writes are finite, and the guard has not halted.

    A bad step counts in guard.nonfinite_steps; unless guard.skip is 1 it also records its step in
    guard.halted_at, which holds every later update, so the last finite state stays in place until a host
    that looks only now and then sees it. No host synchronisation per step, and the numpy executor runs
    the same nodes, so it reproduces the guard exactly."""
    skip, count, halted_at = (guard_variable(GUARD_SKIP, 0), guard_variable(GUARD_NONFINITE, 0),
                              guard_variable(GUARD_HALTED_AT, -1))
    # x * 0 is 0 for finite x and NaN for inf or NaN: the sum below is finite iff the loss and every new
    # float value are (no overflow is possible, unlike a plain sum of the values).
    probe = loss
    for u in updates:
        new = u.inputs[1]
        if new.dtype in G.FLOAT_DTYPES:
            part = G.reduce_sum(new * 0.0)
            probe = probe + (part if part.dtype == loss.dtype else G.cast(part, loss.dtype))
    finite = G.cast(G.isfinite(probe), "int32")
    running = G.equal(halted_at, -1)
    ok = finite * running
    out = [G.assign(u.inputs[0], G.where(ok, u.inputs[1], u.inputs[0])) for u in updates]
    bad = 1 - finite
    out.append(G.assign(count, count + bad))
    out.append(G.assign(halted_at, G.where(bad * (1 - skip) * running, step, halted_at)))
    return out
