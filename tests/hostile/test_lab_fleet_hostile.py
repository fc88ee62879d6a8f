"""lab/lab.sh up-extra: a lab size that is not a whole number >= 1 is refused before podman runs."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("count", ["", "0", "-1", "abc", "3;touch /tmp/pwned-lab", "$(id)", "2 3"])
def test_a_bad_lab_size_is_refused_naming_the_argument(count, tmp_path):
    # Its own state directory: a refusal must come before the lab facts or podman are read.
    env = {"PATH": "/usr/bin:/bin", "LAB_STATE_DIR": str(tmp_path), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(ROOT / "lab" / "lab.sh"), "up-extra", count], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 1
    assert "up-extra needs the lab size N (>= 1)" in proc.stderr
    assert not Path("/tmp/pwned-lab").exists()
