"""The plan table tells the truth about a real fleet run on the lab (the fault matrix's fourth
finding): a companion play that fails is a row of its own naming the task and the field, and a
stopped unit brought back with its shape unchanged reads "started", not "shape change"."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from lab_host import BIN, ROOT, env, on_host, require_lab_host

pytestmark = pytest.mark.lab

require_lab_host()


def fleet_run(inventory: Path, *argv: str) -> tuple[int, str]:
    """deploy_fleet.yml with the default stdout callback (the plan table prints at its end)."""
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "playbooks/deploy_fleet.yml", "-i", str(inventory), *argv],
        capture_output=True, text=True, cwd=ROOT, env=env(), check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout


def table_rows(out: str, title: str, header: str) -> dict[str, str]:
    """The rows of the table whose header starts with `header`'s two words (after `title`), by
    their first column; the columns are cut where the header's second word starts (a play's
    name has spaces)."""
    assert title in out, out[-3000:]
    tail = out.split(title, 1)[1]
    blocks = [block.splitlines() for block in tail.strip().split("\n\n")]
    first, second = header.split()[:2]
    table = next((block for block in blocks if block and block[0].split()[:2] == [first, second]), None)
    assert table is not None, tail[:3000]
    cut = table[0].index(second)
    return {line[:cut].strip(): " ".join(line[cut:].split()) for line in table[1:]}


def lab_copy(tmp_path: Path) -> Path:
    inventory = tmp_path / "inventories" / "lab"
    shutil.copytree(ROOT / "inventories" / "lab", inventory)
    (tmp_path / ".lab").symlink_to(ROOT / ".lab")
    (tmp_path / "lab").symlink_to(ROOT / "lab")
    return inventory


def test_a_failing_companion_play_is_a_row_naming_its_task_and_field(tmp_path):
    inventory = lab_copy(tmp_path)
    relay_vars = inventory / "group_vars" / "webhook_relays" / "main.yml"
    relay = yaml.safe_load(relay_vars.read_text())
    relay_vars.write_text(yaml.safe_dump({**relay, "webhook_relay_port": "eighty"}))

    # A real run (the relay's validation fails before its host changes); the vaulted search settings
    # stay out of the limit, as in test_fleet_isolation.py.
    rc, out = fleet_run(inventory, "--limit", "frank-secondary,webhook-relay,homepage")
    assert rc != 0, out[-3000:]
    plays = table_rows(out, "Deploy result", "play outcome")
    row = plays["Deploy the webhook relay"]
    assert row.startswith("failed"), plays
    # The validation failure names the field, not only "Validation of arguments failed".
    assert "webhook_relay_port" in row, row
    # One failed companion does not end the run: the homepage after it converges and is crawled.
    assert plays["Deploy the homepage"].startswith(("ok", "changed")), plays
    assert plays["Gate each homepage with a real browser"].startswith(("ok", "changed")), plays
    assert plays["Report the companions that failed in this run"].startswith("failed"), plays


def test_a_stopped_unit_with_an_unchanged_shape_reads_started(tmp_path):
    inventory = lab_copy(tmp_path)
    rc, out = fleet_run(inventory, "--limit", "frank-secondary")
    assert rc == 0, out[-3000:]
    on_host("systemctl", "stop", "frank-secondary.service")
    try:
        started = time.monotonic()
        rc, out = fleet_run(inventory, "--limit", "frank-secondary")
        took = time.monotonic() - started
        assert rc == 0, out[-3000:]
        rows = table_rows(out, "Deploy result", "endpoint verdict")
        assert rows["frank-secondary"].startswith("started"), rows
        assert "shape change" not in rows["frank-secondary"], rows
        print(f"stopped unit started by one fleet run: {took:.1f} s; row: {rows['frank-secondary']}")
    finally:
        # Whatever happened above, the lab's endpoint serves again.
        on_host("systemctl", "start", "frank-secondary.service", check=False)
    assert on_host("systemctl", "is-active", "frank-secondary.service", check=False).strip() == "active"
