"""Golden tests of the convolutional ops and networks: compiled programs (cpu target here, cuda on a GPU
machine) against the numpy reference, within design.md's rtol 1e-4, atol 1e-5 (fp32).

- every window op, batch norm and dropout, with the gradients of each, in one program per target;
- LeNet (batch norm, dropout, SGD with momentum and weight decay, cosine schedule), a ResNet of one block
  per stage (batch norm, dropout, step schedule) and a tiny conv net trained with Adam, after 3 training
  steps: the losses, every variable (parameters, optimizer state, running statistics, the step counter)
  and the eval-mode logits.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import gcompile as gc
from conftest import load_example

from golden import TARGETS, assert_compiled_matches_numpy, assert_training_matches_numpy, graph_of_cases


def conv_cases():
    """(name, build(placeholders) -> node, inputs): every op conv nets add, in the shapes they take."""
    r = np.random.RandomState(0)
    image = r.uniform(-1, 1, (2, 3, 7, 6))
    distinct = (r.permutation(2 * 3 * 7 * 6) * 0.01 - 1.2).reshape(2, 3, 7, 6)
    ties = np.round(image * 2) / 2      # many equal values: max-pool ties must match numpy exactly
    w = r.uniform(-1, 1, (4, 3, 3, 3))
    gamma, beta = r.uniform(0.5, 1.5, (3,)), r.uniform(-1, 1, (3,))
    rm = gc.variable("bn_rm", init=np.zeros(3, np.float32), trainable=False)
    rv = gc.variable("bn_rv", init=np.ones(3, np.float32), trainable=False)
    return [
        ("conv", lambda x, k: gc.conv2d(x, k, stride=1, padding=1), [image, w]),
        ("conv_s2_bias", lambda x, k, b: gc.conv2d(x, k, b, stride=2, padding=1), [image, w, beta[:1].repeat(4)]),
        ("conv_1x1_s2", lambda x, k: gc.conv2d(x, k, stride=2), [image, w[:, :, :1, :1]]),
        ("im2col", lambda x: gc.im2col(x, (2, 3), 2, 1), [image]),
        ("max_pool", lambda x: gc.max_pool2d(x, 2), [distinct]),
        ("max_pool_pad", lambda x: gc.max_pool2d(x, 3, 2, 1), [distinct]),
        ("max_pool_ties", lambda x: gc.max_pool2d(x, 3, 1, 1), [ties]),
        ("avg_pool", lambda x: gc.avg_pool2d(x, 3, 2, 1), [image]),
        ("global_avg_pool", gc.global_avg_pool, [image]),
        ("batch_norm", lambda x, g, b: gc.batch_norm(x, g, b, rm, rv), [image * 2 + 1, gamma, beta]),
        ("dropout", lambda x: gc.dropout(x, 0.3, seed=5), [image]),
        ("batched_matmul", lambda a, b: gc.matmul(a, b, trans_b=True), [w[0, 0], r.uniform(-1, 1, (5, 7, 3))]),
    ]


def build_all():
    return graph_of_cases(conv_cases())


@pytest.mark.parametrize("target", TARGETS)
def test_conv_ops_and_gradients_match_numpy(target, tmp_path, monkeypatch):
    monkeypatch.setenv("GCOMPILE_CACHE", str(tmp_path))
    assert_compiled_matches_numpy(*build_all(), target)


@pytest.mark.parametrize("target", TARGETS)
def test_second_derivatives_through_max_pooling(target, tmp_path, monkeypatch):
    """max_pool2d_grad's gradient (max_pool2d_select, gc_pool_select_at) and its gradient again, compiled."""
    monkeypatch.setenv("GCOMPILE_CACHE", str(tmp_path))
    r = np.random.RandomState(2)
    x = (r.permutation(2 * 3 * 7 * 6) * 0.01 - 1.2).reshape(2, 3, 7, 6)
    X, H = gc.placeholder("x", x.shape), gc.placeholder("h", x.shape)
    G, V = gc.placeholder("g", (2, 3, 4, 3)), gc.placeholder("v", (2, 3, 4, 3))
    (dx,) = gc.gradients(gc.reduce_sum(gc.max_pool2d(X, 3, 2, 1) * G), [X])
    (dg,) = gc.gradients(gc.reduce_sum(dx * H), [G])            # max_pool2d_select(x, h)
    (dh,) = gc.gradients(gc.reduce_sum(dg * V), [H])            # max_pool2d_grad(x, v) again
    feeds = {X: x.astype(np.float32), H: r.uniform(-1, 1, x.shape).astype(np.float32),
             G: r.uniform(-1, 1, G.shape).astype(np.float32), V: r.uniform(-1, 1, V.shape).astype(np.float32)}
    assert_compiled_matches_numpy([dx, dg, dh], feeds, target)


