"""Optimizers as graph rewrites: `updates(params, grads)` returns `assign` nodes that write each parameter
(and its optimizer state) in place. Hyperparameters that a user may change between runs (the learning
rate) are scalar variables, so compiled programs can set them without recompiling. Optimizer state
(velocities, Adam's moments) are non-trainable variables: they live in the arena and in checkpoints.

Learning-rate schedules are part of the train graph too: the step's rate is lr * factor(step, total_steps),
where `lr` is the base rate variable (the binary's --lr), `step` the program's step counter and
`total_steps` an int32 variable the binary sets to epochs x steps per epoch before training (from Python,
set it with `model.set("total_steps", n)`, or give total_steps= to the schedule). numpy, cpu and cuda
compute the same factor.

`guarded` is the numerical guard gc.Program puts around every optimizer's updates; it runs on the device,
so a trainer replaying many steps without looking at the loss still never applies a non-finite one.
"""
from __future__ import annotations

import math
import numbers

from . import graph as G
from .errors import GCompileError
from .init import Constant

# The guard's variables (int32 scalars, saved in checkpoints like every variable):
GUARD_SKIP = "guard.skip"                  # 0: a non-finite loss stops every later update; 1: skip that step
GUARD_NONFINITE = "guard.nonfinite_steps"  # how many steps had a non-finite loss
GUARD_HALTED_AT = "guard.halted_at"        # -1, or the step (counter value) whose loss stopped the updates


class Schedule:
    """A factor of the base learning rate, as a graph of the step counter and `total_steps`."""

    def __init__(self, total_steps: int = 1):
        if int(total_steps) < 1:
            raise GCompileError(f"{type(self).__name__}: total_steps must be >= 1, got {total_steps}")
        self.total_steps = int(total_steps)

    def progress(self, dtype):
        """(step, total steps) as floats of `dtype`."""
        total = G.variable("total_steps", (), init=Constant(self.total_steps), dtype="int32", trainable=False)
        return G.cast(G.step_counter(), dtype), G.cast(total, dtype)


class CosineSchedule(Schedule):
    """factor = final + (1 - final) * (1 + cos(pi * min(step / total_steps, 1))) / 2: from 1 down to `final`."""

    def __init__(self, total_steps: int = 1, final: float = 0.0):
        super().__init__(total_steps)
        self.final = float(final)

    def factor(self, dtype):
        step, total = self.progress(dtype)
        half_cosine = (G.cos(G.minimum(step / total, 1.0) * math.pi) + 1.0) * 0.5
        return half_cosine * (1.0 - self.final) + self.final if self.final else half_cosine


class StepSchedule(Schedule):
    """factor = gamma ** (the number of milestones passed); milestones are fractions of total_steps: m passes at
    step floor(m * total_steps + 0.5) (steps counted from 0; the product in float64), as PyTorch's MultiStepLR at
    that whole step."""

    def __init__(self, milestones=(0.5, 0.75), gamma: float = 0.1, total_steps: int = 1):
        super().__init__(total_steps)
        if sorted(milestones) != list(milestones) or not all(0 < m < 1 for m in milestones):
            raise GCompileError(f"StepSchedule: milestones must be increasing fractions in (0, 1), got "
                                f"{milestones}")
        self.milestones, self.gamma = tuple(float(m) for m in milestones), float(gamma)

    def factor(self, dtype):
        step, total = self.progress(dtype)
        factor = None
        for m in self.milestones:
            # the milestone's whole step, from a float64 product: float32's 0.3 x 100 is 30.000002, which step 30
            # did not reach, and its halves round either way
            at = G.cast(G.cast(G.cast(total, "float64") * m + 0.5, "int32"), dtype)
            term = G.greater_equal(step, at) * (self.gamma - 1.0) + 1.0
            factor = term if factor is None else factor * term
        return factor


SCHEDULES = {"cosine": CosineSchedule, "step": StepSchedule}


def make_schedule(schedule):
    """None / "constant" (no schedule), "cosine", "step", or a Schedule."""
    if schedule is None or schedule == "constant" or isinstance(schedule, Schedule):
        return None if schedule == "constant" else schedule
    if schedule not in SCHEDULES:
        raise GCompileError(f"unknown learning-rate schedule {schedule!r}; expected constant, "
                            f"{', '.join(SCHEDULES)} or a Schedule")
    return SCHEDULES[schedule]()


def learning_rate(base: float, schedule, dtype):
    """The step's learning rate: the variable `lr` (initially `base`) times the schedule's factor."""
    lr = G.variable("lr", (), init=Constant(base), dtype=dtype, trainable=False)
    return lr if schedule is None else lr * schedule.factor(dtype)


def finite_numbers(owner: str, **values) -> list[float]:
    """The hyperparameters as floats, each a finite real number (not text, NaN or inf: NaN would pass every
    range check below), else a GCompileError naming it."""
    out = []
    for name, value in values.items():
        if getattr(value, "shape", None) == ():   # a 0-d array (np.array(0.1)): its number
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise GCompileError(f"{owner}: {name} must be a finite number, got {value!r}")
        out.append(float(value))
    return out


