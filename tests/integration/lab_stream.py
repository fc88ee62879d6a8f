"""Long streamed answers on the lab host whose length follows the machine, not a guess.

A drain test needs a stream still in flight when the deploy reaches its drain, and finished well
before the drain's timeout. A fixed token count does that only at one machine speed: on the lab's
tiny model decode slows with depth (3,000 tokens took 1.7 s, 32,747 took 259 s), and a loaded
machine is slower still. So the count is derived from the engine's own decode timings
(`timings.predicted_ms`), measured just before on answers that double in length until one takes a
measurable share of the time asked; and a test whose stream ended before the drain repeats with a
longer one instead of failing (that says the stream was short, not that the drain is wrong).

The extrapolation errs short, never long: per-token cost grows with depth, at most linearly (an
attention read per cached token), so n tokens that took t seconds put N >= n tokens at no more than
t * (N / n)^2. Fitting two short probes instead (what this did before) let noise on a loaded
machine flatten the fit to a line, which took the whole 32,704-token window for "~40 s" and
outlasted the drain's 600 s timeout. The speed measured holds for the next stream only if the engine
decodes on one thread (ONE_DECODE_THREAD)."""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

from lab_host import HOST, env, on_host

# The first probe's length, and the share of the asked time the last probe must take. The bound
# puts the answer at most twice that probe's length; where the per-token cost is nearly flat (the
# lab's tiny model, short depths) the stream then lasts sqrt(share) of the asked time or more, half
# of it here (a sixteenth made it a quarter: too short for a loaded deploy to reach its drain).
# The probes cost at most about half the asked time.
FIRST_PROBE_TOKENS = 1000
PROBE_SHARE = 1 / 4
# A stream is meant to last at least this long (an idle lab's deploy reaches its drain in about
# 20 s), and never more than a quarter of the drain's timeout, so a slower decode under the deploy's
# own load still ends well inside it.
STREAM_MIN_S = 40
# The stream endpoint's extra_args. With two decode threads on a busy 2-core machine, ggml's
# per-node barriers spin while the peer thread waits for a core, and decode speed swung from 3 to
# 180 ms a token between two streams of one run (both cores busy), so no measured speed held for
# the next stream. One thread slows in proportion to its share of a core, which the probes measure.
ONE_DECODE_THREAD = ["--threads", "1"]


def stream_seconds(first_deploy_s: float, drain_timeout: float) -> float:
    """How long the first stream should last: STREAM_MIN_S, or 1.5 times the endpoint's first
    deploy if longer (a loaded machine deploys slower too), at most a quarter of the drain's timeout."""
    return min(max(STREAM_MIN_S, round(1.5 * first_deploy_s)), drain_timeout / 4)


def longer_stream(seconds: float, drain_timeout: float) -> float:
    """The next try's stream after one that ended on its own first: twice as long, still at most a
    quarter of the drain's timeout."""
    return min(2 * seconds, drain_timeout / 4)


def _auth(key: str) -> list[str]:
    return ["-H", f"Authorization: Bearer {key}"] if key else []


def decode_ms(port: int, model: str, tokens: int, key: str = "") -> float:
    """The engine's own time to decode `tokens` tokens (llama-server's timings.predicted_ms)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "ignore_eos": True})
    answer = on_host("curl", "-s", *_auth(key), "-H", "Content-Type: application/json", "-d", body, f"http://127.0.0.1:{port}/v1/chat/completions")
    timings = json.loads(answer)["timings"]
    assert timings["predicted_n"] == tokens, timings
    return float(timings["predicted_ms"])


def tokens_lasting(port: int, model: str, seconds: float, cap: int, key: str = "") -> int:
    """About how many tokens one stream decodes in at most `seconds` on this engine now: answers of
    doubling length until one takes PROBE_SHARE of `seconds` (or reaches `cap`), then the quadratic
    bound from that one, n * sqrt(seconds / t); at least the last probe, at most `cap` (the slot's
    window less the prompt)."""
    tokens = min(FIRST_PROBE_TOKENS, cap)
    while True:
        took = decode_ms(port, model, tokens, key) / 1000
        if took >= PROBE_SHARE * seconds or tokens >= cap:
            break
        tokens = min(2 * tokens, cap)
    return int(min(max(tokens * math.sqrt(seconds / max(took, 1e-3)), tokens), cap))


def start_stream(tmp_path: Path, name: str, port: int, tokens: int, out: str, key: str = "") -> None:
    """A streamed answer of `tokens` tokens from the lab host itself, in the background (podman
    exec -d); returns once the engine reports it in flight."""
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "ignore_eos": True, "stream": True})
    auth = f"-H 'Authorization: Bearer {key}' " if key else ""
    script = tmp_path / f"{name}-stream.sh"
    script.write_text(f"curl -sN {auth}-H 'Content-Type: application/json' -d '{body}' http://127.0.0.1:{port}/v1/chat/completions > {out} 2>&1\n")
    subprocess.run(["podman", "cp", str(script), f"{HOST}:/tmp/{name}-stream.sh"], env=env(), check=True)
    subprocess.run(["podman", "exec", "-d", HOST, "sh", f"/tmp/{name}-stream.sh"], env=env(), check=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = on_host("curl", "-s", *_auth(key), f"http://127.0.0.1:{port}/metrics", check=False)
        if "llamacpp:requests_processing 1" in metrics:
            return
        time.sleep(0.2)
    raise AssertionError(f"the stream never showed as in flight: {on_host('cat', out, check=False)[-300:]}")


def wait_streams_ended(name: str) -> None:
    """Until the streams started for `name` have ended on their own (at most 300 s), so nothing of
    one reaches the next try's output."""
    on_host("sh", "-c", f"for i in $(seq 600); do pgrep -f '[{name[0]}]{name[1:]}-stream' >/dev/null || exit 0; sleep 0.5; done")


def stop_streams(name: str, out: str) -> None:
    on_host("pkill", "-f", f"{name}-stream", check=False)
    on_host("rm", "-f", out, f"/tmp/{name}-stream.sh", check=False)
