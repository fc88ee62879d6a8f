# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The quality gate before a KV-dtype or weight-quant swap (playbooks/quality_gate.yml).

Seed 001: int8 KV went in after "Quality verified against the bf16 baseline (needle-in-haystack at
213k + short battery) before the swap". The baseline (the endpoint's shape) and the candidate (the
shape with the swap) are each booted as the service and asked the same battery with one salt at
temperature 0: short prompts, and a needle (a code carrying the salt) placed at `depth` of a
filler that fills `fill` of the request window, sized by the engine's own token count.

`judge` refuses the swap when the candidate loses a needle the baseline found, or when its answers
diverge from the baseline's past `max_divergence`: the mean over the short prompts of 1 - (common
prefix / the longer answer), in characters (0: identical, 1: nothing in common). The default
threshold, 0.25, lets a quantised cache drift late in an answer and refuses one that changes
answers early; with random weights (the lab) only the machinery is exercised (docs/qualify.md).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import FILLER

MAX_DIVERGENCE = 0.25
BATTERY = {
    "short-capital": "Name the capital of France in one word.",
    "short-sum": "What is 17 plus 25? Answer with the number only.",
    "short-list": "List three primary colours, comma separated.",
    "short-define": "Define 'latency' in one sentence.",
}
NEEDLE = "needle"


def needle_code(salt: str) -> str:
    return f"VIOLET-{salt[:6].upper()}"


def needle_prompt(salt: str, filler_chars: int, depth: float) -> str:
    """A filler of `filler_chars` with the needle sentence at `depth` (0: the start, 1: the end),
    then the question."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"quality_needle_depth: between 0 and 1, got {depth}")
    filler = (FILLER * (filler_chars // len(FILLER) + 1))[:filler_chars]
    at = int(len(filler) * depth)
    sentence = f" The secret code is {needle_code(salt)}. "
    return filler[:at] + sentence + filler[at:] + "\n\nWhat is the secret code? Answer with the code only."


def divergence(baseline: str, candidate: str) -> float:
    if baseline == candidate:
        return 0.0
    longer = max(len(baseline), len(candidate))
    common = next((i for i, (a, b) in enumerate(zip(baseline, candidate)) if a != b), min(len(baseline), len(candidate)))
    return round(1 - common / longer, 3)


def judge(baseline: dict[str, Any], candidate: dict[str, Any], salt: str, max_divergence: float = MAX_DIVERGENCE) -> tuple[list[str], dict[str, Any], str]:
    """(reasons to refuse, figures, table) for two runs of the battery, each {name, booted, why, answers}."""
    refusals = [f"{run['name']}: did not boot ({str(run.get('why', ''))[:200]})" for run in (baseline, candidate) if not run.get("booted")]
    if refusals:
        return refusals, {}, ""
    base = {a["shape"]: a for a in baseline.get("answers", [])}
    cand = {a["shape"]: a for a in candidate.get("answers", [])}
    code = needle_code(salt)
    rows = [("prompt", "baseline", "candidate", "divergence")]
    scores = []
    for name in sorted(base):
        b, c = base[name], cand.get(name, {"text": "", "error": "no answer"})
        for run_name, answer in ((baseline["name"], b), (candidate["name"], c)):
            if answer.get("error"):
                refusals.append(f"{run_name} {name}: the engine answered an error: {answer['error']}")
        if name == NEEDLE:
            found_b, found_c = code in b["text"], code in c["text"]
            rows.append((name, "found" if found_b else "missed", "found" if found_c else "missed", "-"))
            if found_b and not found_c:
                refusals.append(f"{candidate['name']} lost the needle {baseline['name']} found (the code at depth)")
            continue
        score = divergence(b["text"], c["text"])
        scores.append(score)
        rows.append((name, repr(b["text"][:24]), repr(c["text"][:24]), f"{score:.3f}"))
    mean = round(sum(scores) / len(scores), 3) if scores else 0.0
    if mean > max_divergence:
        refusals.append(f"{candidate['name']} diverges from {baseline['name']} by {mean:.3f} on the short battery, past the threshold {max_divergence}")
    rows.append(("mean divergence", "", "", f"{mean:.3f} (threshold {max_divergence})"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    text = "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows)
    return refusals, {"mean_divergence": mean, "threshold": max_divergence, "needle": code}, text
