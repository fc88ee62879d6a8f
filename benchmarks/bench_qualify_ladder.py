"""The qualification ladder on the lab's frank-secondary (tests/integration/lab_qualify.py): the
largest ctx_size of its lab shape that the gate admits, boots as the service and survives the
full-contract probe (every slot at once at the window's limit, a prompt past the window refused),
by the step-down-then-bonus search or bisection, under the dead-man's switch. Prints the result
table, the recommended inventory snippet, and the time to serve the last-good shape again. Run
under the lab lock:

    flock /tmp/lab.lock .venv/bin/python benchmarks/bench_qualify_ladder.py [--ceiling 65536] [--method step]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / ".collections"))  # ansible_collections.frank.llm_fleet: this checkout

from lab_host import lab_shape  # noqa: E402
from lab_qualify import run_ladder  # noqa: E402

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify import ladder, verdicts  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ceiling", type=int, default=65536, help="default: n_ctx_train 32768 x 2 slots")
    parser.add_argument("--floor", type=int, default=8192)
    parser.add_argument("--method", default="step")
    parser.add_argument("--step", type=int, default=16384)
    parser.add_argument("--bonus", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / ".lab" / "bench" / "qualify-frank-secondary.json"))
    args = parser.parse_args()
    shape = lab_shape("frank-secondary")
    devices = yaml.safe_load((ROOT / "inventories" / "lab" / "host_vars" / "frank-secondary.yml").read_text())["endpoint_devices"]
    search = ladder.Search.from_settings(
        {"key": "context", "ceiling": args.ceiling, "floor": args.floor, "method": args.method, "step": args.step, "bonus": args.bonus, "align": 2048},
        source="bench_qualify_ladder.py arguments",
    )
    rungs, timing = run_ladder(search, shape, devices, max_tokens=args.max_tokens)
    best = ladder.answer([(r.value, r.verdict) for r in rungs])
    print(verdicts.table(rungs))
    print(
        verdicts.snippet(
            "frank-secondary",
            shape,
            search.key,
            best,
            len(rungs),
            f"--ceiling {args.ceiling}; the engine caps a slot at the model's trained window, n_ctx_train 32768",
        )
    )
    print(f"last-good serving again {timing['restore_s']:.1f} s after the window closed")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rungs": [r.as_dict() for r in rungs], "recommended": best, "timing": timing}, indent=2))
    print(f"written: {args.out}")
    return 0 if timing["serving_again_s"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
