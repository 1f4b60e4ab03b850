"""The PyTorch twins of the example programs, written as a PyTorch user would (nn.Linear, nn.Conv2d with
cuDNN, nn.BatchNorm2d), and checked against the gcompile program: the multiset of parameter shapes must be
equal (dense weights compared as unordered pairs: gcompile stores (in, out), PyTorch (out, in)).

Dense models copy the program's initial values, so every implementation starts from the same point. The
convolutional twins keep PyTorch's own initialisation: only their step time is compared.
"""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import torch
from torch import nn

from gcompile.graph import topological_order

from .tasks import Task, ops_of


def shape_key(shape) -> tuple:
    shape = tuple(int(d) for d in shape)
    return tuple(sorted(shape)) if len(shape) == 2 else shape


def same_parameters(module: nn.Module, init: dict) -> bool:
    shapes = Counter(shape_key(v.shape) for v in init.values())
    return Counter(shape_key(p.shape) for p in module.parameters()) == shapes


def dense_net(init: dict) -> nn.Sequential:
    """W1, b1, W2, b2, ... (W as (in, out)) -> Linear layers with ReLU between them, holding those values."""
    layers = []
    for i in itertools.count(1):
        if f"W{i}" not in init:
            break
        W, b = init[f"W{i}"], init[f"b{i}"]
        linear = nn.Linear(*W.shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(W.T)))
            linear.bias.copy_(torch.from_numpy(b))
        layers += [linear, nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class LeNet(nn.Module):
    """LeNet-5 style: two (conv, activation, 2x2 pool) stages, then dense layers with the activation between."""

    def __init__(self, convs, dense, paddings, act, pool, bn: bool, image: int):
        super().__init__()
        layers, size = [], image
        for (o, i, k, _), p in zip(convs, paddings):
            layers += [nn.Conv2d(i, o, k, padding=p, bias=not bn)] + ([nn.BatchNorm2d(o)] if bn else [])
            layers += [act(), pool(2)]
            size = (size + 2 * p - k + 1) // 2
        layers.append(nn.Flatten())
        for j, (fan_in, fan_out) in enumerate(dense):
            layers.append(nn.Linear(fan_in, fan_out))
            if j < len(dense) - 1:
                layers.append(act())
        self.net = nn.Sequential(*layers)
        self.flat = convs[-1][0] * size * size

    def forward(self, x):
        return self.net(x)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride, bn: bool, bias: bool):
        super().__init__()
        norm = (lambda c: nn.BatchNorm2d(c)) if bn else (lambda c: nn.Identity())
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=bias), norm(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=bias), norm(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=bias), norm(cout))

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet14(nn.Module):
    """3x3 conv 16, three stages of two basic blocks (16/32/64 channels; the first block of stages 2 and 3
    has stride 2 and a 1x1 stride-2 projection), global average pool, dense 10 (issue 5)."""

    def __init__(self, bn: bool, bias: bool, widths=(16, 32, 64), in_channels=1, classes=10):
        super().__init__()
        norm = nn.BatchNorm2d(widths[0]) if bn else nn.Identity()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=bias), norm, nn.ReLU())
        blocks, cin = [], widths[0]
        for stage, w in enumerate(widths):
            for b in range(2):
                blocks.append(BasicBlock(cin, w, 2 if (stage > 0 and b == 0) else 1, bn, bias))
                cin = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def conv_paddings(program) -> list:
    """Paddings of the program's convolutions in forward order (conv2d nodes, or the im2col windows a
    conv2d is lowered to)."""
    forward = topological_order(list(program.outputs.values()))
    return [n.attrs["padding"] for n in forward if n.op in ("conv2d", "im2col") and "padding" in n.attrs]


def lenet_for(task: Task, init: dict, ops: set, image: int):
    convs = [v.shape for v in init.values() if v.ndim == 4]
    dense = [v.shape for v in init.values() if v.ndim == 2]
    act = nn.Tanh if "tanh" in ops and "relu" not in ops else nn.ReLU
    pool = nn.AvgPool2d if "avg_pool2d" in ops and "max_pool2d" not in ops else nn.MaxPool2d
    # the program's own paddings first (its convolutions' window nodes, in layer order), then any that fit
    hint = [tuple(conv_paddings(task.program))] if len(conv_paddings(task.program)) == len(convs) else []
    for bn, paddings in itertools.product((False, True), hint + list(itertools.product(range(3), repeat=len(convs)))):
        model = LeNet(convs, dense, paddings, act, pool, bn, image)
        if dense and model.flat == dense[0][0] and same_parameters(model, init):
            return model, f"LeNet paddings {paddings}, {act.__name__}, {pool.__name__}, batch norm {bn}"
    return None, f"no LeNet layout matches the program's parameters {sorted(map(tuple, convs + dense))}"


def resnet_for(task: Task, init: dict, ops: set, channels: int):
    for bn, bias in ((True, False), (False, True), (True, True), (False, False)):
        model = ResNet14(bn, bias, in_channels=channels)
        if same_parameters(model, init):
            return model, f"ResNet-14, batch norm {bn}, conv bias {bias}"
    return None, "no ResNet-14 layout (batch norm, conv bias) matches the program's parameters"


def twin(task: Task):
    """(nn.Module on the host, description) for the task's program, or (None, reason). A program that
    takes flat images gets an nn.Unflatten in front, as it reshapes them itself."""
    init = task.init
    if task.model in ("mnist_logreg", "mnist_mlp"):
        return dense_net(init), "nn.Linear stack with the program's initial values"
    flat = len(task.input_shape) == 1
    image = (1, *task.data.image_shape) if flat else task.input_shape
    if task.model == "mnist_lenet":
        model, arch = lenet_for(task, init, ops_of(task.program), image[-1])
    elif task.model == "resnet14":
        model, arch = resnet_for(task, init, ops_of(task.program), image[0])
    else:
        return None, f"no PyTorch twin for {task.model}"
    if model is not None and flat:
        model = nn.Sequential(nn.Unflatten(1, image), model)
    return model, arch


def optimizer_for(task: Task, params, capturable: bool):
    """The program's optimizer, as torch.optim: SGD(lr, momentum, weight_decay) or Adam/AdamW, at the task's
    learning rate (its recipe's where it has one: a captured graph keeps the rate it was captured with)."""
    opt = task.program.optimizer
    kind = type(opt).__name__
    lr = task.lr
    if kind == "SGD":
        return torch.optim.SGD(params, lr=lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
    if kind in ("Adam", "AdamW"):
        cls = getattr(torch.optim, kind)
        betas = (float(getattr(opt, "beta1", 0.9)), float(getattr(opt, "beta2", 0.999)))
        return cls(params, lr=lr, betas=betas, eps=float(getattr(opt, "eps", 1e-8)),
                   weight_decay=float(getattr(opt, "weight_decay", 0.0)), capturable=capturable)
    raise ValueError(f"no torch.optim twin for gcompile optimizer {kind}")
