"""Make `ansible_collections.frank.llm_fleet` importable from this checkout; the built tarball."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COLLECTIONS = ROOT / ".collections"
_link = COLLECTIONS / "ansible_collections" / "frank" / "llm_fleet"
if not _link.exists():
    _link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("../../..", _link)
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))


@pytest.fixture(scope="session")
def collection_tarball(tmp_path_factory) -> Path:
    """The collection tarball as `make build` makes it (ansible-galaxy collection build), built
    once per session into a temporary directory."""
    out = tmp_path_factory.mktemp("build")
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    proc = subprocess.run([str(galaxy), "collection", "build", "--output-path", str(out), str(ROOT)], capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tarball,) = out.glob("frank-llm_fleet-*.tar.gz")
    return tarball