def tiny_convnet_adam():
    """conv -> ReLU -> average pool -> dense, trained with Adam (L2 weight decay) on a cosine schedule. eps is
    large here: Adam divides by |g| + eps, so a gradient that cancels to ~1e-8 would turn its rounding into
    a visible difference of updates; eps bounds that sensitivity by 1 / eps."""
    L = gc.layers.Layers(seed=4)
    x = gc.placeholder("x", (8, 784))
    y = gc.placeholder("y", (8,), dtype="int32")
    h = gc.avg_pool2d(gc.relu(L.conv2d("conv", gc.reshape(x, (8, 1, 28, 28)), 4, 3, stride=2)), 3, 2, 1)
    logits = L.dense("fc", gc.flatten(h), 10)
    optimizer = gc.Adam(1e-2, eps=1e-3, weight_decay=1e-3, schedule=gc.CosineSchedule(total_steps=4))
    return gc.Program(gc.softmax_cross_entropy(logits, y), L.params, optimizer, {"logits": logits}, name="tiny")


def tiny_convnet_float64():
    """The Layers of a float64 model (Layers(dtype=...)): conv -> batch norm -> ReLU -> max pool -> dense,
    SGD with momentum on a cosine schedule."""
    L = gc.layers.Layers(seed=5, dtype="float64")
    x = gc.placeholder("x", (8, 784), dtype="float64")
    y = gc.placeholder("y", (8,), dtype="int32")
    h = gc.relu(L.batch_norm("bn", L.conv2d("conv", gc.reshape(x, (8, 1, 28, 28)), 4, 3, bias=False)))
    logits = L.dense("fc", gc.flatten(gc.max_pool2d(h, 2)), 10)
    assert {p.dtype for p in L.params} == {"float64"}
    optimizer = gc.SGD(0.05, momentum=0.9, schedule=gc.CosineSchedule(total_steps=4))
    return gc.Program(gc.softmax_cross_entropy(logits, y), L.params, optimizer,
                      {"logits": logits}, name="tiny64")


NETWORKS = {  # example file and program() options (small enough for the numpy reference in CI), or a builder
    "lenet": ("mnist_lenet", dict(batch_size=8, batch_norm=True, dropout=0.3, optimizer="sgd", lr=0.05,
                                  schedule="cosine", weight_decay=1e-3)),
    "resnet_1block": ("resnet14", dict(batch_size=8, widths=(4, 8), blocks=(1, 1), dropout=0.2, optimizer="sgd",
                                       schedule="step", lr=0.05)),
    "tiny_adam": (tiny_convnet_adam, {}),
    "tiny_float64": (tiny_convnet_float64, {}),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_training_steps_match_numpy(network, target, tmp_path):
    make, options = NETWORKS[network]
    program = load_example(make).program(**options) if isinstance(make, str) else make()
    model = gc.load(gc.compile(program, target=target, out_dir=tmp_path))
    reference = gc.NumpyExecutor(program.train_outputs)
    model.set("total_steps", 4)  # a 4-step schedule: 3 steps cross the step schedule's milestones
    reference.set_variable("total_steps", 4)
    r = np.random.RandomState(3)
    batches = [(r.randint(0, 256, (8, 784)).astype(np.float32) / 256, r.randint(0, 10, 8).astype(np.int32))
               for _ in range(3)]
    assert_training_matches_numpy(program, model, reference, batches)
    assert model.get("step") == 3


def test_cuda_target_compiles_with_nvcc(tmp_path):
    """Compile-only check of the conv kernels on the cuda target (CI has nvcc but no GPU)."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    outputs, _ = build_all()
    artifact = gc.compile(outputs, target="cuda", out_dir=tmp_path, name="conv_ops")
    text = open(artifact.source).read()
    assert "gc_im2col_at<float>" in text and "gc_pool_grad_at<float, true>" in text
    assert open(artifact.binary, "rb").read(4) == b"\x7fELF"
