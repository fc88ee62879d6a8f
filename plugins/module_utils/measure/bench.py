# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The conversation bench: a fixed set of real prompts against one or more arms (endpoints or
shapes), each job streamed so time to first token is split from decode speed.

Every job's system message starts with a salt unique to the run, arm, prompt and copy, so no arm
inherits a warm prefix cache from another. Token counts come from each job's own streamed usage;
a job whose stream carries no usage, or whose answer is empty, is a warning, never a pass.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError, Endpoint, StreamResult, run_concurrently, stream_chat

# Real prompts of the kinds the fleet serves: short answers, code, summarising, reasoning, a
# multi-turn follow-up. Fixed so runs compare; the salt, not the text, varies per run.
BENCH_PROMPTS: tuple[dict[str, Any], ...] = (
    {"id": "fact", "messages": [{"role": "user", "content": "In two sentences: why does a GPU need more memory for a longer context window?"}]},
    {
        "id": "code",
        "messages": [
            {
                "role": "user",
                "content": "Write a Python function that parses 'KEY=VALUE' lines from a string into a dict, "
                "skipping blank lines and lines starting with '#'. Include a docstring.",
            }
        ],
    },
    {
        "id": "summary",
        "messages": [
            {
                "role": "user",
                "content": "Summarise for an on-call engineer: 'At 02:14 the inference unit exited cleanly after the model "
                "loader hit an out-of-memory error on device 1. The restart policy was on-failure, so systemd did not "
                "restart it. Clients saw connection refused for 47 minutes until a manual restart. The shape had been "
                "changed the previous evening from 4 to 6 parallel slots.'",
            }
        ],
    },
    {
        "id": "reasoning",
        "messages": [
            {
                "role": "user",
                "content": "A server has 80 GiB. Weights take 52 GiB, buffers 6 GiB, and each parallel slot needs 3.5 GiB "
                "of cache. Keeping 2 GiB free, how many slots fit? Show the steps.",
            }
        ],
    },
    {
        "id": "followup",
        "messages": [
            {"role": "user", "content": "What is a KV cache?"},
            {"role": "assistant", "content": "It stores the attention keys and values of tokens already processed, so they are not recomputed."},
            {"role": "user", "content": "Then why does quantising it to 8 bits change answer quality only a little?"},
        ],
    },
)


@dataclass(frozen=True)
class Arm:
    """One side of a comparison: an endpoint (and the model it serves) with request options."""

    name: str
    endpoint: Endpoint
    model: str
    thinking: bool | None = None  # None: leave the template's default
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class Job:
    arm: str
    prompt: str
    stream: int  # copy index within a burst (0 when not bursting)
    salt: str
    ok: bool = False
    error: str = ""
    ttft_s: float | None = None
    decode_tps: float | None = None
    decode_s: float | None = None
    engine_decode_tps: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    started_s: float = 0.0  # since the phase began
    ended_s: float = 0.0
    answer_preview: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class BenchReport:
    run_id: str
    started_at: str
    max_tokens: int
    burst: int
    jobs: list[Job] = field(default_factory=list)
    bursts: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    arms: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> list[dict[str, Any]]:
        """Per arm: medians over the sequential jobs."""
        rows = []
        for arm in self.arms:
            jobs = [j for j in self.jobs if j.arm == arm["name"] and j.ok]
            ttft = [j.ttft_s for j in jobs if j.ttft_s is not None]
            tps = [j.decode_tps for j in jobs if j.decode_tps is not None]
            rows.append(
                {
                    "arm": arm["name"],
                    "jobs": len([j for j in self.jobs if j.arm == arm["name"]]),
                    "ok": len(jobs),
                    "median_ttft_s": round(statistics.median(ttft), 4) if ttft else None,
                    "median_decode_tps": round(statistics.median(tps), 2) if tps else None,
                    "completion_tokens": sum(j.completion_tokens or 0 for j in jobs),
                }
            )
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "started_at": self.started_at,
            "max_tokens": self.max_tokens,
            "burst": self.burst,
            "arms": self.arms,
            "summary": self.summary(),
            "jobs": [j.as_dict() for j in self.jobs],
            "bursts": self.bursts,
            "warnings": self.warnings,
        }


ProgressFn = Callable[[str], None]


