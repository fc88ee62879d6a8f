"""Long streamed answers on the lab host whose length follows the machine, not a guess.

A drain test needs a stream still in flight when the deploy reaches its drain, and finished well
before the drain's timeout. A fixed token count does that only at one machine speed: on the lab's
tiny model decode slows with depth (3,000 tokens took 1.7 s, 32,747 took 259 s), and a loaded
machine is slower still. So the count is derived from the engine's own decode timings, measured
just before (`timings.predicted_ms` of two short answers: a per-token cost that grows linearly with
depth), for a stream lasting about the seconds asked; and a test whose stream ended before the
drain repeats with a longer one instead of failing (that says the stream was short, not that the
drain is wrong)."""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

from lab_host import HOST, env, on_host

# Decode timings are measured at these lengths: short enough to cost about a second, far enough
# apart to see the per-token cost grow with depth.
PROBE_TOKENS = (1000, 3000)


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
    """About how many tokens one stream decodes in `seconds` on this engine now: from two timed
    answers, time(n) = a*n + b*n^2 (a per-token cost growing linearly with depth), solved for n;
    at least the longer probe, at most `cap` (the slot's window less the prompt)."""
    n1, n2 = PROBE_TOKENS
    t1, t2 = decode_ms(port, model, n1, key) / 1000, decode_ms(port, model, n2, key) / 1000
    b = max((t2 / n2 - t1 / n1) / (n2 - n1), 0.0)
    a = max(t1 / n1 - b * n1, 1e-6)
    n = seconds / a if b == 0 else (-a + math.sqrt(a * a + 4 * b * seconds)) / (2 * b)
    return int(min(max(n, n2), cap))


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


def stop_streams(name: str, out: str) -> None:
    on_host("pkill", "-f", f"{name}-stream", check=False)
    on_host("rm", "-f", out, f"/tmp/{name}-stream.sh", check=False)
