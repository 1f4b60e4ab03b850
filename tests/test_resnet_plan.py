"""The memory plan of ResNet-14 (batch norm, SGD with momentum): one arena for the train and eval graphs,
the im2col patches among the temporaries, the arena against the lower bound (peak of live bytes) and the
naive sum, and `gcompile inspect` printing the plan."""
import pytest

from conftest import EXAMPLES, load_example
from gcompile import GCompileError
from gcompile.cli import main
from gcompile.passes import check_plan, plan_memory, schedule, simplify
from gcompile.passes.plan_memory import storage_root


@pytest.fixture(scope="module")
def resnet_plan():
    program = load_example("resnet14").program(batch_size=16)
    outputs = simplify(program.train_outputs + [program.outputs["logits"]])
    train, logits = outputs[:-1], outputs[-1]
    plan = plan_memory({"train": schedule(train), "eval": schedule([logits])}, persistent=[train[0], logits])
    return program, plan


def test_resnet14_plan_is_checked_and_close_to_its_lower_bound(resnet_plan):
    program, plan = resnet_plan
    check_plan(plan)
    mib = 1 << 20
    print(f"ResNet-14, batch 16: arena {plan.arena_bytes / mib:.1f} MiB (persistent {plan.persistent_bytes / mib:.1f}"
          f" MiB), lower bound {plan.lower_bound / mib:.1f} MiB, naive {plan.naive_bytes / mib:.1f} MiB")
    assert plan.arena_bytes <= 1.05 * plan.lower_bound
    assert plan.naive_bytes > 4 * plan.arena_bytes
    patches = [b for b in plan.buffers if b.node.op == "im2col"]
    assert patches and all(b.region == "temp" for b in patches)
    assert {b.schedule for b in patches} == {"train", "eval"}   # the eval graph plans its own, in the same region
    variables = {storage_root(b.node).name for b in plan.buffers if b.node.op == "variable"}
    assert {"step", "lr", "total_steps", "s3b2.conv2.bn.running_var", "s1b1.conv1.w.velocity"} <= variables


def test_inspect_prints_the_plan(capsys):
    assert main(["inspect", str(EXAMPLES / "resnet14.py"), "--target", "cpu", "--batch-size", "2",
                 "--set", "blocks=(1, 1, 1)", "--after", "plan_memory"]) == 0
    out = capsys.readouterr().out
    assert "==== after plan_memory ====" in out and "im2col" in out
    assert "lower bound" in out and "naive" in out


def test_set_rejects_unknown_options(capsys):
    assert main(["inspect", str(EXAMPLES / "resnet14.py"), "--target", "cpu", "--set", "depth=50"]) == 1
    assert "program() takes no depth, so --set depth=... cannot be used" in capsys.readouterr().err
    for example in ("resnet14.py", "mnist_lenet.py"):   # a KeyError, blamed on the quoting of the value
        assert main(["inspect", str(EXAMPLES / example), "--target", "cpu", "--set", "optimizer=rmsprop"]) == 1
        err = capsys.readouterr().err
        assert "unknown optimizer 'rmsprop'; expected one of sgd, adam, adamw" in err and "KeyError" not in err


def test_set_values_are_literals_or_text():
    from gcompile.commands.model_file import parse_settings
    assert parse_settings(["lr=0.1", "batch_norm=False", "channels=20,50", "optimizer=adam", "widths=(4, 8)"]) == \
        {"lr": 0.1, "batch_norm": False, "channels": (20, 50), "optimizer": "adam", "widths": (4, 8)}
    with pytest.raises(GCompileError, match="expected NAME=VALUE"):
        parse_settings(["lr"])


@pytest.mark.parametrize("example", ["mnist_lenet", "resnet14"])
def test_a_learning_rate_of_zero_is_refused_not_replaced(example):
    """`--set lr=0` took the optimizer's default rate (`lr or DEFAULT_LR[...]`); mnist_mlp refused it."""
    with pytest.raises(GCompileError, match=r"got lr=0\.0"):
        load_example(example).program(batch_size=8, lr=0)
