"""A qualification window on the lab's frank-secondary with the controller gone mid-rung, driven by
the dead-man's switch (plugins/module_utils/qualify/deadman.py): the production unit file saved,
the switch armed (a transient systemd timer on the host), a candidate --ctx-size booted as the
service under the same unit and limits, and then no word from the controller. Shared by
tests/integration/test_qualify_deadman.py and benchmarks/bench_qualify_deadman.py."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from lab_host import BIN, HOST, ROOT, env

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.deadman import DeadMan
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.ladder import Search, next_value
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.verdicts import Rung, judge
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape

UNIT = "frank-secondary.service"
PORT = 7771
UNIT_PATH = f"/etc/systemd/system/{UNIT}"


def host(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", "exec", HOST, *argv], capture_output=True, text=True, env=env(), check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode} on {HOST}: {proc.stderr[-500:]}")
    return proc


def write(path: str, text: str) -> None:
    code = f"import pathlib, sys; pathlib.Path({path!r}).write_text(sys.stdin.read())"
    subprocess.run(["podman", "exec", "-i", HOST, "python3", "-c", code], input=text, text=True, env=env(), check=True)


def slot_ctx() -> int | None:
    """The per-slot window the serving engine reports on /props, or None when it does not answer."""
    proc = host("curl", "-sf", f"http://127.0.0.1:{PORT}/props", check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout).get("default_generation_settings", {}).get("n_ctx")


def wait_ctx(want: int | None, timeout: float) -> float | None:
    """Seconds until /props reports n_ctx == want (any n_ctx when want is None), or None."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        ctx = slot_ctx()
        if ctx is not None and (want is None or ctx == want):
            return time.monotonic() - started
        time.sleep(0.25)
    return None


def killed_controller(seconds: int, candidate_ctx: int) -> dict:
    """Run the window and return its figures: the last-good and candidate n_ctx per slot, the
    candidate's boot seconds, the seconds from the controller's last word (the arming) to the
    last-good shape serving again (None: the switch did not restore it), and whether the unit file
    is the last-good one afterwards. A finally restores the unit itself when the switch did not."""
    switch = DeadMan(UNIT, seconds)
    good_unit = host("cat", switch.unit_path).stdout
    good_ctx = slot_ctx()
    if good_ctx is None:
        raise RuntimeError(f"{UNIT} is not serving on port {PORT}: deploy it first (playbooks/deploy_secondary.yml)")
    result: dict = {"good_ctx": good_ctx, "switch_s": seconds}
    try:
        host(*switch.save_argv())
        host(*switch.reset_argv(), check=False)
        host(*switch.arm_argv())
        armed = time.monotonic()  # the controller's last word
        write(switch.unit_path, re.sub(r"--ctx-size \d+", f"--ctx-size {candidate_ctx}", good_unit))
        host("systemctl", "daemon-reload")
        host("systemctl", "restart", UNIT)
        result["candidate_boot_s"] = wait_ctx(None, seconds - 2)
        result["candidate_ctx"] = slot_ctx()
        back = wait_ctx(good_ctx, seconds + 180)
        result["serving_again_s"] = None if back is None else time.monotonic() - armed
    finally:
        host(*switch.disarm_argv(), check=False)
        host(*switch.reset_argv(), check=False)
        restored_by_switch = host("cat", switch.unit_path).stdout == good_unit
        if not restored_by_switch:
            write(switch.unit_path, good_unit)
            host("systemctl", "daemon-reload")
            host("systemctl", "restart", UNIT)
        host("rm", "-f", switch.saved_path, check=False)
        result["unit_restored_by_switch"] = restored_by_switch
        result["serving_after"] = wait_ctx(good_ctx, 120) is not None
    return result


MODELS = ROOT / ".lab" / "models"
PROBE = Path(__file__).with_name("qualify_probe_on_host.py")


def probe(max_tokens: int) -> dict:
    """The full-contract probe, run on the host against the serving engine."""
    proc = subprocess.run(
        ["podman", "exec", "-i", HOST, "python3", "-", str(PORT), str(max_tokens)],
        input=PROBE.read_text(),
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    if proc.returncode != 0:
        return {"answered": 0, "slots": -1, "error": proc.stderr[-500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_ladder(search: Search, shape: dict, devices: list[dict], switch_s: int = 120, max_tokens: int = 64) -> tuple[list[Rung], dict]:
    """The ladder on frank-secondary: each rung priced by the gate (price_shape on the controller,
    the lab's GGUF readable here), skipped when refused, else booted as the service (the unit's
    --ctx-size swapped, same unit and limits) under the dead-man's switch re-armed per rung, then
    the full-contract probe. The last-good unit is put back at the end, whatever happened."""
    switch = DeadMan(UNIT, switch_s)
    good_unit = host("cat", switch.unit_path).stdout
    good_ctx = slot_ctx()
    history: list[tuple[int, str]] = []
    rungs: list[Rung] = []
    timing: dict = {}
    host(*switch.save_argv())
    try:
        while (value := next_value(search, history)) is not None:
            candidate = {**shape, search.key: value}
            fits = price_shape(candidate, devices, payload_dir=str(MODELS)).fits
            booted, found = False, None
            if fits:
                host(*switch.disarm_argv(), check=False)
                host(*switch.reset_argv(), check=False)
                host(*switch.arm_argv())
                write(switch.unit_path, re.sub(r"--ctx-size \d+", f"--ctx-size {value}", good_unit))
                host("systemctl", "daemon-reload")
                host("systemctl", "restart", UNIT)
                booted = wait_ctx(None, 120) is not None
                if booted:
                    found = probe(max_tokens)
                    if found.get("window", 0) * found.get("slots", 0) != value:
                        found["answered"] = 0  # the engine capped the window: not the asked shape
            verdict, why = judge(fits, booted, found)
            if found and found.get("window") and found["window"] * found["slots"] != value:
                why = f"the engine serves {found['window']} per slot, not {value // shape['parallel']}: capped"
            history.append((value, verdict))
            f = found or {}
            rungs.append(
                Rung(
                    len(rungs) + 1,
                    value,
                    verdict,
                    why,
                    {"host": f["free_at_boot"]} if "free_at_boot" in f else {},
                    {"host": f["free_under_probe"]} if "free_under_probe" in f else {},
                    f.get("tokens"),
                    (f["decoding_together"], f["streams"]) if "streams" in f else None,
                    f.get("decode_tps"),
                )
            )
    finally:
        host(*switch.disarm_argv(), check=False)
        host(*switch.reset_argv(), check=False)
        started = time.monotonic()
        write(switch.unit_path, good_unit)
        host("systemctl", "daemon-reload")
        host("systemctl", "restart", UNIT)
        timing["serving_again_s"] = wait_ctx(good_ctx, 120)
        timing["restore_s"] = time.monotonic() - started
        host("rm", "-f", switch.saved_path, check=False)
    return rungs, timing


def exists(path: str) -> bool:
    return subprocess.run(["podman", "exec", HOST, "test", "-e", path], env=env(), check=False).returncode == 0


def deployed() -> None:
    """frank-secondary serving with a last-known-good record, else deployed first."""
    if slot_ctx() is None or not exists("/var/lib/llm-fleet/frank-secondary/last-good.json"):
        subprocess.run([str(BIN / "ansible-playbook"), "playbooks/deploy_secondary.yml"], cwd=ROOT, env=env(), check=True, capture_output=True)
