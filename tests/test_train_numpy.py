"""gcompile.train_numpy: batch order, parameter sharing with the evaluation graph, chunked evaluation."""
import numpy as np
import pytest

import gcompile as gc
from gcompile import GCompileError
from gcompile.train_numpy import evaluate, example_main, train


def linear_program(batch, weights=None):
    x = gc.placeholder("x", (batch, 3))
    y = gc.placeholder("y", (batch,), dtype="int32")
    W = gc.variable("W", init=np.zeros((3, 2), np.float32) if weights is None else weights)
    logits = x @ W
    return gc.Program(gc.softmax_cross_entropy(logits, y), [W], gc.SGD(lr=0.5), outputs={"logits": logits})


def test_train_matches_hand_written_sgd():
    rng = np.random.RandomState(0)
    images = rng.randint(0, 256, (10, 3)).astype(np.uint8)  # 10 rows, batch 4: the last 2 are never used
    labels = rng.randint(0, 2, 10).astype(np.uint8)
    dataset = {"train": (images, labels), "valid": (images, labels)}
    result = train(linear_program(4), dataset, scale=1 / 256, epochs=3, log=lambda _: None)

    W = np.zeros((3, 2))
    for _ in range(3):
        for rows in (slice(0, 4), slice(4, 8)):
            x, y = images[rows] / 256, labels[rows]
            p = np.exp(x @ W) / np.exp(x @ W).sum(1, keepdims=True)
            loss = -np.log(p[np.arange(4), y]).mean()
            p[np.arange(4), y] -= 1
            W -= 0.5 * x.T @ p / 4
    assert result.losses[-1] == pytest.approx(loss, rel=1e-5)
    assert result.accuracy == np.mean(np.argmax(images / 256 @ W, axis=1) == labels)


def test_evaluate_pads_the_last_chunk_and_uses_trained_values():
    rng = np.random.RandomState(1)
    weights = rng.normal(size=(3, 2)).astype(np.float32)
    program = linear_program(4)
    trained = gc.NumpyExecutor(program.train_outputs)
    trained.set_variable("W", weights)
    images = rng.randint(0, 256, (7, 3)).astype(np.uint8)
    labels = rng.randint(0, 2, 7).astype(np.uint8)
    want = np.mean(np.argmax(images / 256 @ weights, axis=1) == labels)
    assert evaluate(program, trained, images, labels, 1 / 256) == want


def test_inputs_must_be_named_x_and_y():
    a = gc.placeholder("a", (2, 3))
    y = gc.placeholder("y", (2,), dtype="int32")
    W = gc.variable("W", (3, 2))
    program = gc.Program(gc.softmax_cross_entropy(a @ W, y), [W], gc.SGD(lr=0.1), outputs={"logits": a @ W})
    with pytest.raises(GCompileError, match=r"feeds placeholders 'x' \(images\) and 'y' \(labels\); the program "
                                            r"has \['a', 'y'\]"):
        train(program, {}, 1.0, 1)


def test_evaluation_needs_logits():
    x = gc.placeholder("x", (2, 3))
    y = gc.placeholder("y", (2,), dtype="int32")
    W = gc.variable("W", (3, 2))
    program = gc.Program(gc.softmax_cross_entropy(x @ W, y), [W], gc.SGD(lr=0.1), outputs={"scores": x @ W})
    with pytest.raises(GCompileError, match=r"needs an output named 'logits'; the program has \['scores'\]"):
        evaluate(program, gc.NumpyExecutor(program.train_outputs), np.zeros((2, 3), np.uint8), np.zeros(2), 1.0)


def test_a_schedule_spans_the_run():
    """total_steps is the run's steps, as the compiled trainer sets it (it stayed 1: a cosine schedule's rate
    was 0 from the second step on, and training stopped)."""
    rng = np.random.RandomState(3)
    images, labels = rng.randint(0, 256, (8, 3)).astype(np.uint8), rng.randint(0, 2, 8).astype(np.uint8)
    x, y = gc.placeholder("x", (4, 3)), gc.placeholder("y", (4,), dtype="int32")
    W = gc.variable("W", init=np.zeros((3, 2), np.float32))
    logits = x @ W
    program = gc.Program(gc.softmax_cross_entropy(logits, y), [W], gc.SGD(lr=0.5, schedule="cosine"),
                         outputs={"logits": logits})
    result = train(program, {"train": (images, labels), "valid": (images, labels)}, 1 / 256, epochs=3,
                   log=lambda _: None)
    assert len(set(result.losses)) == 3   # still learning in every epoch


def test_fewer_examples_than_one_batch():
    images, labels = np.zeros((3, 3), np.uint8), np.zeros(3, np.uint8)
    with pytest.raises(GCompileError, match="3 training examples, fewer than one batch of 4"):
        train(linear_program(4), {"train": (images, labels), "valid": (images, labels)}, 1 / 256, 1)


def test_example_command_line_errors(tmp_path, capsys):
    from conftest import load_example
    from gcompile.data import write_dataset
    program = load_example("mnist_mlp").program
    write_dataset(tmp_path, "toy", {s: (np.zeros((5, 784), np.uint8), np.zeros(5, np.uint8))
                                    for s in ("train", "valid", "test")}, (28, 28), 10, {})
    assert example_main(program, ["--data", str(tmp_path), "--set", "bogus=1"]) == 1
    assert "program() takes no bogus, so --set bogus=... cannot be used" in capsys.readouterr().err
    assert example_main(program, ["--data", str(tmp_path)]) == 1
    assert "error: 5 training examples, fewer than one batch of 1000" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        example_main(program, ["--epochs", "0"])
    assert "--epochs must be at least 1" in capsys.readouterr().err
