"""The final answer of a math text: the last ``\\boxed{}`` of a completion or a worked solution.

Plain text parsing, shared by data loading (`app.data` reads a MATH solution's gold answer) and grading
(`eval.grading` reads a completion's answer): data loading needs nothing of the evaluation layer above it.
"""
from __future__ import annotations

from typing import Iterable, Optional

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> Optional[str]:
    """Content of the last well-formed ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``) in ``text``.

    Nested and escaped braces (``\\{``) are handled; a truncated last box (unbalanced braces) is ignored in
    favour of an earlier complete one. Returns None when there is no box.
    """
    if not text:
        return None
    starts = sorted(
        (i, cmd) for cmd in _BOX_COMMANDS for i in _find_all(text, cmd)
    )
    for start, cmd in reversed(starts):
        content = _box_content(text, start + len(cmd))
        if content is not None:
            return content.strip()
    return None


def all_boxed(text: str) -> list[str]:
    """Contents of every well-formed ``\\boxed{...}`` (or ``\\fbox``, ``\\boxed 5``) in ``text``, in order."""
    starts = sorted((i, cmd) for cmd in _BOX_COMMANDS for i in _find_all(text or "", cmd))
    found = (_box_content(text, start + len(cmd)) for start, cmd in starts)
    return [c.strip() for c in found if c is not None]


def _find_all(text: str, needle: str) -> Iterable[int]:
    i = text.find(needle)
    while i != -1:
        yield i
        i = text.find(needle, i + 1)


def _box_content(text: str, pos: int) -> Optional[str]:
    """Content after a box command that ends just before ``pos``; None if malformed."""
    if pos < len(text) and text[pos].isalpha():
        return None  # e.g. "\boxedanswer": a different command
    j = pos
    while j < len(text) and text[j] == " ":
        j += 1
    if j < len(text) and text[j] == "{":
        depth, k = 0, j
        while k < len(text):
            ch = text[k]
            if ch == "\\":
                k += 2  # skip the escaped character (\{ and \} are not grouping braces)
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[j + 1 : k]
            k += 1
        return None  # unbalanced: truncated generation
    if j > pos:  # "\boxed 5": the token up to whitespace or "$"
        k = j
        while k < len(text) and not text[k].isspace() and text[k] != "$":
            k += 1
        return text[j:k] if k > j else None
    return None
