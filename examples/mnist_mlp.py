"""A 784-256-100-10 ReLU MLP on MNIST in the reference configuration (docs/reference.md).

Weights come from ONE np.random.RandomState(123).normal(scale=0.1) stream, drawn in the order W1, W2, W3,
b1, b2, b3 (biases too); softmax cross-entropy (batch mean); SGD lr 1.0; batch 1000.
Reference: validation accuracy 0.9717 after 10 epochs.

    python examples/mnist_mlp.py --executor numpy --epochs 10
"""
import sys

import numpy as np

import gcompile as gc


def program(batch_size=1000, lr=1.0) -> gc.Program:
    """784-256-100-10 ReLU MLP on MNIST, reference configuration."""
    rng = np.random.RandomState(123)
    shapes = {"W1": (784, 256), "W2": (256, 100), "W3": (100, 10), "b1": (256,), "b2": (100,), "b3": (10,)}
    p = {name: gc.variable(name, init=rng.normal(scale=0.1, size=shape).astype(np.float32))
         for name, shape in shapes.items()}  # dicts keep insertion order: the draws happen in this order
    x = gc.placeholder("x", (batch_size, 784))
    y = gc.placeholder("y", (batch_size,), dtype="int32")
    h1 = gc.relu(x @ p["W1"] + p["b1"])
    h2 = gc.relu(h1 @ p["W2"] + p["b2"])
    logits = h2 @ p["W3"] + p["b3"]
    loss = gc.softmax_cross_entropy(logits, y)
    return gc.Program(loss, params=list(p.values()), optimizer=gc.SGD(lr=lr), outputs={"logits": logits},
                      name="mnist_mlp")


if __name__ == "__main__":
    from gcompile.train_numpy import example_main

    sys.exit(example_main(program))