def _payload(arm: Arm, prompt: dict[str, Any], salt: str, max_tokens: int) -> dict[str, Any]:
    # The salt leads the conversation: prefix caches match from the first token on.
    messages = [{"role": "system", "content": f"{salt} is this session. You are a helpful assistant."}, *prompt["messages"]]
    body: dict[str, Any] = {"model": arm.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if arm.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": arm.thinking}
    body.update(arm.extra_body)
    return body


def _salt(run_id: str, arm: str, prompt: str, copy: str) -> str:
    # Random first: a shared leading run id would itself be a cacheable prefix.
    return f"{uuid.uuid4().hex[:8]}-{run_id}-{arm}-{prompt}-{copy}"


def run_job(arm: Arm, prompt: dict[str, Any], salt: str, max_tokens: int, stream: int, phase_start: float, timeout: float) -> Job:
    job = Job(arm=arm.name, prompt=prompt["id"], stream=stream, salt=salt)
    job.started_s = time.monotonic() - phase_start
    try:
        result: StreamResult = stream_chat(arm.endpoint, _payload(arm, prompt, salt, max_tokens), timeout=timeout)
    except ApiError as exc:
        job.error = str(exc)
        job.ended_s = time.monotonic() - phase_start
        return job
    job.ended_s = time.monotonic() - phase_start
    job.ttft_s = result.first_token_s
    job.decode_s = result.decode_s
    job.decode_tps = result.decode_tps
    job.engine_decode_tps = result.engine_decode_tps
    job.prompt_tokens = result.prompt_tokens
    job.completion_tokens = result.completion_tokens
    job.cached_tokens = result.cached_tokens
    job.finish_reason = result.finish_reason
    job.answer_preview = (result.content or result.reasoning)[:120]
    if result.completion_tokens is None:
        job.error = "the stream carried no usage: token counts unknown (does the engine honour stream_options.include_usage?)"
    elif result.empty:
        job.error = f"EMPTY ANSWER: {result.completion_tokens} completion tokens, no text (finish_reason {result.finish_reason})"
    else:
        job.ok = True
    return job


def run_bench(
    arms: list[Arm],
    prompts: tuple[dict[str, Any], ...] | list[dict[str, Any]] = BENCH_PROMPTS,
    max_tokens: int = 128,
    burst: int = 0,
    timeout: float = 600.0,
    progress: ProgressFn | None = None,
) -> BenchReport:
    """Each arm: every prompt once, in sequence (clean TTFT and decode figures), then, when
    burst > 1, every prompt `burst` times at once (aggregate and per-stream figures)."""
    if not arms:
        raise ValueError("arms: give at least one arm")
    if len({arm.name for arm in arms}) != len(arms):
        raise ValueError("arms: names must be unique")
    if max_tokens < 2:
        raise ValueError("max_tokens: at least 2 (decode speed needs a second token)")
    run_id = uuid.uuid4().hex[:12]
    report = BenchReport(run_id, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), max_tokens, burst)
    report.arms = [{"name": a.name, "url": a.endpoint.url, "model": a.model, "thinking": a.thinking} for a in arms]
    total = len(arms) * len(prompts) * (1 + (burst if burst > 1 else 0))
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(f"[{done}/{total}] {what}")

    for arm in arms:
        phase = time.monotonic()
        for prompt in prompts:
            job = run_job(arm, prompt, _salt(run_id, arm.name, prompt["id"], "s"), max_tokens, 0, phase, timeout)
            report.jobs.append(job)
            tick(f"{arm.name} {prompt['id']}: " + (f"ttft {job.ttft_s:.3f}s, {job.decode_tps or 0:.1f} tok/s" if job.ok else job.error))
        if burst > 1:
            for prompt in prompts:
                phase = time.monotonic()
                calls = [
                    (
                        lambda copy=copy, prompt=prompt, arm=arm, phase=phase: run_job(
                            arm, prompt, f"{run_id}-{arm.name}-{prompt['id']}-b{copy}", max_tokens, copy, phase, timeout
                        )
                    )
                    for copy in range(burst)
                ]
                jobs = run_concurrently(calls)
                wall = time.monotonic() - phase
                tokens = sum(j.completion_tokens or 0 for j in jobs if j.ok)
                per_stream = [j.decode_tps for j in jobs if j.ok and j.decode_tps]
                report.bursts.append(
                    {
                        "arm": arm.name,
                        "prompt": prompt["id"],
                        "streams": burst,
                        "ok": sum(j.ok for j in jobs),
                        "wall_s": round(wall, 4),
                        "aggregate_tps": round(tokens / wall, 2) if wall > 0 else None,
                        "median_stream_tps": round(statistics.median(per_stream), 2) if per_stream else None,
                        "jobs": [j.as_dict() for j in jobs],
                    }
                )
                for job in jobs:
                    tick(f"{arm.name} {prompt['id']} burst #{job.stream}: " + ("ok" if job.ok else job.error))
                report.warnings.extend(f"{arm.name} / {prompt['id']} burst stream {j.stream}: {j.error}" for j in jobs if not j.ok)
    report.warnings[:0] = [f"{j.arm} / {j.prompt}: {j.error}" for j in report.jobs if not j.ok]
    return report


def render_bench_table(report: dict[str, Any]) -> str:
    """Per-job rows, the per-arm summary, bursts and warnings, as plain text."""
    lines = [f"bench {report['run_id']} at {report['started_at']}, max_tokens {report['max_tokens']}", ""]
    header = ("arm", "prompt", "ttft s", "decode tok/s", "prompt tok", "out tok", "status")
    rows = [
        (
            j["arm"],
            j["prompt"],
            f"{j['ttft_s']:.3f}" if j["ttft_s"] is not None else "-",
            f"{j['decode_tps']:.1f}" if j["decode_tps"] is not None else "-",
            str(j["prompt_tokens"] if j["prompt_tokens"] is not None else "-"),
            str(j["completion_tokens"] if j["completion_tokens"] is not None else "-"),
            "ok" if j["ok"] else "WARNING",
        )
        for j in report["jobs"]
    ]
    lines.extend(_columns(header, rows))
    lines.append("")
    summary_rows = [
        (s["arm"], f"{s['ok']}/{s['jobs']}", _fmt(s["median_ttft_s"], ".3f"), _fmt(s["median_decode_tps"], ".1f"), str(s["completion_tokens"]))
        for s in report["summary"]
    ]
    lines.extend(_columns(("arm", "ok", "median ttft s", "median decode tok/s", "out tok"), summary_rows))
    if report["bursts"]:
        lines.append("")
        burst_rows = [
            (b["arm"], b["prompt"], str(b["streams"]), f"{b['ok']}/{b['streams']}", _fmt(b["aggregate_tps"], ".1f"), _fmt(b["median_stream_tps"], ".1f"))
            for b in report["bursts"]
        ]
        lines.extend(_columns(("arm", "prompt", "streams", "ok", "aggregate tok/s", "median stream tok/s"), burst_rows))
    for warning in report["warnings"]:
        lines.append(f"WARNING: {warning}")
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _columns(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    out.extend("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows)
    return out
