"""Run ON the lab host (podman exec -i HOST python3 - < this file, argv: port max_tokens): the
full-contract survivability probe against llama-server's own /completion, token ids as the prompt so
its length is exact. Every slot at once with a prompt of (window - max_tokens) tokens and
max_tokens to decode (ignore_eos: the tiny model's random weights may end at once); one prompt of
window + 1 tokens, which must be refused; /slots and MemAvailable sampled while it runs. Prints
one JSON object."""

import contextlib
import json
import sys
import threading
import time
import urllib.error
import urllib.request

PORT, MAX_TOKENS = int(sys.argv[1]), int(sys.argv[2])
BASE = f"http://127.0.0.1:{PORT}"


def get(path):
    with urllib.request.urlopen(BASE + path, timeout=30) as r:
        return json.loads(r.read())


def post(body, timeout=1800):
    req = urllib.request.Request(BASE + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {"error": e.read().decode(errors="replace")[:300]}


def mem_available():
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


props = get("/props")
window, slots = props["default_generation_settings"]["n_ctx"], props["total_slots"]
token = 100
results, busy, free = [None] * slots, [], []
stop = threading.Event()


def sample():
    while not stop.is_set():
        with contextlib.suppress(Exception):
            busy.append(sum(1 for s in get("/slots") if s.get("is_processing")))
        free.append(mem_available())
        time.sleep(0.2)


def one(i):
    body = {"prompt": [token + i] * (window - MAX_TOKENS), "n_predict": MAX_TOKENS, "ignore_eos": True, "cache_prompt": False, "temperature": 0}
    results[i] = post(body)


free_at_boot = mem_available()
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
threads = [threading.Thread(target=one, args=(i,)) for i in range(slots)]
started = time.monotonic()
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.monotonic() - started
stop.set()
sampler.join()
over_status, over = post({"prompt": [token] * (window + 1), "n_predict": 1}, timeout=120)
answered = [r for s, r in results if s == 200 and r.get("tokens_predicted") == MAX_TOKENS]
print(
    json.dumps(
        {
            "window": window,
            "slots": slots,
            "answered": len(answered),
            "streams": slots,
            "decoding_together": max(busy or [0]),
            "past_window_refused": over_status >= 400,
            "past_window_status": over_status,
            "tokens": sum(r.get("tokens_evaluated", 0) + r.get("tokens_predicted", 0) for r in answered),
            "decode_tps": sum(r["timings"]["predicted_per_second"] for r in answered) if answered else None,
            "free_at_boot": free_at_boot,
            "free_under_probe": min(free or [free_at_boot]),
            "wall_s": round(wall, 1),
            "errors": [r.get("error") for s, r in results if s != 200][:2],
        }
    )
)
