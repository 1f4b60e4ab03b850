"""gcompile: an ahead-of-time compiler for neural-network training.

A model is a graph built with this API; `gradients` differentiates it, `NumpyExecutor` is the reference,
and `compile` turns a `Program` into one C++/CUDA source file and a binary or shared library.
"""
__version__ = "0.1.0"

from . import init, layers  # noqa: F401
from .autodiff import gradients  # noqa: F401
from .errors import BuildError, DataError, GCompileError, PlanError, RuntimeFailure, ShapeError  # noqa: F401
from .executor import NumpyExecutor  # noqa: F401
from .graph import (Node, add, as_node, assign, broadcast_to, cast, constant, div, equal, exp,  # noqa: F401
                    format_graph, greater_equal, isfinite, log, log_softmax, matmul, maximum, minimum, mul,
                    neg, one_hot, ones_like, placeholder, pow, reduce_max, reduce_mean, reduce_sum, relu,
                    relu_grad, reshape, sigmoid, softmax, softmax_cross_entropy, sqrt, sub, tanh,
                    topological_order, transpose, variable, where, zeros_like)
from .graph import (avg_pool2d, batch_norm, col2im, conv2d, cos, dropout, flatten, global_avg_pool,  # noqa: F401
                    im2col, max_pool2d, mode_select, sin, step_counter)
from .modes import specialize  # noqa: F401
from .optim import SGD, Adam, AdamW, CosineSchedule, StepSchedule  # noqa: F401
from .program import Program  # noqa: F401
from .build import Artifact  # noqa: F401
from .checkpoint import Checkpoint, read_checkpoint, write_checkpoint  # noqa: F401
from .compiler import Executor, compile  # noqa: F401,A004
from .tune import tune  # noqa: F401


def __getattr__(name):
    """gc.load and gc.Model import cffi and parse the C ABI: done on first use, not at import."""
    if name in ("load", "Model"):
        from . import loader
        return getattr(loader, name)
    raise AttributeError(f"module 'gcompile' has no attribute {name!r}")

