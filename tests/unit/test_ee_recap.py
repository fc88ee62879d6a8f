"""`scripts/ee.sh recap-unchanged LOG`, the idempotence verdict of `make ee-check EE_CHECK_ARGS=`
on the second run's output: it passes only when every host of the recap has changed=0, failed=0
and unreachable=0, and names each host that does not."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINE = "{host:<27}: ok=16   changed={changed}    unreachable={unreachable}    failed={failed}    skipped=14   rescued=0    ignored=0   "


def recap(*hosts: tuple[str, int, int, int]) -> str:
    lines = [LINE.format(host=host, changed=c, unreachable=u, failed=f) for host, c, u, f in hosts]
    return "TASK [x] ***\nok: [frank-primary]\n\nPLAY RECAP " + "*" * 69 + "\n" + "\n".join(lines) + "\n\nDEPLOY RESULT ***\n"


def verdict(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    log = tmp_path / "run-2.log"
    log.write_text(text)
    return subprocess.run([str(ROOT / "scripts" / "ee.sh"), "recap-unchanged", str(log)], capture_output=True, text=True, check=False)


def test_every_host_unchanged_passes(tmp_path):
    result = verdict(tmp_path, recap(("frank-primary", 0, 0, 0), ("homepage", 0, 0, 0)))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("hosts", "named"),
    [
        ((("frank-primary", 0, 0, 0), ("frank-secondary", 2, 0, 0)), "frank-secondary: changed=2"),
        ((("frank-primary", 0, 0, 0), ("homepage", 0, 0, 1)), "homepage: failed=1"),
        ((("searxng", 0, 1, 0),), "searxng: unreachable=1"),
    ],
)
def test_a_host_that_changed_or_failed_fails_by_name(tmp_path, hosts, named):
    result = verdict(tmp_path, recap(*hosts))
    assert result.returncode == 1
    assert named in result.stderr
    assert "frank-primary" not in result.stderr


def test_a_run_with_no_recap_fails(tmp_path):
    # A run that died before its recap must not count as unchanged.
    result = verdict(tmp_path, "ERROR! the playbook could not be parsed\n")
    assert result.returncode == 1
    assert "no PLAY RECAP" in result.stderr
