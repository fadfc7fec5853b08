"""The model input for a math problem: the instruction appended to every problem, and the chat template when the
tokenizer has one."""
from __future__ import annotations

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""Default instruction appended to every problem (the same text the math training task uses)."""


def build_prompt(problem: str, tokenizer=None, instruction: str = INSTRUCTION, use_chat_template: bool = True) -> str:
    """The model input for one problem.

    ``instruction`` is appended on a new line; if it contains ``{problem}`` it is used as the whole user
    message template instead. With ``use_chat_template`` and a tokenizer that has a chat template, the user
    message is wrapped in it (with the generation prompt); otherwise the plain text is returned.
    """
    message = instruction.replace("{problem}", problem) if "{problem}" in instruction else f"{problem}\n{instruction}"
    if use_chat_template and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
    return message
