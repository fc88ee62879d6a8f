"""A steady stream of streamed chat completions against one endpoint, counting what a deploy does
to clients: requests that completed, were cut mid-stream (truncated), were refused before their
first token (the endpoint was down), or failed otherwise; per-request latency; and the downtime
window, from the first refused request to the first answered one after it.

The client is the openai package (what the fleet's clients use); the harness only schedules it:
one request every 1/rate seconds on its own thread, each streaming `max_tokens` tokens with
ignore_eos so its length is known. Used by benchmarks/bench_drain.py and the no-op-under-load lab
test (tests/integration/test_load.py).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import openai


@dataclass
class Outcome:
    started: float
    ended: float = 0.0
    first_token: float | None = None
    tokens: int = 0
    verdict: str = "failed"  # ok | truncated | refused | failed
    error: str = ""


@dataclass
class LoadReport:
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(1 for o in self.outcomes if o.verdict == verdict)

    def downtime_s(self) -> float:
        """First refused request to the first request answered after it (0 when none was refused)."""
        refused = [o for o in self.outcomes if o.verdict == "refused"]
        if not refused:
            return 0.0
        first = min(o.started for o in refused)
        answered = [o.first_token for o in self.outcomes if o.first_token is not None and o.started >= first]
        return (min(answered) if answered else max(o.ended for o in self.outcomes)) - first

    def summary(self) -> dict[str, Any]:
        done = [o.ended - o.started for o in self.outcomes if o.verdict == "ok"]
        return {
            "requests": len(self.outcomes),
            "ok": self.count("ok"),
            "truncated": self.count("truncated"),
            "refused": self.count("refused"),
            "failed": self.count("failed"),
            "downtime_s": round(self.downtime_s(), 2),
            "latency_p50_s": round(statistics.median(done), 2) if done else None,
            "latency_max_s": round(max(done), 2) if done else None,
            "errors": sorted({o.error for o in self.outcomes if o.error})[:5],
        }


class LoadHarness:
    def __init__(self, base_url: str, model: str, api_key: str = "none", rate_per_s: float = 2.0, max_tokens: int = 200, timeout: float = 120.0):
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)
        self.model = model
        self.interval = 1.0 / rate_per_s
        self.max_tokens = max_tokens
        self.report = LoadReport()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._scheduler = threading.Thread(target=self._schedule, daemon=True)

    def __enter__(self) -> LoadHarness:
        self._scheduler.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> LoadReport:
        self._stop.set()
        self._scheduler.join()
        for thread in self._threads:
            thread.join()
        return self.report

    def _schedule(self) -> None:
        while not self._stop.is_set():
            thread = threading.Thread(target=self._one, daemon=True)
            thread.start()
            self._threads.append(thread)
            self._stop.wait(self.interval)

    def _one(self) -> None:
        outcome = Outcome(started=time.monotonic())
        finished = False
        try:
            stream = self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": "Count slowly."}],
                max_tokens=self.max_tokens,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta and chunk.choices[0].delta.content:
                    if outcome.first_token is None:
                        outcome.first_token = time.monotonic()
                    outcome.tokens += 1
                if chunk.choices and chunk.choices[0].finish_reason:
                    finished = True
            outcome.verdict = "ok" if finished else "truncated"
        except Exception as exc:  # every way a request ends is counted; none may kill the harness
            outcome.error = type(exc).__name__
            if outcome.first_token is not None:
                outcome.verdict = "truncated"  # cut mid-stream, whatever the transport said
            elif isinstance(exc, openai.APIConnectionError) or (isinstance(exc, openai.APIStatusError) and exc.status_code == 503):
                outcome.verdict = "refused"  # not there, or still loading: downtime
            else:
                outcome.verdict = "failed"
                outcome.error = f"{type(exc).__name__}: {str(exc)[:120]}"
        outcome.ended = time.monotonic()
        with self._lock:
            self.report.outcomes.append(outcome)
