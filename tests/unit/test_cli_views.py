"""The operator CLI's views of the playbooks' decisions, run as the operator runs it (a subprocess):
`llm-fleet qualify` over results the qualify code's own writer stored, and `llm-fleet budget`'s
payload identity and pricing from the Hub (the lab's Hub emulator) before the download."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))

import make_tiny_gguf
from hub_emulator import HubEmulator

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify import results
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, str(ROOT / "bin" / "llm-fleet")]
REPO = "lab/tiny-models"
DEVICES = [{"name": "gpu0", "memory": "24 GiB"}]
SHAPE = {"runtime": "llamacpp", "model_file": "tiny.gguf", "ctx_size": 4096, "parallel": 1}
LADDER = {"key": "context", "ceiling": 81920, "floor": 8192, "step": 16384, "bonus": 4096, "align": 2048}
PROBE = {
    "slots": 2,
    "answered": 2,
    "past_window_refused": True,
    "streams": 2,
    "decoding_together": 2,
    "tokens": 65536,
    "decode_tps": 88.5,
    "free_at_boot": {"host": 3 << 30},
    "free_under_probe": {"host": 2 << 30},
}


def run(*args, env=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, check=False, env=env)


def write_qualification(results_dir: Path) -> None:
    """Two rungs, as playbooks/qualify.yml stores them: 81920 fails to boot, 65536 passes."""
    rungs = results.step(LADDER, [], {"value": 81920, "fits": True, "booted": False, "why": "health gate timed out"})["rungs"]
    rungs = results.step(LADDER, rungs, {"value": 65536, "fits": True, "booted": True, "probe": PROBE})["rungs"]
    results.write(str(results_dir), "frank-secondary", LADDER, {"runtime": "llamacpp", "model_file": "tiny.gguf", "ctx_size": 8192}, rungs, {"restore_s": 3.2})


def test_qualify_prints_the_stored_table_and_the_recommended_snippet(tmp_path):
    write_qualification(tmp_path)
    proc = run("qualify", "frank-secondary", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "ladder over ctx_size, 2 rung(s); answer ctx_size = 65536" in proc.stdout
    rows = [line.split()[:3] for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert rows[:2] == [["1", "81,920", "boot_failed"], ["2", "65,536", "passed"]]
    snippet = proc.stdout.split("recommended (inventory snippet):\n", 1)[1]
    assert yaml.safe_load(snippet) == {"endpoint_shape": {"runtime": "llamacpp", "model_file": "tiny.gguf", "ctx_size": 65536}}
    document = json.loads(run("qualify", "frank-secondary", "--dir", str(tmp_path), "--json").stdout)
    assert document["answer"] == 65536 and document["timing"] == {"restore_s": 3.2}


def test_qualify_without_results_exits_2_naming_the_file_and_the_playbook(tmp_path):
    proc = run("qualify", "frank-secondary", "--dir", str(tmp_path))
    assert proc.returncode == 2
    assert f"{tmp_path}/frank-secondary.qualify.json: no qualification results" in proc.stderr
    assert "run playbooks/qualify.yml --limit frank-secondary" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "frank-secondary.qualify.json").write_text("{not json")
    proc = run("qualify", "frank-secondary", "--dir", str(tmp_path))
    assert proc.returncode == 2 and "frank-secondary.qualify.json: not JSON" in proc.stderr


def test_qualify_without_an_inventory_or_a_directory_says_which_to_give():
    proc = run("qualify", "frank-secondary")
    assert proc.returncode == 2 and "give -i INVENTORY" in proc.stderr and "--dir DIR" in proc.stderr


def write_inventory(root: Path, group_vars: dict) -> Path:
    inventory = root / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(
        yaml.safe_dump({"llm_endpoints": {"hosts": {"frank-secondary": {"endpoint_shape": SHAPE, "endpoint_devices": DEVICES}}}})
    )
    (inventory / "group_vars" / "all.yml").write_text(yaml.safe_dump(group_vars))
    return inventory


@pytest.mark.slow  # reads the inventory through ansible-inventory
def test_qualify_finds_the_results_where_the_role_leaves_them(tmp_path):
    """llm_fleet_bench_dir/qualify when only the bench directory is set (the lab's habit), with
    inventory_dir templated; llm_fleet_qualify_dir wins over it."""
    inventory = write_inventory(tmp_path, {"lab_root": "{{ inventory_dir }}/..", "llm_fleet_bench_dir": "{{ lab_root }}/bench"})
    write_qualification(tmp_path / "bench" / "qualify")
    proc = run("qualify", "frank-secondary", "-i", str(inventory))
    assert proc.returncode == 0, proc.stderr
    assert "answer ctx_size = 65536" in proc.stdout
    (inventory / "group_vars" / "all.yml").write_text(
        yaml.safe_dump({"llm_fleet_bench_dir": "{{ inventory_dir }}/../bench", "llm_fleet_qualify_dir": str(tmp_path / "q")})
    )
    proc = run("qualify", "frank-secondary", "-i", str(inventory))
    assert proc.returncode == 2 and f"{tmp_path}/q/frank-secondary.qualify.json: no qualification results" in proc.stderr


def write_host_vars(path: Path, shape: dict, **more) -> Path:
    path.write_text(yaml.safe_dump({"endpoint_shape": shape, "endpoint_devices": DEVICES, **more}))
    return path


def manifest_of(files: dict[str, int], revision: str = "0123456789abcdef0123456789abcdef01234567") -> dict:
    return {"repo_id": REPO, "revision": revision, "files": [{"path": p, "size": size, "sha256": "0" * 64, "lfs": True} for p, size in files.items()]}


GEOMETRY = {"n_layer": 2, "n_head_kv": 2, "head_dim": 32, "layer_bytes": "1 MiB", "output_bytes": "1 MiB", "input_bytes": "1 MiB"}


def test_budget_refuses_a_model_file_the_manifest_lacks_naming_the_closest(tmp_path):
    """Exit 2, not 1: nothing was priced; the shape names a file that is not there (a value to
    correct), which no smaller context would cure."""
    shape = {**SHAPE, "model_file": "tiny.ggfu", "model_geometry": GEOMETRY}
    proc = run("budget", "--shape", str(write_host_vars(tmp_path / "hv.yml", shape, endpoint_payload_manifest=manifest_of({"tiny.gguf": 100}))))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "model_file: 'tiny.ggfu' is not in the manifest; did you mean 'tiny.gguf'?" in proc.stderr
    assert f"(set in {tmp_path / 'hv.yml'}:" in proc.stderr, proc.stderr  # and the file that set it
    assert "lab/tiny-models@0123456789ab" in proc.stderr and proc.stdout == ""


def test_budget_names_the_manifest_it_checked_and_a_host_file_it_did_not(tmp_path):
    shape = {**SHAPE, "model_geometry": GEOMETRY}
    proc = run("budget", "--shape", str(write_host_vars(tmp_path / "hv.yml", shape, endpoint_payload_manifest=manifest_of({"tiny.gguf": 100}))))
    assert proc.returncode == 0, proc.stderr
    assert "payload identity: the shape's payload (model_file: 1 paths) is in the manifest lab/tiny-models@0123456789ab" in proc.stdout
    proc = run("budget", "--shape", str(write_host_vars(tmp_path / "hv2.yml", shape, endpoint_payload_manifest="/srv/payload/manifest.yml")))
    assert proc.returncode == 0 and "endpoint_payload_manifest /srv/payload/manifest.yml is a file on the host" in proc.stdout
    # A copy of the manifest given here is checked.
    copy = tmp_path / "manifest.yml"
    copy.write_text(yaml.safe_dump(manifest_of({"other.gguf": 100})))
    proc = run("budget", "--shape", str(tmp_path / "hv2.yml"), "--manifest", str(copy))
    assert proc.returncode == 2 and "model_file: 'tiny.gguf' is not in the manifest" in proc.stderr


@pytest.fixture
def hub(tmp_path):
    model = tmp_path / "models" / "tiny.gguf"
    model.parent.mkdir()
    make_tiny_gguf.write_model(make_tiny_gguf.GEOMETRIES[0], model)
    emulator = HubEmulator().start()
    emulator.add_file(REPO, "tiny.gguf", model, "lfs")
    yield emulator, model
    emulator.stop()


def hub_env(emulator) -> dict:
    return {**{k: v for k, v in os.environ.items() if k != "HF_TOKEN"}, "HF_ENDPOINT": emulator.hub_url}


def test_budget_prices_from_the_hub_before_the_download_as_the_file_on_disk_does(tmp_path, hub):
    emulator, model = hub
    manifest = manifest_of({"tiny.gguf": model.stat().st_size}, emulator.repos[REPO].commit)
    host_vars = write_host_vars(tmp_path / "hv.yml", SHAPE, endpoint_payload_manifest=manifest)
    proc = run("budget", "--shape", str(host_vars), "--json", env=hub_env(emulator))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    # The oracle: the same shape priced from the downloaded file's header on disk.
    on_disk = price_shape(SHAPE, DEVICES, str(model.parent)).as_dict()
    assert {k: report[k] for k in on_disk} == on_disk
    assert report["hub"]["commit"] == emulator.repos[REPO].commit
    assert report["payload_identity"]["ok"] is True and report["payload_identity"]["names"] == [{"field": "model_file", "path": "tiny.gguf", "kind": "file"}]
    # Only the header crossed the wire, never the weights.
    served = sum(emulator.bytes_served.values())
    assert 0 < served < model.stat().st_size
    text = run("budget", "--shape", str(host_vars), env=hub_env(emulator)).stdout
    assert f"from the Hub: {REPO}@{emulator.repos[REPO].commit[:12]} (model_geometry;" in text


def test_budget_reads_the_hub_repo_named_by_endpoint_hub_repo_and_names_a_missing_file(tmp_path, hub):
    emulator, _model = hub
    host_vars = write_host_vars(tmp_path / "hv.yml", {**SHAPE, "model_file": "absent.gguf"}, endpoint_hub_repo=REPO)
    proc = run("budget", "--shape", str(host_vars), env=hub_env(emulator))
    assert proc.returncode == 2
    assert "absent.gguf is not in the repo at this revision (HTTP 404)" in proc.stderr and "Traceback" not in proc.stderr


def test_no_hub_leaves_a_shape_without_geometry_unpriced_and_reads_nothing(tmp_path, hub):
    emulator, _model = hub
    host_vars = write_host_vars(tmp_path / "hv.yml", SHAPE, endpoint_hub_repo=REPO)
    proc = run("budget", "--shape", str(host_vars), "--no-hub", env=hub_env(emulator))
    assert proc.returncode == 2 and "give model_geometry" in proc.stderr, proc.stderr
    assert f"or price it from {REPO} on the Hub (without --no-hub" in proc.stderr
    assert sum(emulator.bytes_served.values()) == 0


def test_hub_flag_without_a_repo_names_the_variables_to_set(tmp_path):
    proc = run("budget", "--shape", str(write_host_vars(tmp_path / "hv.yml", {**SHAPE, "model_geometry": GEOMETRY})), "--hub")
    assert proc.returncode == 2 and "endpoint_hub_repo" in proc.stderr


GATED = "lab/gated-models"
TOKEN = "hf_cli_views_SECRET_41d7"


def test_a_gated_repo_is_read_with_the_token_from_hf_token_only(tmp_path, hub):
    emulator, model = hub
    emulator.add_file(GATED, "tiny.gguf", model, "lfs")
    emulator.gate(GATED, TOKEN)
    host_vars = write_host_vars(tmp_path / "hv.yml", SHAPE, endpoint_hub_repo=GATED)
    proc = run("budget", "--shape", str(host_vars), env=hub_env(emulator))
    assert proc.returncode == 2 and "HTTP 401" in proc.stderr and "HF_TOKEN" in proc.stderr, proc.stderr
    proc = run("budget", "--shape", str(host_vars), env={**hub_env(emulator), "HF_TOKEN": TOKEN})
    assert proc.returncode == 0, proc.stderr
    assert f"from the Hub: {GATED}@" in proc.stdout and TOKEN not in proc.stdout + proc.stderr
