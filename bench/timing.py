"""How everything is timed, the same way for every implementation.

Per-step time: `run_window(n)` runs n steps and returns the seconds they took, measured on the device
(CUDA events, `Model.time_steps`, or a host clock around work ended by a device synchronisation). One
window calibrates the step count so that a timed window lasts about `window_s`; then `windows` windows are
timed, and the per-step time of each window is one sample (median and p10/p90 reported).

Time to accuracy: `train_epoch(epoch)` runs one epoch (in its recipe's order: bench/tasks.py, RECIPES) and returns
its device-synchronised seconds;
`evaluate()` returns the validation accuracy. Evaluation runs between epochs and is not counted.
"""
from __future__ import annotations

import time

from .report import step_stats


class Settings:
    """Repetitions for a full run and for --quick."""

    def __init__(self, quick: bool):
        self.quick = quick
        self.windows = 7 if quick else 25
        self.window_s = 0.004 if quick else 0.02
        self.warmup_steps = 5 if quick else 20
        self.max_epochs = 2 if quick else 30  # logreg needs ~10-15 epochs to 0.92 at lr 0.1


def time_windows(run_window, settings: Settings, warmup: int | None = None, steps_per_call: int = 1) -> dict:
    """run_window(n) runs n calls of `steps_per_call` steps each (a scanned epoch is one call)."""
    run_window(warmup or settings.warmup_steps)            # warm-up (allocations, autotuning, caches)
    probe = 3 if settings.quick else 10
    per_call = run_window(probe) / probe
    n = int(min(5000, max(3, round(settings.window_s / max(per_call, 1e-7)))))
    samples = [run_window(n) / (n * steps_per_call) for _ in range(settings.windows)]
    return dict(step_stats(samples), steps_per_window=n * steps_per_call)


def time_to_accuracy(train_epoch, evaluate, target: float, max_epochs: int) -> dict:
    total, accuracy = 0.0, None
    for epoch in range(max_epochs):
        total += train_epoch(epoch)
        accuracy = evaluate()
        if accuracy >= target:
            return {"tta_s": total, "tta_epochs": epoch + 1, "tta_acc": accuracy}
    return {"tta_s": None, "tta_epochs": max_epochs, "tta_acc": accuracy,
            "tta_note": f"target {target} not reached in {max_epochs} epochs (last {accuracy:.4f})"}


class Budget:
    """The run's time budget: optional work (torch.compile, slow peers' accuracy runs) is skipped with a
    printed reason when it would not fit."""

    def __init__(self, seconds: float):
        self.start, self.seconds = time.perf_counter(), seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def allows(self, estimate_s: float) -> str | None:
        """None when `estimate_s` more seconds fit, else the reason to skip."""
        if self.left() >= estimate_s:
            return None
        return f"time budget: {self.left():.0f} s left of {self.seconds:.0f} s, this needs ~{estimate_s:.0f} s"
