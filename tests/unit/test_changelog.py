"""The changelog check: fragments and changelogs/changelog.yaml lint clean with the venv's
antsibull-changelog, and CHANGELOG.md is exactly what `antsibull-changelog generate` writes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Every test here runs antsibull-changelog: the slow tier.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# The interpreter running pytest is the venv's, so this is the pinned antsibull-changelog.
ANTSIBULL_CHANGELOG = [sys.executable, "-m", "antsibull_changelog"]


def run_changelog_tool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ANTSIBULL_CHANGELOG, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def assert_no_findings(result: subprocess.CompletedProcess[str], what: str) -> None:
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and not output, f"{what} (rc {result.returncode}):\n{output}"


def test_fragments_lint_clean():
    assert_no_findings(run_changelog_tool("lint", cwd=ROOT), "antsibull-changelog lint found problems")


def test_changelog_yaml_lint_clean():
    result = run_changelog_tool("lint-changelog-yaml", "changelogs/changelog.yaml", cwd=ROOT)
    assert_no_findings(result, "antsibull-changelog lint-changelog-yaml found problems")


def test_changelog_md_is_generated(tmp_path):
    # Generate in a copy so the check never writes into the checkout.
    shutil.copy2(ROOT / "galaxy.yml", tmp_path / "galaxy.yml")
    shutil.copytree(ROOT / "changelogs", tmp_path / "changelogs")
    result = run_changelog_tool("generate", cwd=tmp_path)
    assert result.returncode == 0, f"antsibull-changelog generate failed (rc {result.returncode}):\n{result.stdout}{result.stderr}"

    expected = (tmp_path / "CHANGELOG.md").read_text(encoding="utf-8")
    actual = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert actual == expected, "CHANGELOG.md is generated: run `antsibull-changelog generate` and commit the result, do not edit it by hand"
