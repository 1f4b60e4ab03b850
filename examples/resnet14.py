"""ResNet-14 for 28x28 grey images (Fashion-MNIST, MNIST).

3x3 conv 16 -> three stages of two basic residual blocks (16, 32, 64 channels); the first block of stages
2 and 3 halves the image with a stride-2 first conv and a 1x1 stride-2 projection on the identity path;
global average pool -> dense 10. A basic block: conv 3x3 -> [BN] -> ReLU -> conv 3x3 -> [BN], plus the
identity (or projection), -> ReLU. 13 3x3 convolutions + 1 dense layer = 14 weighted layers (the two 1x1
projections are not counted, as in the ResNet papers).
Options (program() arguments; `gcompile build/run --batch-size N --set name=value`): batch_norm (default on;
without it the convolutions get biases and each block's last conv starts at zero, so blocks start as
identities), dropout (rate, before the dense layer), optimizer (sgd with momentum 0.9, adam, adamw), lr
(default 0.1 for sgd, 1e-3 for adam), schedule (constant, cosine, step), weight_decay, widths and blocks
(per stage), seed.

    gcompile run examples/resnet14.py --batch-size 128 -- train --data DIR --epochs 15
"""
import sys

import gcompile as gc

DEFAULT_LR = {"sgd": 0.1, "adam": 1e-3, "adamw": 1e-3}


def program(batch_size=128, batch_norm=True, dropout=0.0, optimizer="sgd", lr=None, schedule="cosine",
            weight_decay=5e-4, widths=(16, 32, 64), blocks=(2, 2, 2), seed=0) -> gc.Program:
    """ResNet-14 (three stages of two basic blocks) for 28x28 images."""
    L = gc.layers.Layers(seed)
    x = gc.placeholder("x", (batch_size, 784))
    y = gc.placeholder("y", (batch_size,), dtype="int32")

    def conv_norm(name, h, channels, kernel, stride, last_in_block=False):
        padding = kernel // 2
        if batch_norm:
            return L.batch_norm(f"{name}.bn", L.conv2d(name, h, channels, kernel, stride, padding, bias=False))
        zero = gc.init.zeros() if last_in_block else None   # without BN a block starts as the identity
        return L.conv2d(name, h, channels, kernel, stride, padding, weight_init=zero)

    h = gc.relu(conv_norm("stem", gc.reshape(x, (batch_size, 1, 28, 28)), widths[0], 3, 1))
    for stage, (channels, count) in enumerate(zip(widths, blocks), start=1):
        for block in range(1, count + 1):
            name = f"s{stage}b{block}"
            stride = 2 if stage > 1 and block == 1 else 1
            branch = gc.relu(conv_norm(f"{name}.conv1", h, channels, 3, stride))
            branch = conv_norm(f"{name}.conv2", branch, channels, 3, 1, last_in_block=True)
            shortcut = h if stride == 1 and h.shape[1] == channels else conv_norm(f"{name}.proj", h, channels, 1,
                                                                                  stride)
            h = gc.relu(branch + shortcut)
    h = gc.global_avg_pool(h)
    h = gc.dropout(h, dropout, seed=seed * 100 + 1) if dropout else h
    logits = L.dense("fc", h, 10, weight_init=gc.init.xavier_uniform(seed * 100 + 2))
    loss = gc.softmax_cross_entropy(logits, y)
    extra = {"momentum": 0.9} if optimizer == "sgd" else {}
    opt = gc.optim.make_optimizer(optimizer, DEFAULT_LR.get(optimizer) if lr is None else lr, schedule, weight_decay=weight_decay,
                                  **extra)
    return gc.Program(loss, L.params, opt, outputs={"logits": logits}, name="resnet14")


if __name__ == "__main__":
    from gcompile.train_numpy import example_main

    sys.exit(example_main(program, dataset="fashion-mnist"))
