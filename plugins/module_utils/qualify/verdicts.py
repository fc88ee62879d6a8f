# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A ladder's rungs as a result table, and the recommended shape as an inventory snippet.

A rung's verdict follows from what it measured, in order: the budget gate refused it (no boot),
the unit did not pass its health gate (boot_failed), the full-contract probe found a slot that did
not answer, a prompt past the window that was accepted, or streams that queued (probe_failed);
else it passed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.ladder import PASS
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB

COLUMNS = ("rung", "value", "verdict", "free at boot MiB", "free under probe MiB", "tokens", "concurrency", "decode tok/s", "why")


@dataclass(frozen=True)
class Rung:
    index: int
    value: int
    verdict: str
    why: str = ""
    free_at_boot: dict[str, int] = field(default_factory=dict)
    free_under_probe: dict[str, int] = field(default_factory=dict)
    tokens: int | None = None
    concurrency: tuple[int, int] | None = None  # (decoding at once, slots asked)
    decode_tps: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "rung": self.index,
            "value": self.value,
            "verdict": self.verdict,
            "why": self.why,
            "free_at_boot": dict(self.free_at_boot),
            "free_under_probe": dict(self.free_under_probe),
            "tokens": self.tokens,
            "concurrency": list(self.concurrency) if self.concurrency else None,
            "decode_tps": self.decode_tps,
        }


def judge(gate_fits: bool, booted: bool, probe: dict[str, Any] | None) -> tuple[str, str]:
    """(verdict, why) from the gate's answer, the boot and the probe's findings. `probe` holds
    `answered` and `slots` (prompts at the window's limit, all at once), `past_window_refused`,
    `decoding_together` and `streams` (the N-stream decode leg)."""
    if not gate_fits:
        return "refused", "the budget gate refused the shape (not booted)"
    if not booted:
        return "boot_failed", "the unit did not pass its health gate"
    if probe is None:
        return "probe_failed", "no probe result"
    problems = []
    if probe.get("answered", 0) < probe.get("slots", 0):
        problems.append(f"{probe.get('answered', 0)} of {probe.get('slots', 0)} full-window requests answered")
    if not probe.get("past_window_refused", False):
        problems.append("a prompt past the window was not refused")
    if probe.get("decoding_together", 0) < probe.get("streams", 0):
        problems.append(f"{probe.get('decoding_together', 0)} of {probe.get('streams', 0)} streams decoded together")
    if problems:
        return "probe_failed", "; ".join(problems)
    return PASS, "every slot at the window's limit answered, the oversized prompt was refused"


def _mib(free: dict[str, int]) -> str:
    return " ".join(f"{name}={value / MIB:,.0f}" for name, value in sorted(free.items())) or "-"


def table(rungs: list[Rung]) -> str:
    """The result table as fixed-width text, one line per rung."""
    rows = [COLUMNS]
    for rung in rungs:
        rows.append(
            (
                str(rung.index),
                f"{rung.value:,}",
                rung.verdict,
                _mib(rung.free_at_boot),
                _mib(rung.free_under_probe),
                "-" if rung.tokens is None else f"{rung.tokens:,}",
                "-" if rung.concurrency is None else f"{rung.concurrency[0]}/{rung.concurrency[1]}",
                "-" if rung.decode_tps is None else f"{rung.decode_tps:.1f}",
                rung.why,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows)


def snippet(endpoint: str, shape: dict[str, Any], key: str, value: int | None, rungs: int, bound: str) -> str:
    """host_vars/ENDPOINT.yml's endpoint_shape with the qualified value, as YAML text with the
    evidence in a comment (values as JSON, which YAML reads); without a passing value, a comment saying so and no shape."""
    if value is None:
        return f"# {endpoint}: no rung of {key} passed in {rungs} rungs; keep the current shape\n"
    lines = [f"# {endpoint}: {key} {value} qualified in {rungs} rungs (the qualification ladder); ceiling bounded by {bound}", "endpoint_shape:"]
    for name, current in {**shape, key: value}.items():
        lines.append(f"  {name}: {json.dumps(current)}")
    return "\n".join(lines) + "\n"
