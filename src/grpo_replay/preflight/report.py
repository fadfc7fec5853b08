"""What a preflight prints: sections of facts, and the refusals (each a field, what goes wrong, and the fix)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UsageError


class PreflightRefused(UsageError):
    """The launch would fail or silently change the method: exit 2, before any GPU time."""


@dataclass(frozen=True)
class Refusal:
    field: str  # the setting to change, as the launch spells it (a flag, a --set key, a YAML key, an override)
    problem: str  # what would happen if launched as it is
    fix: str  # what to change

    def line(self) -> str:
        return f"{self.field}: {self.problem}; fix: {self.fix}"


@dataclass
class Report:
    """The resolved launch, section by section; a launch with any refusal does not pass."""

    launch: str  # the kind of launch, e.g. "grpo-replay train"
    sections: dict[str, list[str]] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)

    def add(self, section: str, line: str) -> None:
        self.sections.setdefault(section, []).append(line)

    def refuse(self, field_name: str, problem: str, fix: str) -> None:
        self.refusals.append(Refusal(field_name, problem, fix))

    def fits(self, section: str, fits: list[str], field_name: str, problem: str, fix: str, tag: str = "") -> None:
        """The cards a run fits ("fits: ..."), or a refusal when it fits none."""
        if fits:
            self.add(section, f"{tag}fits: {', '.join(fits)}")
        else:
            self.refuse(field_name, problem, fix)

    def refuse_error(self, error: Exception, label: str = "", field_name: str = "launch") -> None:
        """A refusal from a UsageError the launch's own code raised: the key its message names, the message up to
        its allowed values as the problem, those values as the fix."""
        import re

        key = re.search(r"TrainConfig\.([\w.]+)|(--[\w-]+)|ReplayConfig\.(\w+)", str(error))
        problem, _, fix = str(error).partition("; allowed: ")
        if key:
            field_name = key.group(1) or key.group(2) or f"replay.{key.group(3)}"
        self.refuse(field_name + label, problem, fix or "see the problem")

    def render(self) -> str:
        out = [f"preflight: {self.launch}"]
        for name, lines in self.sections.items():
            out.append(f"\n{name}")
            out += [f"  {line}" for line in lines]
        if self.refusals:
            out.append(f"\nREFUSED ({len(self.refusals)}): the launch would fail or silently change the method")
            out += [f"  {r.line()}" for r in self.refusals]
        else:
            out.append("\nOK: nothing found that would fail or change the method")
        return "\n".join(out)

    def raise_if_refused(self) -> None:
        if self.refusals:
            first = self.refusals[0]
            more = f" (and {len(self.refusals) - 1} more above)" if len(self.refusals) > 1 else ""
            raise PreflightRefused(f"refused: {first.line()}{more}")
