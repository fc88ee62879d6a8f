"""The operator CLI, run as the operator runs it (a subprocess)."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, str(ROOT / "bin" / "llm-fleet")]
EXAMPLE = ROOT / "docs" / "examples" / "primary-rank-refused.yml"


def run(*args):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, check=False)


def test_refused_shape_exits_1_and_prints_the_failing_rule():
    proc = run("budget", "--shape", str(EXAMPLE))
    assert proc.returncode == 1
    assert "[FAIL] free_floor: r9700-0" in proc.stdout
    assert "fits: NO" in proc.stdout


def test_set_override_turns_the_refusal_into_a_pass():
    proc = run("budget", "--shape", str(EXAMPLE), "--set", "expert_arena=14.31 GiB", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["fits"] is True
    assert result["kv"]["basis"] == "measured"


def test_invalid_input_exits_2_naming_the_field():
    proc = run("budget", "--shape", str(EXAMPLE), "--set", "kv_cache_dtype=fp3")
    assert proc.returncode == 2
    assert "kv_cache_dtype" in proc.stderr


def test_svg_picture_has_one_bar_segment_per_term(tmp_path):
    svg = tmp_path / "ledger.svg"
    proc = run("budget", "--shape", str(EXAMPLE), "--svg", str(svg))
    assert proc.returncode == 1
    root = ET.fromstring(svg.read_text())
    ns = "{http://www.w3.org/2000/svg}"
    titled = [rect for rect in root.iter(f"{ns}rect") if rect.find(f"{ns}title") is not None]
    assert [rect.find(f"{ns}title").text.split(":")[0] for rect in titled] == ["weights", "kv_pool", "graphs", "expert_arena", "non_torch"]
    heights = [float(rect.get("height")) for rect in titled]
    assert heights.index(max(heights)) == 3  # the arena is the largest term


def test_generated_shape_keys_are_in_sync_with_their_generator():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_role_specs.py"), "--check"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow  # reads the inventory through ansible-inventory
def test_budget_of_an_inventory_endpoint_takes_its_devices_and_draws_a_png(tmp_path):
    picture = tmp_path / "ledger.png"
    proc = run("budget", "--endpoint", "frank-archon", "-i", "inventories/production", "--png", str(picture))
    assert proc.returncode == 0, proc.stderr
    assert "r9700-0" in proc.stdout and "r9700-1" in proc.stdout
    with Image.open(picture) as image:
        assert image.format == "PNG" and image.size == (1000, 600)


@pytest.mark.slow  # reads the inventory through ansible-inventory
def test_budget_names_the_inventorys_endpoints_and_the_removed_flags():
    proc = run("budget", "--endpoint", "dankserver", "-i", "inventories/production")
    assert proc.returncode != 0 and "frank-archon, frank-zealot, frank-dragoon" in proc.stderr
    proc = run("budget", "--host", "dankserver", "--var", "frank_primary_shape", "-i", "inventories/production")
    assert proc.returncode != 0 and "--endpoint NAME" in proc.stderr and "docs/migration.md" in proc.stderr


def test_records_lists_the_known_good_generations_newest_first(tmp_path):
    record_dir = tmp_path / "frank-secondary"
    (record_dir / "generations").mkdir(parents=True)
    shape = {"runtime": "llamacpp", "served_id": "frank-secondary", "port": 7771}
    (record_dir / "last-good.json").write_text(json.dumps({"shape": {**shape, "port": 7772}, "unit": {}}))
    (record_dir / "generations" / "gen-00000000000000000002.json").write_text(json.dumps({"shape": shape, "unit": {}}))
    # A record with payload generations says whether its payload is still there for a rollback.
    payload = {"dir": str(tmp_path / "models" / "tiny"), "generation": "e" * 64}
    (tmp_path / "models" / "tiny.generations" / ".purge-staged" / ("e" * 64)).mkdir(parents=True)
    oldest = {"shape": {**shape, "runtime": "vllm"}, "unit": {}, "payload": payload}
    (record_dir / "generations" / "gen-00000000000000000001.json").write_text(json.dumps(oldest))
    proc = run("records", str(record_dir))
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [(r[0], r[2], r[4], r[5:]) for r in rows] == [
        ("0", "llamacpp", "7772", ["-"]),
        ("1", "llamacpp", "7771", ["-"]),
        ("2", "vllm", "7771", ["eeeeeeeeeeee", "staged"]),
    ]
    assert run("records", str(tmp_path / "none")).returncode == 1
