"""A LeNet-5-style convolutional network on MNIST.

conv 5x5 (pad 2) -> [batch norm] -> ReLU -> max-pool 2 -> conv 5x5 -> [batch norm] -> ReLU -> max-pool 2
-> dense 120 -> ReLU -> [dropout] -> dense 84 -> ReLU -> [dropout] -> dense 10; softmax cross-entropy.
Images come in as rows of 784 values (the datasets' layout) and are viewed as (batch, 1, 28, 28).
Options (program() arguments; `gcompile build/run --batch-size N --set name=value`): channels of the two
convolutions, batch_norm, dropout (rate), optimizer (sgd with momentum 0.9, adam, adamw), lr (default 0.05
for sgd, 1e-3 for adam), schedule (constant, cosine, step; the binary sets the schedule's length from
--epochs), weight_decay, seed.

    gcompile run examples/mnist_lenet.py --batch-size 128 -- train --data DIR --epochs 15
    python examples/mnist_lenet.py --executor numpy --epochs 1
"""
import sys

import gcompile as gc

DEFAULT_LR = {"sgd": 0.05, "adam": 1e-3, "adamw": 1e-3}


def program(batch_size=128, channels=(6, 16), batch_norm=False, dropout=0.0, optimizer="adam", lr=None,
            schedule="cosine", weight_decay=0.0, seed=0) -> gc.Program:
    """LeNet-5-style convolutional network on MNIST."""
    L = gc.layers.Layers(seed)
    x = gc.placeholder("x", (batch_size, 784))
    y = gc.placeholder("y", (batch_size,), dtype="int32")
    h = gc.reshape(x, (batch_size, 1, 28, 28))
    for i, (c, padding) in enumerate(zip(channels, (2, 0)), start=1):
        h = L.conv2d(f"conv{i}", h, c, 5, padding=padding, bias=not batch_norm)
        if batch_norm:
            h = L.batch_norm(f"bn{i}", h)
        h = gc.max_pool2d(gc.relu(h), 2)                 # 28 -> 14, then 10 -> 5
    h = gc.flatten(h)
    for i, units in enumerate((120, 84), start=1):
        h = gc.relu(L.dense(f"fc{i}", h, units))
        h = gc.dropout(h, dropout, seed=seed * 100 + i) if dropout else h
    logits = L.dense("fc3", h, 10, weight_init=gc.init.xavier_uniform(seed * 100 + 3))
    loss = gc.softmax_cross_entropy(logits, y)
    extra = {"momentum": 0.9} if optimizer == "sgd" else {}
    opt = gc.optim.make_optimizer(optimizer, DEFAULT_LR.get(optimizer) if lr is None else lr, schedule, weight_decay=weight_decay,
                                  **extra)
    return gc.Program(loss, L.params, opt, outputs={"logits": logits}, name="mnist_lenet")


if __name__ == "__main__":
    from gcompile.train_numpy import example_main

    sys.exit(example_main(program))
