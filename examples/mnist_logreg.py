"""Logistic regression on MNIST in the reference configuration (docs/reference.md).

logits = x W1 + b1 with W1 (784, 10) and b1 (10,) starting at zero; softmax cross-entropy (batch mean);
SGD lr 1.0; batch 1000. Reference: validation accuracy 0.9223 after 10 epochs.

    python examples/mnist_logreg.py --executor numpy --epochs 10
"""
import sys

import gcompile as gc


def program(batch_size=1000, lr=1.0) -> gc.Program:
    """Logistic regression on MNIST, reference configuration."""
    x = gc.placeholder("x", (batch_size, 784))
    y = gc.placeholder("y", (batch_size,), dtype="int32")
    W1 = gc.variable("W1", (784, 10), init=gc.init.zeros())
    b1 = gc.variable("b1", (10,), init=gc.init.zeros())
    logits = x @ W1 + b1
    loss = gc.softmax_cross_entropy(logits, y)
    return gc.Program(loss, params=[W1, b1], optimizer=gc.SGD(lr=lr), outputs={"logits": logits},
                      name="mnist_logreg")


if __name__ == "__main__":
    from gcompile.train_numpy import example_main

    sys.exit(example_main(program))
