"""The testbed's graded reward functions, by hand-computed examples."""
import pytest

from grpo_replay.tasks.reward_funcs import TASK_REWARD_FUNCS, reward_functions
from grpo_replay.tasks.testbed import TestbedConfig, TestbedTask, make_problem
from grpo_replay.tasks.testbed.graded import digit_credit, format_credit

P = make_problem([37, 485])  # 522


@pytest.mark.parametrize("text,credit", [
    ("522<eos>", 1.0), ("[225]522<eos>", 1.0), ("512", 2 / 3), ("22", 2 / 3), ("1522", 3 / 4), ("0522", 1.0),
    ("999", 0.0), ("[22", 0.0), ("abc", 0.0), ("", 0.0), ("[225]5x2", 0.0),
])
def test_digit_credit(text, credit):
    assert digit_credit(text, P) == pytest.approx(credit)


@pytest.mark.parametrize("text,ok", [("522", 1.0), ("999<eos>", 1.0), ("[1]7", 1.0), ("[22", 0.0), ("x", 0.0)])
def test_format_credit(text, ok):
    assert format_credit(text, P) == ok


def test_require_eos_scores_a_truncated_completion_zero():
    task = TestbedTask(TestbedConfig(require_eos=True))
    funcs = reward_functions("testbed", task)
    assert [funcs[n]("522", P) for n in TASK_REWARD_FUNCS["testbed"]] == [0.0, 0.0, 0.0]
    assert [funcs[n]("512<eos>", P) for n in TASK_REWARD_FUNCS["testbed"]] == [0.0, pytest.approx(2 / 3), 1.0]
