# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The speculative-decoding A/B of playbooks/spec_ab.yml: configurations x prompt shapes.

Seed 003 ran four configurations of one binary on identical prompts at temperature 0 and found
"IDENTICAL greedy text, so the 'lossless verification' claim in the runbook is now a check". The
shapes are the harness's: prose (ordinary text, where a drafter pays), echo (a verbatim repeat of
a passage in the prompt, the only text an n-gram matcher can match; thinking switched off, since
a first run "compared '' to ''" when the model copied inside its reasoning), structured
(repetitive output with no prompt overlap: record lists). Every prompt carries the run's salt, so
no configuration is served from another's prompt cache.

`ask_shapes` runs on the host against the configuration serving now; `compare` judges the runs:
greedy text that differs between configurations for one shape fails, and so does an empty answer
(never a silent pass).
"""

from __future__ import annotations

import time
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError, Endpoint, request_json
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.probe import FreeReader, MemorySampler

PASSAGE = (
    "The endpoint restarts only when its shape changes.",
    "Every boot writes its ledger beside the record.",
    "A refused shape costs no boot and changes nothing.",
    "The last known good shape is restored whatever happens.",
)
SHAPES: dict[str, str] = {
    "prose": "Write a short paragraph on why a fleet of inference endpoints keeps a record of each known-good shape.",
    "echo": "Repeat the following passage exactly, line by line, and nothing else:\n" + "\n".join(PASSAGE),
    "structured": "List twenty records, one per line, in the form 'id: N, name: endpoint-N, state: serving'.",
}
# The shapes whose answer must be content, not reasoning: thinking is switched off for them.
NO_THINKING = ("echo", "structured")


def copy_ratio(text: str) -> float:
    """The share of the answer's non-empty lines that are lines of the passage."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return round(sum(1 for line in lines if line in PASSAGE) / len(lines), 3) if lines else 0.0


def ask(
    endpoint: Endpoint,
    model: str,
    shape: str,
    text: str,
    salt: str,
    max_tokens: int,
    sampling: dict[str, Any],
    extra: dict[str, Any],
    no_thinking: dict[str, Any],
) -> dict[str, Any]:
    """One prompt's chat completion: its text, tokens, decode tok/s and the engine's draft counts."""
    body: dict[str, Any] = {
        **extra,
        **sampling,
        "model": model,
        "messages": [{"role": "user", "content": f"[{salt}] {text}"}],
        "max_tokens": max_tokens,
        "stream": False,
    }
    if shape not in SHAPES or shape in NO_THINKING:
        body.update(no_thinking)  # answers that must be content: every prompt but prose
    started = time.monotonic()
    try:
        answer = request_json(endpoint, "POST", "/v1/chat/completions", body, timeout=600)
    except ApiError as exc:
        return {"shape": shape, "text": "", "error": str(exc)[:300]}
    wall = time.monotonic() - started
    message = (answer.get("choices") or [{}])[0].get("message") or {}
    timings = answer.get("timings") or {}
    completion = (answer.get("usage") or {}).get("completion_tokens") or 0
    tps = timings.get("predicted_per_second") or (completion / wall if wall > 0 else None)
    found = {"shape": shape, "text": str(message.get("content") or ""), "completion_tokens": completion, "decode_tps": round(float(tps), 1) if tps else None}
    # llama.cpp reports its drafts in the answer's timings; an engine that does not leaves them out.
    if "draft_n" in timings:
        found["draft_n"] = int(timings["draft_n"])
        found["draft_accepted"] = int(timings.get("draft_n_accepted", 0))
    if shape == "echo":
        found["copy_ratio"] = copy_ratio(found["text"])
    return found


