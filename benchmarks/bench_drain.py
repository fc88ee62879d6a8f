"""What a deploy costs clients, measured on the lab: llama-server (frank-load, an extra endpoint on the
lab host with frank-secondary's settings) or vLLM (--runtime vllm: frank-load-vllm, frank-primary's
settings), bound to the LAN with a key, the controller its one allowed client, under a steady
streamed load (load_harness.py, the openai client) while the deploy runs:

  no-op redeploy          the same shape again
  shape change, drain     RestartSec changes (a restart), endpoint_drain_timeout 60
  shape change, no drain  the same change with endpoint_drain_timeout 0
  rollback                a shape whose engine refuses a flag: the health gate fails, the last-known-good comes back

Per scenario it prints requests, completed, cut mid-stream, refused (down or loading), failed, the
downtime window (first refused request to the first answered after it), the p50 latency, and the
deploy's drain report. Run under the lab lock:

    flock /tmp/lab.lock .venv/bin/python benchmarks/bench_drain.py [--runtime vllm] [--rate 4] [--tokens 300]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lab_host import extra_endpoint_inventory, lab_addresses, playbook, remove_endpoint, write_endpoint_vars  # noqa: E402
from load_harness import LoadHarness  # noqa: E402

RUNTIMES = {
    # runtime: (endpoint, port, the lab endpoint whose settings it takes, shape changes)
    "llamacpp": ("frank-load", 7796, "frank-secondary", {"parallel": 4}),
    "vllm": ("frank-load-vllm", 7797, "frank-primary", {}),
}
KEY = "sk-lab-bench-drain"


def drain_report(out: str, name: str) -> dict:
    data = json.loads(out[out.index("{") :])
    for play in data["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get(name, {})
            if "Deploy through the engine" in task["task"]["name"]:
                unit = (result.get("steps") or {}).get("unit") or {}
                return unit.get("drain") or {"outcome": "-", "rolled_back": result.get("rolled_back")}
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", choices=sorted(RUNTIMES), default="llamacpp", help="the engine measured")
    parser.add_argument("--rate", type=float, default=4.0, help="requests started per second")
    parser.add_argument("--tokens", type=int, default=300, help="tokens per streamed answer")
    args = parser.parse_args()
    name, port, template, shape_changes = RUNTIMES[args.runtime]
    own, controller = lab_addresses()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = {
            "endpoint_allowed_networks": [f"{controller}/32"],
            "endpoint_api_key": KEY,
            "endpoint_probe": False,
        }
        shape = {"bind": "0.0.0.0", "restart_sec": 2, **shape_changes}
        inventory = extra_endpoint_inventory(root, name, port, template, endpoint_shape=shape, **base)
        try:
            rc, _stats, out = playbook(root, "deploy.yml", inventory=inventory, limit=name)
            if rc != 0:
                print(out[-2000:])
                return 1
            scenarios = [
                ("no-op redeploy", {**shape}, 60),
                ("shape change, drain", {**shape, "restart_sec": 3}, 60),
                ("shape change, no drain", {**shape, "restart_sec": 4}, 0),
                ("rollback", {**shape, "restart_sec": 5, "extra_args": ["--no-such-flag"]}, 60),
            ]
            for title, changed_shape, drain_timeout in scenarios:
                write_endpoint_vars(inventory, name, port, template, endpoint_shape=changed_shape, endpoint_drain_timeout=drain_timeout, **base)
                began = time.monotonic()
                with LoadHarness(f"http://{own}:{port}/v1", name, KEY, rate_per_s=args.rate, max_tokens=args.tokens) as harness:
                    rc, _stats, out = playbook(root, "deploy.yml", inventory=inventory, limit=name)
                    time.sleep(2)  # the harness keeps going a little after the deploy: the answers after it count
                summary = harness.report.summary()
                rows.append((title, rc, round(time.monotonic() - began, 1), summary, drain_report(out, name)))
        finally:
            remove_endpoint(name)
    print(f"{args.runtime} ({name}), {args.rate:g} requests/s, {args.tokens} tokens each")
    header = f"{'scenario':<24} {'rc':>2} {'wall s':>6} {'reqs':>5} {'ok':>4} {'cut':>4} {'refused':>7} {'failed':>6} {'down s':>6} {'p50 s':>5}  drain"
    print(header)
    print("-" * len(header))
    for title, rc, wall, s, drained in rows:
        print(
            f"{title:<24} {rc:>2} {wall:>6} {s['requests']:>5} {s['ok']:>4} {s['truncated']:>4} {s['refused']:>7} {s['failed']:>6} "
            f"{s['downtime_s']:>6} {s['latency_p50_s'] or '-':>5}  {json.dumps(drained)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
