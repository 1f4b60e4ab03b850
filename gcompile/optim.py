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
GUARD_SKIP = "guard.skip"                  # 0: a non-finite loss stops every later update; 1: skip that step
GUARD_NONFINITE = "guard.nonfinite_steps"  # how many steps had a non-finite loss
GUARD_HALTED_AT = "guard.halted_at"        # -1, or the step (counter value) whose loss stopped the updates


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
    """Rewrite each `assign(v, new)` into `assign(v, where(ok, new, v))`: ok when the loss is finite and the
    guard has not halted.

    A non-finite loss counts in guard.nonfinite_steps; unless guard.skip is 1 it also records its step in
    guard.halted_at, which holds every later update, so the last finite state stays in place until a host
    that looks only now and then sees it. No host synchronisation per step, `ok` is known before any update
    is computed (so an update stays one fusable elementwise pass), and the numpy executor runs the same
    nodes, so it reproduces the guard exactly. (An update that overflows while the loss is finite is caught
    when the parameters are saved: checkpoints refuse non-finite values.)"""
    skip, count, halted_at = (guard_variable(GUARD_SKIP, 0), guard_variable(GUARD_NONFINITE, 0),
                              guard_variable(GUARD_HALTED_AT, -1))
    finite = G.cast(G.isfinite(loss), "int32")
    running = G.equal(halted_at, -1)
    ok = finite * running
    out = [G.assign(u.inputs[0], G.where(ok, u.inputs[1], u.inputs[0])) for u in updates]
    bad = 1 - finite
    out.append(G.assign(count, count + bad))
    out.append(G.assign(halted_at, G.where(bad * (1 - skip) * running, step, halted_at)))
    return out
