"""Synthetic verifiable task: multi-digit addition of mixed difficulty with an optional scratchpad.

Prompt ``"37+485="``; a completion is either the bare answer ``"522"`` or a scratchpad in
brackets followed by the answer, ``"[225]522"``; it ends with ``<eos>``.  The scratchpad holds
the digits of the sum least-significant first (the order in which carries resolve), which a
small causal LM learns far more easily than the most-significant-first answer; copying it
back reversed is then easy.  So the working helps on long operands and makes responses
longer: response length is a meaningful observable, as in math RLVR.

Reasoning variant (``cfg.task == "running_sum"``, ``TestbedConfig.reasoning()``): prompt
``"3+5+8+9="`` (3-8 operands), working = the running partial sums from the right, zero-padded to a
fixed width, ``"[09=17=22=25]25"``: each step adds one operand to the previous sum, which a small model does step by
step but hardly in one shot, so the working raises the chance of a correct answer and the completion
length (10-30 tokens with working, 2-3 without) is the policy's choice.

Reward: 1.0 iff the text after the last ``]`` (or the whole text if there is no scratchpad),
cut at the first ``<eos>``, is a decimal integer equal to the true sum.  The scratchpad itself
is not checked (only the final answer is verified).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import numpy as np

from .testbed_config import TestbedConfig, validate_testbed
from .tokenizer import BOS, EOS, PAD, build_tokenizer

WORK_OPEN, WORK_CLOSE = "[", "]"
_ANSWER_RE = re.compile(r"\d{1,30}")


@dataclass(frozen=True)
class TestbedProblem:
    """One prompt of the testbed task (``grpo_replay.app.data.Problem``-like)."""

    __test__ = False

    id: str
    """Stable id (the expression, e.g. ``"37+485"``); the same problem always has the same id."""
    prompt: str
    """Model input text, e.g. ``"0037+0485="`` (operands zero-padded when
    ``cfg.pad_operands``; the tokenizer adds ``<bos>``)."""
    answer: str
    """The true sum as a decimal string."""
    difficulty: int
    """Level: number of digits of the longest operand; ``digits_max + 1`` for three operands; the
    number of operands in the running_sum task."""

    @property
    def operands(self) -> list[int]:  # from the (unpadded) id
        return [int(x) for x in self.id.split("+")]


def make_problem(operands: list[int], difficulty: int | None = None, width: int = 0) -> TestbedProblem:
    """Problem for ``operands``; ``width > 0`` zero-pads each operand in the prompt."""
    expr = "+".join(str(int(x)) for x in operands)
    if difficulty is None:
        difficulty = max(len(str(int(x))) for x in operands)
    prompt = "+".join(str(int(x)).zfill(width) for x in operands) + "="
    return TestbedProblem(id=expr, prompt=prompt, answer=str(sum(operands)), difficulty=difficulty)


def target_completion(problem: TestbedProblem, working: bool) -> str:
    """Supervised target text (without the trailing EOS token)."""
    if working:
        return WORK_OPEN + problem.answer[::-1] + WORK_CLOSE + problem.answer
    return problem.answer


def sum_width(cfg: TestbedConfig) -> int:
    """Digits of the largest running sum of the running_sum task (the width of each partial sum)."""
    return len(str(cfg.operands_max * (10**cfg.digits_max - 1)))


def running_sum_completion(problem: TestbedProblem, working: bool, width: int) -> str:
    """Supervised target of the running_sum task (without EOS): for ``"3+5+8="``, ``"[08=13=16]16"`` or
    ``"16"``; the partial sums adding the operands from the right (the one next to ``=`` first), each
    zero-padded to ``width`` digits, separated by ``=``.  Right to left, the operand a step needs lies at
    the same distance back for every number of operands (fixed by the step's index alone), which a
    small model with relative positions (RoPE) learns far more easily than a lookup that shifts with the
    prompt's length."""
    if not working:
        return problem.answer
    sums, acc = [], 0
    for x in reversed(problem.operands):
        acc += x
        sums.append(str(acc).zfill(width))
    return WORK_OPEN + "=".join(sums) + WORK_CLOSE + problem.answer


def _clean(text: str) -> str:
    """Cut at the first EOS and drop pad/bos markers and whitespace."""
    text = text.split(EOS, 1)[0]
    return text.replace(PAD, "").replace(BOS, "").strip()


def extract_answer(completion_text: str) -> str | None:
    """Final answer of a completion, or None when malformed.

    The answer is what follows the last ``]`` (the whole text without a scratchpad), up to the
    first ``<eos>``; it must be a decimal integer (surrounding whitespace ignored).  An unclosed
    ``[`` means no answer.
    """
    text = _clean(completion_text)
    if WORK_CLOSE in text:
        text = text.rsplit(WORK_CLOSE, 1)[1]
    elif WORK_OPEN in text:
        return None
    text = text.strip()
    if not _ANSWER_RE.fullmatch(text):
        return None
    return text


def uses_working(completion_text: str) -> bool:
    """Whether the completion (before EOS) opens a scratchpad."""
    return WORK_OPEN in _clean(completion_text)


def _stable_hash(s: str) -> int:
    return zlib.crc32(s.encode())


class TestbedTask:
    """The addition task: problem sampling, held-out split, reward and the tokenizer."""

    __test__ = False

    def __init__(self, cfg: TestbedConfig | None = None, tokenizer=None):
        self.cfg = cfg or TestbedConfig()
        validate_testbed(self.cfg)
        self.tokenizer = tokenizer if tokenizer is not None else build_tokenizer()
        self.tokenizer.padding_side = "left"
        w = list(self.cfg.difficulty_weights)
        if self.cfg.three_operand_prob > 0:
            w = [x * (1.0 - self.cfg.three_operand_prob) / sum(w) for x in w]
            w.append(self.cfg.three_operand_prob)
        self.levels = self.cfg.levels
        self.level_probs = np.asarray(w, dtype=float) / float(sum(w))

    # ------------------------------------------------------------ sampling
    @property
    def three_operand_level(self) -> int:
        return self.cfg.digits_max + 1

    def _draw(self, rng: np.random.Generator, level: int) -> TestbedProblem:
        cfg = self.cfg
        if cfg.task == "running_sum":  # level = number of operands, each of digits_min..digits_max digits
            lens = rng.integers(cfg.digits_min, cfg.digits_max + 1, size=level)
            ops = [_rand_with_digits(rng, int(n)) for n in lens]
            return make_problem(ops, level, cfg.digits_max if cfg.pad_operands else 0)
        if cfg.three_operand_prob > 0 and level == self.three_operand_level:
            k = cfg.three_operand_digits
            lens = [k] + list(rng.integers(1, k + 1, size=2))
            level_ = level
        else:
            lens = [level, int(rng.integers(cfg.digits_min, level + 1))]
            level_ = level
        rng.shuffle(lens)
        ops = [_rand_with_digits(rng, int(n)) for n in lens]
        width = (max(cfg.digits_max, cfg.three_operand_digits) if cfg.pad_operands else 0)
        return make_problem(ops, level_, width)

    def is_heldout(self, problem: TestbedProblem) -> bool:
        """Deterministic split by prompt hash; level-1 items (only 100 exist) are never held out."""
        if problem.difficulty <= 1 and self.cfg.task == "addition":
            return False
        return _stable_hash(problem.id) % self.cfg.heldout_mod == 0

    def _sample(self, rng: np.random.Generator, n: int, heldout: bool) -> list[TestbedProblem]:
        out: list[TestbedProblem] = []
        levels = rng.choice(len(self.levels), size=n, p=self.level_probs)
        for li in levels:
            lvl = self.levels[int(li)]
            while True:
                p = self._draw(rng, lvl)
                if lvl <= 1 or self.is_heldout(p) == heldout:
                    break
            out.append(p)
        return out

    def sample_problems(self, rng: np.random.Generator, n: int) -> list[TestbedProblem]:
        """``n`` training problems from the difficulty mixture (held-out prompts excluded)."""
        return self._sample(rng, n, heldout=False)

    def heldout(self, n: int = 512, seed: int = 12345) -> list[TestbedProblem]:
        """A fixed held-out set (same ``n``/``seed`` -> same list), disjoint from training draws
        for levels >= 2, drawn from the same difficulty mixture."""
        return self._sample(np.random.default_rng(seed), n, heldout=True)

    # ------------------------------------------------------------- scoring
    def reward(self, completion_text: str, problem: TestbedProblem) -> float:
        """1.0 iff the final answer equals the true sum (see :func:`extract_answer`)."""
        if self.cfg.require_eos and EOS not in completion_text:
            return 0.0
        ans = extract_answer(completion_text)
        if ans is None:
            return 0.0
        return 1.0 if int(ans) == int(problem.answer) else 0.0

    extract_answer = staticmethod(extract_answer)
    uses_working = staticmethod(uses_working)

    def target_completion(self, problem: TestbedProblem, working: bool) -> str:
        """Supervised target text of this task's format (without the trailing EOS token)."""
        if self.cfg.task == "running_sum":
            return running_sum_completion(problem, working, sum_width(self.cfg))
        return target_completion(problem, working)

    def sft_example(self, problem: TestbedProblem, rng: np.random.Generator) -> str:
        """Supervised target for the warm start: with the scratchpad with probability
        ``cfg.working_prob`` of the problem's level."""
        working = rng.random() < self.cfg.working_prob_for(problem.difficulty)
        return self.target_completion(problem, bool(working))

    def max_completion_chars(self) -> int:
        """Length of the longest valid completion with a scratchpad, plus EOS."""
        if self.cfg.task == "running_sum":
            w = sum_width(self.cfg)
            return 1 + self.cfg.operands_max * (w + 1) + w + 1
        k = self.cfg.three_operand_digits if self.cfg.three_operand_prob > 0 else 0
        top = max(2 * (10**self.cfg.digits_max - 1), 3 * (10**k - 1))
        n = len(str(top))
        return 2 * n + 3


def _rand_with_digits(rng: np.random.Generator, n: int) -> int:
    lo = 0 if n == 1 else 10 ** (n - 1)
    return int(rng.integers(lo, 10**n))


__all__ = [
    "TestbedProblem", "TestbedTask", "make_problem", "target_completion",
    "extract_answer", "uses_working", "running_sum_completion", "sum_width",
]
