"""The qualification window's dead-man's switch on the lab's frank-secondary, with the controller
gone mid-rung: the production unit file is saved, the switch armed (a transient systemd timer,
plugins/module_utils/qualify/deadman.py), a candidate shape (ctx_size from --candidate-ctx) booted
as the service under the same unit and limits, and then nothing: no controller re-arms or disarms
the switch, as when the controller is killed or its connection lost. Prints whether the candidate
booted, and the seconds from the controller's last word to the last-good shape serving again
(/health answering and /props reporting the last-good n_ctx per slot). Run under the lab lock:

    flock /tmp/lab.lock .venv/bin/python benchmarks/bench_qualify_deadman.py [--seconds 30] [--candidate-ctx 65536]

The endpoint serves its last-good shape at the end whatever happened: a finally puts the saved
unit back itself when the switch did not.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / ".collections"))  # ansible_collections.frank.llm_fleet: this checkout

from lab_host import HOST, env  # noqa: E402

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.deadman import DeadMan  # noqa: E402

UNIT = "frank-secondary.service"
PORT = 7771


def host(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", "exec", HOST, *argv], capture_output=True, text=True, env=env(), check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
    return proc


def slot_ctx() -> int | None:
    proc = host("curl", "-sf", f"http://127.0.0.1:{PORT}/props", check=False)
    if proc.returncode != 0:
        return None
    props = json.loads(proc.stdout)
    return props.get("default_generation_settings", {}).get("n_ctx")


def wait_ctx(want: int | None, timeout: float) -> float | None:
    """Seconds until /props reports n_ctx == want (any serving n_ctx when want is None)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        ctx = slot_ctx()
        if ctx is not None and (want is None or ctx == want):
            return time.monotonic() - started
        time.sleep(0.25)
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=30, help="the switch's timeout")
    parser.add_argument("--candidate-ctx", type=int, default=65536)
    args = parser.parse_args()
    switch = DeadMan(UNIT, args.seconds)
    good_unit = host("cat", switch.unit_path).stdout
    good_ctx = slot_ctx()
    if good_ctx is None:
        raise SystemExit(f"{UNIT} is not serving on port {PORT}: deploy it first (playbooks/deploy_secondary.yml)")
    candidate = re.sub(r"--ctx-size \d+", f"--ctx-size {args.candidate_ctx}", good_unit)
    print(f"last-good: n_ctx {good_ctx} per slot; candidate: --ctx-size {args.candidate_ctx}; switch {args.seconds} s")
    try:
        host(*switch.save_argv())
        host(*switch.reset_argv(), check=False)
        host(*switch.arm_argv())
        armed = time.monotonic()
        subprocess.run(
            ["podman", "exec", "-i", HOST, "python3", "-c", f"import pathlib,sys; pathlib.Path({switch.unit_path!r}).write_text(sys.stdin.read())"],
            input=candidate,
            text=True,
            env=env(),
            check=True,
        )
        host("systemctl", "daemon-reload")
        host("systemctl", "restart", UNIT)
        booted = wait_ctx(None, args.seconds - 2)
        state = f"serving n_ctx {slot_ctx()} per slot after {booted:.1f} s" if booted is not None else "not serving"
        print(f"candidate boot: {state}")
        # The controller is gone from here on: nothing re-arms or disarms the switch.
        last_word = armed
        back = wait_ctx(good_ctx, args.seconds + 180)
        if back is None:
            print("NOT restored by the switch")
            return 1
        since = time.monotonic() - last_word
        print(
            f"last-good serving again {since:.1f} s after the controller's last word (switch {args.seconds} s + {since - args.seconds:.1f} s restore and boot)"
        )
        return 0
    finally:
        host(*switch.disarm_argv(), check=False)
        host(*switch.reset_argv(), check=False)
        if host("cat", switch.unit_path).stdout != good_unit:
            subprocess.run(
                ["podman", "exec", "-i", HOST, "python3", "-c", f"import pathlib,sys; pathlib.Path({switch.unit_path!r}).write_text(sys.stdin.read())"],
                input=good_unit,
                text=True,
                env=env(),
                check=True,
            )
            host("systemctl", "daemon-reload")
            host("systemctl", "restart", UNIT)
        host("rm", "-f", switch.saved_path, check=False)
        print(f"after: {'serving the last-good n_ctx ' + str(good_ctx) if wait_ctx(good_ctx, 120) is not None else 'NOT serving the last-good shape'}")


if __name__ == "__main__":
    sys.exit(main())
