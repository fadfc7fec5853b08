"""The math RLVR task: prompts from a JSONL file / directory / HF dataset, reward = math-verify grading.

A completion earns 1 when its last \\boxed{} answer is equivalent to the gold answer, else 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..app.data import load_problems
from .word_sums import HELDOUT_SEED, difficulty, TRAIN_ROWS, TRAIN_SEED, is_word_sums, word_sum_problems

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class MathPrompt:
    id: str
    prompt: str  # the model input text (chat template applied when the tokenizer has one)
    answer: str
    difficulty: int = 0
    message: str = ""  # the user message before the chat template (what a chat-aware trainer such as TRL takes)


class MathTask:
    def __init__(
        self,
        tokenizer,
        data: str,
        heldout_data: Optional[str] = None,
        n_heldout: int = 256,
        instruction: str = INSTRUCTION,
        use_chat_template: bool = True,
        on_error: str = "raise",
    ):
        self.tokenizer = tokenizer
        self.instruction = instruction
        self.use_chat_template = use_chat_template and getattr(tokenizer, "chat_template", None) is not None
        self.require_boxed = True
        if is_word_sums(data):  # the named synthetic task: bare questions, final answer graded without a box
            self.instruction, self.require_boxed = "", False
            rows = word_sum_problems(data, TRAIN_ROWS, TRAIN_SEED)
            if not heldout_data:
                held = word_sum_problems(data, n_heldout, HELDOUT_SEED)
                self.train, self.held = [self._wrap(p) for p in rows], [self._wrap(p) for p in held]
                return
        else:
            rows = load_problems(data, split="train", on_error=on_error)
        if heldout_data:
            held = load_problems(heldout_data, split="test", on_error=on_error)
            train = list(rows)
        else:
            # The last n_heldout rows are held out, never sampled for training.
            if len(rows) <= n_heldout:
                raise ValueError(f"{data}: {len(rows)} rows, need more than eval_problems={n_heldout} to hold some out")
            train, held = list(rows[:-n_heldout]), list(rows[-n_heldout:])
        self.train = [self._wrap(p) for p in train]
        self.held = [self._wrap(p) for p in held]

    def _wrap(self, p) -> MathPrompt:
        text = message = f"{p.problem}\n{self.instruction}" if self.instruction else p.problem
        if self.use_chat_template:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
            )
        level = difficulty(p) if p.source == "word_sums" else 0  # held-out accuracy is reported per level
        return MathPrompt(id=p.id, prompt=text, answer=p.answer, difficulty=level, message=message)

    def sample_problems(self, rng: np.random.Generator, n: int) -> list[MathPrompt]:
        idx = rng.choice(len(self.train), size=n, replace=n > len(self.train))
        return [self.train[i] for i in idx]

    def heldout(self, n: int = 256, seed: int = 0) -> list[MathPrompt]:
        return self.held[:n]

    def reward(self, completion_text: str, problem: MathPrompt) -> float:
        from ..eval.grading import grade

        return 1.0 if grade(completion_text, problem.answer, require_boxed=self.require_boxed) else 0.0
