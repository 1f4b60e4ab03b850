"""Malformed graphs fail where they are built, with a ShapeError that names the op, the nodes and the shapes.

Each case lists the fragments its message must contain, in order: the op first, then the nodes (name, shape,
dtype — `Node.describe()`) and the other shapes involved."""
import re

import numpy as np
import pytest

import gcompile as gc

P = gc.placeholder


def message(*fragments) -> str:
    """A regex matching a message that contains `fragments` in this order."""
    return ".*".join(re.escape(f) for f in fragments)


CASES = {
    "matmul inner": (lambda: P("a", (3, 4)) @ P("b", (5, 6)),
                     ["matmul", "a (3, 4) float32 @ b (5, 6) float32", "4 != 5"]),
    "matmul inner trans_a": (lambda: gc.matmul(P("a", (3, 4)), P("b", (4, 6)), trans_a=True),
                             ["matmul", "a (3, 4) float32.T @ b (4, 6) float32", "3 != 4"]),
    "matmul inner trans_b": (lambda: gc.matmul(P("a", (3, 4)), P("b", (4, 6)), trans_b=True),
                             ["matmul", "a (3, 4) float32 @ b (4, 6) float32.T", "4 != 6"]),
    "matmul inner trans_a trans_b": (
        lambda: gc.matmul(P("a", (3, 4)), P("b", (4, 6)), trans_a=True, trans_b=True),
        ["matmul", "a (3, 4) float32.T @ b (4, 6) float32.T", "3 != 6"]),
    "matmul 1-D": (lambda: P("v", (3,)) @ P("b", (3, 4)), ["matmul", "2-D", "v (3,) float32", "b (3, 4) float32"]),
    "matmul 4-D": (lambda: P("a", (2, 2, 3, 4)) @ P("w", (4, 5)),
                   ["matmul", "2-D (or 3-D stacks)", "a (2, 2, 3, 4) float32", "w (4, 5) float32"]),
    "matmul stacks": (lambda: P("a", (2, 3, 4)) @ P("s", (3, 4, 5)),
                      ["matmul", "stacks of different sizes", "a (2, 3, 4) float32", "s (3, 4, 5) float32"]),
    "matmul int": (lambda: P("a", (3, 3), dtype="int32") @ P("b", (3, 3), dtype="int32"),
                   ["matmul", "float", "a (3, 3) int32"]),
    "add broadcast": (lambda: P("a", (3, 4)) + P("b", (3,)),
                      ["add", "a (3, 4) float32", "b (3,) float32", "axis -1", "[3, 4]"]),
    "mul broadcast": (lambda: P("a", (2, 3)) * P("b", (3, 2)), ["mul", "a (2, 3) float32", "b (3, 2) float32"]),
    "maximum broadcast": (lambda: gc.maximum(P("a", (2, 3, 4)), P("b", (5, 1))),
                          ["maximum", "a (2, 3, 4) float32", "b (5, 1) float32", "axis -2", "[3, 5]"]),
    "sub broadcast with scalar on the left": (lambda: 1.0 - P("a", (2, 3)) * P("b", (2,)),
                                              ["mul", "a (2, 3) float32", "b (2,) float32"]),
    "reshape size": (lambda: gc.reshape(P("a", (3, 4)), (5, 2)),
                     ["reshape", "a (3, 4) float32", "12 elements", "(5, 2)", "10 elements"]),
    "reshape -1 does not divide": (lambda: gc.reshape(P("a", (3, 4)), (5, -1)),
                                   ["reshape", "-1", "(5, -1)", "a (3, 4) float32"]),
    "reshape two -1": (lambda: gc.reshape(P("a", (3, 4)), (-1, -1)), ["reshape", "(-1, -1)", "a (3, 4) float32"]),
    "reshape negative": (lambda: gc.reshape(P("a", (3, 4)), (-2, -6)), ["reshape", "(-2, -6)", "a (3, 4) float32"]),
    "transpose repeated": (lambda: gc.transpose(P("a", (2, 3, 4)), (0, 1, 1)),
                           ["transpose", "(0, 1, 1)", "a (2, 3, 4) float32"]),
    "transpose too short": (lambda: gc.transpose(P("a", (2, 3, 4)), (1, 0)),
                            ["transpose", "(1, 0)", "a (2, 3, 4) float32"]),
    "broadcast_to": (lambda: gc.broadcast_to(P("a", (3, 2)), (3, 4)), ["broadcast_to", "a (3, 2) float32", "(3, 4)"]),
    "broadcast_to fewer dims": (lambda: gc.broadcast_to(P("a", (3, 2)), (2,)),
                                ["broadcast_to", "a (3, 2) float32", "(2,)"]),
    "reduce axis": (lambda: gc.reduce_sum(P("a", (3, 2)), axis=2), ["reduce_sum", "axis 2", "a (3, 2) float32"]),
    "reduce negative axis": (lambda: gc.reduce_mean(P("a", (3, 2)), axis=(0, -3)),
                             ["reduce_mean", "axis -3", "a (3, 2) float32"]),
    "reduce repeated axis": (lambda: gc.reduce_max(P("a", (3, 2)), axis=(0, -2)),
                             ["reduce_max", "repeated", "(0, -2)", "a (3, 2) float32"]),
    "softmax axis": (lambda: gc.softmax(P("a", (3, 2)), axis=2), ["softmax", "axis 2", "a (3, 2) float32"]),
    "log_softmax axis": (lambda: gc.log_softmax(P("a", (3, 2)), axis=-3),
                         ["log_softmax", "axis -3", "a (3, 2) float32"]),
    "softmax int": (lambda: gc.softmax(P("a", (3, 2), dtype="int32")), ["softmax", "float", "a (3, 2) int32"]),
    "cross entropy label count": (
        lambda: gc.softmax_cross_entropy(P("logits", (4, 3)), P("labels", (5,), dtype="int32")),
        ["softmax_cross_entropy", "labels (5,) int32", "logits (4, 3) float32", "(4,)"]),
    "cross entropy label rank": (
        lambda: gc.softmax_cross_entropy(P("logits", (4, 3)), P("labels", (4, 1), dtype="uint8")),
        ["softmax_cross_entropy", "labels (4, 1) uint8", "logits (4, 3) float32"]),
    "cross entropy 1-D logits": (
        lambda: gc.softmax_cross_entropy(P("logits", (3,)), P("labels", (), dtype="int32")),
        ["softmax_cross_entropy", "logits (3,) float32"]),
    "cross entropy one-hot labels of the wrong shape": (
        lambda: gc.softmax_cross_entropy(P("logits", (4, 3)), P("labels", (4, 2))),
        ["softmax_cross_entropy", "labels (4, 2) float32", "logits (4, 3) float32"]),
    "cross entropy class indices as floats": (
        lambda: gc.softmax_cross_entropy(P("logits", (4, 3)), P("labels", (4,))),
        ["softmax_cross_entropy", "labels (4,) float32", "logits (4, 3) float32"]),
    "cross entropy one-hot labels with 1-D logits": (
        lambda: gc.softmax_cross_entropy(P("logits", (3,)), P("labels", (3,))),
        ["softmax_cross_entropy", "labels (3,) float32", "logits (3,) float32"]),
    "cross entropy one-hot labels of another dtype": (
        lambda: gc.softmax_cross_entropy(P("logits", (4, 3)), P("labels", (4, 3), dtype="float64")),
        ["softmax_cross_entropy", "labels (4, 3) float64", "logits (4, 3) float32"]),
    "dtype mismatch": (lambda: P("a", (3,)) + P("b", (3,), dtype="float64"),
                       ["add", "different dtypes", "a (3,) float32", "b (3,) float64"]),
    "dtype mismatch matmul": (lambda: P("a", (3, 3)) @ P("b", (3, 3), dtype="float64"),
                              ["matmul", "different dtypes", "a (3, 3) float32", "b (3, 3) float64"]),
    "exp of int32": (lambda: gc.exp(P("i", (3,), dtype="int32")), ["exp", "float", "i (3,) int32"]),
    "log of uint8": (lambda: gc.log(P("u", (3,), dtype="uint8")), ["log", "float", "u (3,) uint8"]),
    "one_hot of float": (lambda: gc.one_hot(P("f", (3,)), 4), ["one_hot", "integers", "f (3,) float32"]),
    "assign to a placeholder": (lambda: gc.assign(P("a", (3,)), P("b", (3,))),
                                ["assign", "a (3,) float32", "placeholder", "not a variable"]),
    "assign to a computed node": (lambda: gc.assign(gc.variable("v", (3,)) * 2, P("b", (3,))),
                                  ["assign", "mul_", "(3,) float32", "mul", "not a variable"]),
    "assign shape": (lambda: gc.assign(gc.variable("v", (3,)), P("b", (4,))),
                     ["assign", "b (4,) float32", "v (3,) float32"]),
    "assign dtype": (lambda: gc.assign(gc.variable("v", (3,)), P("b", (3,), dtype="float64")),
                     ["assign", "b (3,) float64", "v (3,) float32"]),
    "variable init shape": (lambda: gc.variable("W", (3, 4), init=np.zeros((4, 3))),
                            ["variable 'W'", "(3, 4)", "(4, 3)"]),
    "variable without shape": (lambda: gc.variable("W"), ["variable 'W'", "shape"]),
    "pow with a node exponent": (lambda: P("a", (3,)) ** P("b", (3,)), ["pow", "exponent", "b (3,) float32"]),
    "gc.pow with a node exponent": (lambda: gc.pow(P("a", (3,)), P("b", (3,))),
                                    ["pow", "exponent", "b (3,) float32"]),
    "pow of int32": (lambda: P("i", (3,), dtype="int32") ** 2, ["pow", "float", "i (3,) int32"]),
    "unsupported dtype": (lambda: P("a", (3,), dtype="int64"), ["unsupported dtype 'int64'", "float32"]),
    "no node operand": (lambda: gc.add(1.0, 2.0), ["add", "graph node"]),
    "negative dimension": (lambda: P("x", (-3, 4)), ["placeholder 'x'", "(-3, 4)", "dimension of -3", "at least 1"]),
    "zero dimension": (lambda: gc.variable("W", (4, 0)), ["variable 'W'", "(4, 0)", "dimension of 0"]),
    "empty initial value": (lambda: gc.variable("W", init=np.zeros((0, 3), np.float32)),
                            ["variable 'W'", "(0, 3)", "dimension of 0"]),
    "fractional dimension": (lambda: P("x", (2.5, 3)), ["placeholder 'x'", "(2.5, 3)", "2.5, not a whole number"]),
    "bool dimension": (lambda: P("x", (True, 3)), ["placeholder 'x'", "True, not a whole number"]),
    "shape not a sequence": (lambda: P("x", 5), ["placeholder 'x'", "sequence of whole numbers, not 5"]),
    # these built nodes of negative or empty shapes, or took one axis of several
    "broadcast_to a negative size": (lambda: gc.broadcast_to(P("a", (1, 3)), (-2, 3)),
                                     ["broadcast_to", "(-2, 3)", "dimension of -2", "at least 1"]),
    "broadcast_to an empty size": (lambda: gc.broadcast_to(P("a", (1, 3)), (0, 3)),
                                   ["broadcast_to", "(0, 3)", "dimension of 0"]),
    "one_hot depth 0": (lambda: gc.one_hot(P("y", (2,), dtype="int32"), 0), ["one_hot", "depth", "at least 1", "0"]),
    "one_hot depth -3": (lambda: gc.one_hot(P("y", (2,), dtype="int32"), -3), ["one_hot", "depth", "-3"]),
    "softmax over several axes": (lambda: gc.softmax(P("a", (2, 3)), axis=(1, 0)),
                                  ["softmax", "one whole number", "(1, 0)", "a (2, 3) float32"]),
    "log_softmax over no axis": (lambda: gc.log_softmax(P("a", (2, 3)), axis=()),
                                 ["log_softmax", "one whole number", "()", "a (2, 3) float32"]),
    "softmax axis 1.0": (lambda: gc.softmax(P("a", (2, 3)), axis=1.0), ["softmax", "1.0", "a (2, 3) float32"]),
    "reduce_sum axis 1.0": (lambda: gc.reduce_sum(P("a", (2, 3)), axis=1.0),
                            ["reduce_sum", "axis 1.0 is not a whole number", "a (2, 3) float32"]),
    "conv2d of int32": (lambda: gc.conv2d(P("img", (1, 2, 4, 4), dtype="int32"), P("w", (3, 2, 3, 3), dtype="int32")),
                        ["conv2d", "float", "img (1, 2, 4, 4) int32", "w (3, 2, 3, 3) int32"]),
    "pool stride 1.5": (lambda: gc.max_pool2d(P("x", (1, 1, 6, 9)), 2, stride=1.5),
                        ["max_pool2d", "stride must be a whole number", "1.5"]),
    "pool padding 0.9": (lambda: gc.avg_pool2d(P("x", (1, 1, 6, 9)), 3, 2, padding=0.9),
                         ["avg_pool2d", "padding must be a whole number", "0.9"]),
    "im2col kernel 2.7": (lambda: gc.im2col(P("x", (1, 1, 6, 9)), 2.7), ["im2col", "kernel", "2.7"]),
    "pool kernel of three": (lambda: gc.max_pool2d(P("x", (1, 1, 6, 9)), (2, 2, 2)), ["max_pool2d", "kernel",
                                                                                       "(2, 2, 2)"]),
    "conv2d stride 1.5": (lambda: gc.conv2d(P("x", (1, 1, 6, 9)), P("w", (1, 1, 3, 3)), None, stride=1.5),
                          ["conv2d", "stride must be a whole number", "1.5"]),
    "reshape to 3.9": (lambda: gc.reshape(P("x", (3, 4)), (3.9, 4)), ["reshape", "(3.9, 4)", "3.9, not a whole"]),
    "transpose perm 1.0": (lambda: gc.transpose(P("x", (3, 4)), (1.0, 0)), ["transpose", "perm", "1.0, not a whole"]),
    "col2im image 4.7": (lambda: gc.col2im(P("c", (1, 4, 9)), (4.7, 4), 2), ["col2im", "image_size", "4.7"]),
    "batch_norm of a 1-D x": (lambda: gc.batch_norm(P("v", (4,)), *(gc.variable(n, (4,)) for n in "gbmr")),
                              ["batch_norm", "v (4,) float32", "batch axis and a channel axis"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shape_error(case):
    build, fragments = CASES[case]
    with pytest.raises(gc.ShapeError, match=message(*fragments)):
        build()


def test_shape_error_is_a_gcompile_error():
    assert issubclass(gc.ShapeError, gc.GCompileError)


def test_error_names_the_node_built_deep_in_a_graph():
    x = P("x", (8, 4))
    W1 = gc.variable("W1", (4, 16))
    W2 = gc.variable("W2", (10, 3))
    h = gc.relu(x @ W1)
    with pytest.raises(gc.ShapeError, match=message("matmul", "relu_", "(8, 16) float32", "W2 (10, 3) float32",
                                                    "16 != 10")):
        h @ W2