def ask_shapes(
    endpoint: Endpoint,
    model: str,
    salt: str,
    max_tokens: int,
    sampling: dict[str, Any],
    extra: dict[str, Any],
    no_thinking: dict[str, Any],
    read_free: FreeReader,
    prompts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Every prompt (the A/B's shapes unless given) against the configuration serving now, memory
    sampled throughout."""
    free_at_boot = read_free()
    with MemorySampler(read_free) as memory:
        answers = [ask(endpoint, model, name, text, salt, max_tokens, sampling, extra, no_thinking) for name, text in (prompts or SHAPES).items()]
    return {"answers": answers, "free_at_boot": free_at_boot, "free_under_load": memory.least}


def acceptance(answer: dict[str, Any]) -> float | None:
    drafted = answer.get("draft_n")
    return round(answer.get("draft_accepted", 0) / drafted, 3) if drafted else None


def compare(runs: list[dict[str, Any]]) -> tuple[list[str], str]:
    """(failures, table) over the configurations' runs, each {name, booted, why, answers, free_*}.
    A configuration that did not boot is a failure too: its text was never compared."""
    failures: list[str] = []
    baseline: dict[str, tuple[str, str]] = {}
    rows = [("config", "shape", "tokens", "decode tok/s", "accepted", "copy ratio", "free at boot MiB", "free under load MiB", "identical")]
    for run in runs:
        if not run.get("booted"):
            failures.append(f"{run['name']}: did not boot ({str(run.get('why', ''))[:200]})")
            continue
        for answer in run.get("answers", []):
            shape, text = answer["shape"], answer["text"]
            same = "-"
            if answer.get("error"):
                failures.append(f"{run['name']} {shape}: the engine answered an error: {answer['error']}")
            elif not text.strip():
                failures.append(f"{run['name']} {shape}: EMPTY answer (an empty text proves nothing; give the shape more max_tokens or switch thinking off)")
            elif shape not in baseline:
                baseline[shape] = (run["name"], text)
                same = "baseline"
            elif text != baseline[shape][1]:
                first, other = baseline[shape]
                at = next((i for i, (a, b) in enumerate(zip(text, other)) if a != b), min(len(text), len(other)))
                failures.append(f"{run['name']} {shape}: the greedy text differs from {first}'s at character {at}")
                same = "NO"
            else:
                same = "yes"
            rows.append(
                (
                    run["name"],
                    shape,
                    str(answer.get("completion_tokens", "-")),
                    "-" if answer.get("decode_tps") is None else f"{answer['decode_tps']:.1f}",
                    "-" if acceptance(answer) is None else f"{acceptance(answer):.0%}",
                    "-" if "copy_ratio" not in answer else f"{answer['copy_ratio']:.2f}",
                    _mib(run.get("free_at_boot") or {}),
                    _mib(run.get("free_under_load") or {}),
                    same,
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return failures, "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows)


def _mib(free: dict[str, int]) -> str:
    return " ".join(f"{name}={value / (1 << 20):,.0f}" for name, value in sorted(free.items())) or "-"


class GridError(ValueError):
    """A qualify_spec_grid that cannot be expanded, naming the field and the fix."""


def grid_configs(grid: dict[str, Any]) -> list[dict[str, Any]]:
    """The configurations of `qualify_spec_grid`: none first, then each drafter at each depth
    (a model-backed drafter, spec_type draft-*, at each of `depths` as draft_max; a draftless one,
    ngram-*, once), then with `chains` each model-backed drafter chained with each draftless one
    at each depth - the only chains llama.cpp takes (a chain has ONE draft context: two
    model-backed drafters are refused by the shape's own check)."""
    if not isinstance(grid, dict):
        raise GridError(f"qualify_spec_grid: expected a mapping (drafters, depths, chains), got {type(grid).__name__}")
    unknown = sorted(set(grid) - {"drafters", "depths", "chains"})
    if unknown:
        raise GridError(f"qualify_spec_grid: unknown key(s) {', '.join(unknown)}; the grid takes drafters, depths and chains")
    drafters = grid.get("drafters") or []
    depths = grid.get("depths") or []
    if not isinstance(drafters, list) or not drafters:
        raise GridError("qualify_spec_grid.drafters: give at least one drafter, e.g. [{name: ngram, shape: {spec_type: ngram-mod}}]")
    if not isinstance(depths, list) or any(not isinstance(d, int) or isinstance(d, bool) or not 1 <= d <= 64 for d in depths):
        raise GridError(f"qualify_spec_grid.depths: a list of draft depths from 1 to 64 (draft_max), got {depths!r}")
    model_backed, draftless = [], []
    for index, drafter in enumerate(drafters):
        where = f"qualify_spec_grid.drafters[{index}]"
        if not isinstance(drafter, dict) or not isinstance(drafter.get("name"), str) or not isinstance(drafter.get("shape"), dict):
            raise GridError(f"{where}: expected {{name: NAME, shape: {{spec_type: ..., ...}}}}, got {drafter!r}")
        spec_type = str(drafter["shape"].get("spec_type") or "")
        if "," in spec_type or not spec_type.startswith(("draft-", "ngram-")):
            raise GridError(f"{where}.shape.spec_type: one type, draft-* (model-backed) or ngram-* (draftless), got {spec_type!r}; the grid makes the chains")
        (model_backed if spec_type.startswith("draft-") else draftless).append(drafter)
    if model_backed and not depths:
        raise GridError("qualify_spec_grid.depths: the model-backed drafters need at least one draft depth (draft_max), e.g. [4]")
    configs: list[dict[str, Any]] = [{"name": "none"}]
    for drafter in model_backed:
        configs += [{"name": f"{drafter['name']}-d{depth}", "shape": {**drafter["shape"], "draft_max": depth}} for depth in depths]
    configs += [{"name": drafter["name"], "shape": dict(drafter["shape"])} for drafter in draftless]
    if grid.get("chains"):
        for drafter in model_backed:
            for other in draftless:
                for depth in depths:
                    shape = {**other["shape"], **drafter["shape"], "draft_max": depth}
                    shape["spec_type"] = f"{drafter['shape']['spec_type']},{other['shape']['spec_type']}"
                    configs.append({"name": f"{drafter['name']}+{other['name']}-d{depth}", "shape": shape})
    names = [config["name"] for config in configs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise GridError(f"qualify_spec_grid.drafters: names must differ; {', '.join(duplicates)} comes out twice")
    return configs
