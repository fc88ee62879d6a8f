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
(never a silent pass). One divergence is not the drafter's: a numeric tie. A drafter's tokens are
verified as one batch, and a batch's matrix products add in another order than one token's
(llama.cpp's CPU and CUDA kernels pick their path by batch size), so where the baseline's first
and second choice are within rounding of each other the verified run may take the second. Greedy
answers carry each token's top two log-probabilities (the OpenAI `logprobs` fields both engines
serve); a text that first differs where the baseline's top two were within `tie_margin` nats and
took exactly the baseline's runner-up is reported as a tie at that character, not a failure (the
text after it can no longer be compared). Anything else that differs fails.
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
# Nats between the baseline's first and second choice within which a verified batch may round the
# other way (a 5% probability ratio; f32 CPU kernels differ by ~1e-4, bf16 GPU ones by ~1e-2).
TIE_MARGIN = 0.05


def greedy(sampling: dict[str, Any]) -> bool:
    return float(sampling.get("temperature", 1.0)) == 0.0


def _token_bytes(entry: dict[str, Any]) -> bytes:
    """A logprobs entry's token as bytes: its `bytes` field (a token may be part of a character),
    else its text."""
    return bytes(entry.get("bytes") or str(entry.get("token", "")).encode())


def token_choices(answer: dict[str, Any]) -> list[list[Any]] | None:
    """Per generated token: [its bytes as hex, the runner-up's bytes as hex, the margin in nats]
    from the answer's OpenAI `logprobs.content`; None when the engine sent none."""
    content = ((answer.get("choices") or [{}])[0].get("logprobs") or {}).get("content")
    if not isinstance(content, list) or not content:
        return None
    choices = []
    for entry in content:
        if not isinstance(entry, dict) or "logprob" not in entry:
            return None
        chosen = _token_bytes(entry)
        others = [t for t in entry.get("top_logprobs") or [] if isinstance(t, dict) and _token_bytes(t) != chosen]
        if others:
            best = max(others, key=lambda t: float(t.get("logprob", float("-inf"))))
            runner_up = _token_bytes(best).hex()
            margin = round(float(entry["logprob"]) - float(best.get("logprob", float("-inf"))), 6)
        else:
            runner_up, margin = "", None
        choices.append([chosen.hex(), runner_up, margin])
    return choices


def tie_at(text: str, baseline: dict[str, Any], answer: dict[str, Any], at: int, tie_margin: float) -> float | None:
    """The baseline's margin where `answer` first differs from it (character `at`), when that is a
    numeric tie: the answer took the baseline's runner-up there, within tie_margin. Else None."""
    mine, theirs = answer.get("tokens"), baseline.get("tokens")
    if not mine or not theirs:
        return None
    # Byte offsets: a token may be part of a character; the tokens must spell each text exactly.
    if b"".join(bytes.fromhex(t[0]) for t in theirs) != baseline["text"].encode() or b"".join(bytes.fromhex(t[0]) for t in mine) != text.encode():
        return None
    offset, where = len(text[:at].encode()), 0
    for index, (chosen, runner_up, margin) in enumerate(theirs):
        end = where + len(bytes.fromhex(chosen))
        if end > offset:
            same_before = index < len(mine) and all(mine[i][0] == theirs[i][0] for i in range(index))
            took_runner_up = index < len(mine) and mine[index][0] == runner_up
            return margin if same_before and took_runner_up and margin is not None and margin <= tie_margin else None
        where = end
    return None


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
    wants_tokens = greedy(sampling)
    if wants_tokens:
        body.update(logprobs=True, top_logprobs=2)  # to tell a numeric tie from a drafter's error
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
    choices = token_choices(answer) if wants_tokens else None
    if choices:
        found["tokens"] = choices
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


def compare(runs: list[dict[str, Any]], tie_margin: float = TIE_MARGIN) -> tuple[list[str], str]:
    """(failures, table) over the configurations' runs, each {name, booted, why, answers, free_*}.
    A configuration that did not boot is a failure too: its text was never compared. A text that
    first differs at a numeric tie of the baseline's (see the module's docstring) reads `tie@N`."""
    failures: list[str] = []
    baseline: dict[str, tuple[str, dict[str, Any]]] = {}
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
                baseline[shape] = (run["name"], answer)
                same = "baseline"
            elif text != baseline[shape][1]["text"]:
                first, other = baseline[shape]
                at = next((i for i, (a, b) in enumerate(zip(text, other["text"])) if a != b), min(len(text), len(other["text"])))
                margin = tie_at(text, other, answer, at, tie_margin)
                if margin is None:
                    failures.append(f"{run['name']} {shape}: the greedy text differs from {first}'s at character {at}")
                    same = "NO"
                else:
                    same = f"tie@{at} ({margin:.4f} nats)"
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
