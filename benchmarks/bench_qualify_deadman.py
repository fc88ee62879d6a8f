"""The qualification window's dead-man's switch on the lab's frank-secondary with the controller
gone mid-rung (tests/integration/lab_qualify.py): the production unit file saved, the switch armed
(a transient systemd timer, plugins/module_utils/qualify/deadman.py), a candidate --ctx-size booted
as the service under the same unit and limits, then no controller to re-arm or disarm the switch,
as when it is killed or its connection lost. Prints whether the candidate booted and the seconds
from the controller's last word to the last-good shape serving again (/props reporting the
last-good n_ctx per slot). Run under the lab lock:

    flock /tmp/lab.lock .venv/bin/python benchmarks/bench_qualify_deadman.py [--seconds 30] [--candidate-ctx 65536] [--runs 1]

The endpoint serves its last-good shape at the end whatever happened.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / ".collections"))  # ansible_collections.frank.llm_fleet: this checkout

from lab_qualify import killed_controller  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=30, help="the switch's timeout")
    parser.add_argument("--candidate-ctx", type=int, default=65536)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    worst = 0
    for run in range(1, args.runs + 1):
        r = killed_controller(args.seconds, args.candidate_ctx)
        boot = "not serving" if r["candidate_boot_s"] is None else f"n_ctx {r['candidate_ctx']} per slot after {r['candidate_boot_s']:.1f} s"
        again = "NOT restored by the switch" if r["serving_again_s"] is None else f"{r['serving_again_s']:.1f} s"
        print(f"run {run}: last-good n_ctx {r['good_ctx']} per slot; candidate --ctx-size {args.candidate_ctx}: {boot}")
        print(f"run {run}: switch {args.seconds} s; last-good serving again after the controller's last word: {again}")
        print(f"run {run}: unit restored by the switch: {r['unit_restored_by_switch']}; serving after: {r['serving_after']}")
        worst = worst or int(r["serving_again_s"] is None or not r["serving_after"])
    return worst


if __name__ == "__main__":
    sys.exit(main())