class SGD:
    """p <- p - lr * v,  v <- momentum * v + (g + weight_decay * p)  (v = the gradient when momentum = 0)."""

    def __init__(self, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0, schedule=None):
        lr, momentum, weight_decay = finite_numbers("SGD", lr=lr, momentum=momentum, weight_decay=weight_decay)
        if lr <= 0 or momentum < 0 or weight_decay < 0:
            raise GCompileError(f"SGD: lr must be > 0 and momentum, weight_decay >= 0 (got lr={lr}, "
                                f"momentum={momentum}, weight_decay={weight_decay})")
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.schedule = make_schedule(schedule)

    def updates(self, params, grads, dtype="float32"):
        lr = learning_rate(self.lr, self.schedule, dtype)
        out = []
        for p, g in zip(params, grads):
            step = g + self.weight_decay * p if self.weight_decay else g
            if self.momentum:
                v = G.variable(f"{p.name}.velocity", p.shape, init=Constant(0.0), dtype=p.dtype, trainable=False)
                step = self.momentum * v + step
                out.append(G.assign(v, step))
            out.append(G.assign(p, p - lr * step))
        return out


class Adam:
    """Adam (Kingma & Ba 2015) with bias correction by the step counter t = step + 1:
        m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2,
        p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
    weight_decay adds weight_decay * p to g (L2); AdamW instead adds lr * weight_decay * p to the step
    (decoupled, Loshchilov & Hutter 2019)."""

    decoupled = False

    def __init__(self, lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0, schedule=None):
        lr, beta1, beta2, eps, weight_decay = finite_numbers(type(self).__name__, lr=lr, beta1=beta1, beta2=beta2,
                                                             eps=eps, weight_decay=weight_decay)
        if lr <= 0 or not (0 <= beta1 < 1 and 0 <= beta2 < 1) or eps <= 0 or weight_decay < 0:
            raise GCompileError(f"{type(self).__name__}: need lr > 0, 0 <= beta1, beta2 < 1, eps > 0, "
                                f"weight_decay >= 0 (got lr={lr}, beta1={beta1}, beta2={beta2}, eps={eps}, "
                                f"weight_decay={weight_decay})")
        self.lr, self.beta1, self.beta2, self.eps = float(lr), float(beta1), float(beta2), float(eps)
        self.weight_decay = float(weight_decay)
        self.schedule = make_schedule(schedule)

    def updates(self, params, grads, dtype="float32"):
        lr = learning_rate(self.lr, self.schedule, dtype)
        # 1 - b^t in float64, then the program's type: in float32 it cancels (beta2 = 0.99999 at t = 1: 1.0014e-5
        # for 1e-5), as PyTorch's host-side double does not
        t = G.cast(G.step_counter(), "float64") + 1.0
        b1, b2 = self.beta1, self.beta2
        correct1 = G.cast(1.0 - G.exp(t * math.log(b1)), dtype) if b1 else None
        correct2 = G.cast(1.0 - G.exp(t * math.log(b2)), dtype) if b2 else None
        out = []
        for p, g in zip(params, grads):
            if self.weight_decay and not self.decoupled:
                g = g + self.weight_decay * p
            m = G.variable(f"{p.name}.adam_m", p.shape, init=Constant(0.0), dtype=p.dtype, trainable=False)
            v = G.variable(f"{p.name}.adam_v", p.shape, init=Constant(0.0), dtype=p.dtype, trainable=False)
            m_new = b1 * m + (1.0 - b1) * g
            v_new = b2 * v + (1.0 - b2) * (g * g)
            m_hat = m_new / correct1 if correct1 is not None else m_new
            v_hat = v_new / correct2 if correct2 is not None else v_new
            step = m_hat / (G.sqrt(v_hat) + self.eps)
            if self.weight_decay and self.decoupled:
                step = step + self.weight_decay * p
            out += [G.assign(m, m_new), G.assign(v, v_new), G.assign(p, p - lr * step)]
        return out


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.01): p <- p - lr * (adam step + weight_decay * p)."""

    decoupled = True

    def __init__(self, lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.01, schedule=None):
        super().__init__(lr, beta1, beta2, eps, weight_decay, schedule)


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def make_optimizer(name: str, lr: float, schedule=None, **options):
    """An optimizer by name (sgd, adam, adamw), as model files' options choose it."""
    if name not in OPTIMIZERS:
        raise GCompileError(f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name](lr=lr, schedule=schedule, **options)


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
    # Every node below reads the loss's finiteness, so the guard joins the loss's kernel and adds none (a
    # node of the guard's variables alone, such as halted_at == -1, would be a kernel of its own).
    finite = G.cast(G.isfinite(loss), "int32")
    bad = 1 - finite
    ok = G.equal(finite * halted_at, -1)                  # finite and not halted
    stops = G.equal(bad * halted_at, -1)                  # not finite and not halted ...
    stops = stops - stops * skip                          # ... and not skipping
    out = [G.assign(u.inputs[0], G.where(ok, u.inputs[1], u.inputs[0])) for u in updates]
    out.append(G.assign(count, count + bad))
    out.append(G.assign(halted_at, G.where(stops, step, halted_at)))
    return out
