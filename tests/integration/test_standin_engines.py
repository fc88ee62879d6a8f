"""The halogen and radiance drivers on a real container host: inventories/lab-standins deploys one
endpoint of each runtime on the lab host, on the lab's stand-in engines (lab/stand-ins/: the real
engines are not public; docs/lab.md "Stand-in engines"), through ansible-playbook and the normal
endpoint role. Each deploy passes the gates and the health gate under the unit's new MainPID, the
smoke probe passes only by reading the driver's reasoning field, the boot ledger the stand-in
prints agrees with the driver's price, an oversized prompt is refused before prefill naming the
window, a shape outside the seeds' laws is refused before the host changes, a shape the engine
refuses at boot is rolled back to the last known-good one, and a rerun changes nothing."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml
from lab_host import ROOT, cli, failures, on_host, playbook, remove_endpoint, require_lab_host, unit_property

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import window_from_refusal
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError

pytestmark = pytest.mark.lab

require_lab_host()

INVENTORY = ROOT / "inventories" / "lab-standins"
HALOGEN, RADIANCE = "standin-dragoon", "standin-archon"
PORTS = {HALOGEN: 7782, RADIANCE: 7783}


def shape_of(name: str) -> dict:
    return yaml.safe_load((INVENTORY / "host_vars" / f"{name}.yml").read_text())["endpoint_shape"]


def with_shape(tmp_path: Path, name: str, shape: dict) -> Path:
    """A copy of inventories/lab-standins where `name` has `shape` (../../.lab as in the tree)."""
    root = tmp_path / "standins"
    inventory = root / "inventories" / "lab-standins"
    if not inventory.exists():
        shutil.copytree(INVENTORY, inventory)
        (root / ".lab").symlink_to(ROOT / ".lab")
    path = inventory / "host_vars" / f"{name}.yml"
    data = yaml.safe_load((INVENTORY / "host_vars" / f"{name}.yml").read_text())
    path.write_text(yaml.safe_dump({**data, "endpoint_shape": shape}))
    return inventory


def deploy(tmp_path: Path, inventory: Path = INVENTORY, limit: str | None = None, extra_vars: dict | None = None) -> tuple[int, dict, str]:
    return playbook(tmp_path, "deploy.yml", inventory=inventory, limit=limit, extra_vars=extra_vars)


def on_port(port: int, path: str, body: dict | None = None) -> tuple[int, dict, float]:
    """(HTTP status, JSON body, seconds) of a request made on the lab host."""
    argv = ["curl", "-s", "-o", "/tmp/standin-answer.json", "-w", "%{http_code} %{time_total}"]
    if body is not None:
        on_host("sh", "-c", f"cat > /tmp/standin-request.json <<'EOF'\n{json.dumps(body)}\nEOF")
        argv += ["-H", "Content-Type: application/json", "--data-binary", "@/tmp/standin-request.json"]
    status, seconds = on_host(*argv, f"http://127.0.0.1:{port}{path}").split()
    return int(status), json.loads(on_host("cat", "/tmp/standin-answer.json")), float(seconds)


def ensure_deployed(tmp_path: Path) -> None:
    """Each later test runs alone too: deploy the stand-ins if the first test did not."""
    if any(unit_property(f"{name}.service", "ActiveState") != "active" for name in PORTS):
        rc, _stats, out = deploy(tmp_path)
        assert rc == 0, failures(out) or out[-3000:]


@pytest.fixture(scope="module")
def fresh():
    """Both stand-in endpoints removed first (so the deploy starts each unit anew) and afterwards."""
    if not (ROOT / ".lab" / "facts" / "engine-standin.digest").exists():
        pytest.skip("the stand-in image is not loaded: run `lab/lab.sh load` (or `make lab-up`)")
    for name in PORTS:
        remove_endpoint(name)
    yield
    for name in PORTS:
        remove_endpoint(name)


def test_both_stand_ins_deploy_through_the_endpoint_role(tmp_path, fresh):
    store = tmp_path / "calibration"
    rc, stats, out = deploy(tmp_path, extra_vars={"llm_fleet_calibration_dir": str(store)})
    assert rc == 0, failures(out) or out[-3000:]
    assert stats["failures"] == 0 and stats["changed"] > 0
    for name, port in PORTS.items():
        unit = f"{name}.service"
        assert unit_property(unit, "ActiveState") == "active"
        pid = unit_property(unit, "MainPID")
        assert pid != "0"
        # The health gate judged the process the unit started: the same MainPID serves /health now.
        status, body, _seconds = on_port(port, "/health")
        assert status == 200 and body["status"] == "ok"
        status, models, _seconds = on_port(port, "/v1/models")
        assert [m["id"] for m in models["data"]] == [name]
    # The driver's environment reached the stand-in flash-server (the env file the unit's container reads).
    env_file = on_host("cat", f"/etc/llm-fleet/{HALOGEN}.podman.env")
    for line in ("HALOGEN_CTX=8192", "HALOGEN_KV_POOL_POSITIONS=16384", "HALOGEN_TOKENIZER=/models/tokenizer", "SPEC_ADAPT=0", "HALOGEN_PORT=7782"):
        assert line in env_file, env_file
    # The calibration loop: each stand-in's boot ledger, parsed by its driver, agrees with the price.
    proc = cli("calibration", "--dir", str(store), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {row["endpoint"]: row for row in json.loads(proc.stdout)}
    assert rows.keys() == set(PORTS), rows
    halogen, radiance = rows[HALOGEN], rows[RADIANCE]
    assert halogen["agree"] is True and halogen["measured"]["total_gib"] == 1.1 and halogen["measured"]["pool_positions"] == 16384, halogen
    assert radiance["agree"] is True and radiance["measured"]["claimable_mib"] == 1728, radiance

    # A rerun changes nothing.
    rc, stats, out = deploy(tmp_path)
    assert rc == 0 and stats["changed"] == 0, failures(out) or out[-3000:]


def test_the_probe_contract_reasoning_field_echo_and_refusal(tmp_path, fresh):
    ensure_deployed(tmp_path)
    # Both answer in reasoning_content first: under the probe's 8 tokens the content is empty, so
    # the deploy's smoke probe passed only by reading the driver's reasoning field.
    for name, port in PORTS.items():
        status, answer, _seconds = on_port(port, "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        message = answer["choices"][0]["message"]
        assert status == 200 and message["content"] == "" and message["reasoning_content"], answer
    # radiance echoes the requested name (so a rename is judged on /v1/models); halogen refuses it.
    status, answer, _seconds = on_port(PORTS[RADIANCE], "/v1/chat/completions", {"model": "frank-old-name", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and answer["model"] == "frank-old-name"
    status, _answer, _seconds = on_port(PORTS[HALOGEN], "/v1/chat/completions", {"model": "frank-old-name", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404
    # An oversized prompt is refused at once, naming the window (and halogen the overage).
    for name, window, words in ((HALOGEN, 8192, 10000), (RADIANCE, 4096, 5000)):
        status, body, seconds = on_port(PORTS[name], "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "w " * words}]})
        error = ApiError(body["error"]["message"], status, body)
        assert status == 400 and seconds < 1.0, body
        assert window_from_refusal(error) == (window, words), body


@pytest.mark.parametrize(
    ("name", "changes", "named"),
    [
        (HALOGEN, {"kv_pool_positions": 32768}, "kv_pool_positions: 32,768 is above pool_slots x ctx"),
        (RADIANCE, {"kv_cache_dtype": "fp8_k"}, "kv_cache_dtype: 'fp8_k' splits K and V"),
    ],
)
def test_a_shape_outside_the_seeds_laws_is_refused_before_the_host_changes(tmp_path, fresh, name, changes, named):
    ensure_deployed(tmp_path)
    unit = f"{name}.service"
    pid, unit_file = unit_property(unit, "MainPID"), on_host("cat", f"/etc/systemd/system/{unit}")
    rc, _stats, out = deploy(tmp_path, with_shape(tmp_path, name, {**shape_of(name), **changes}), limit=name)
    # Refused by the shape's own parser in the preflight: the key (with its file) and the law's words.
    key, reason = named.split(": ", 1)
    assert rc != 0 and f"endpoint_shape.{key} (" in out and reason in out, failures(out) or out[-3000:]
    assert unit_property(unit, "MainPID") == pid and on_host("cat", f"/etc/systemd/system/{unit}") == unit_file


@pytest.mark.parametrize(
    ("name", "changes", "fatal"),
    [
        # The driver cannot see the host's payload, so the stand-in flash-server refuses at boot.
        (HALOGEN, {"tokenizer_dir": "tokenizer-absent"}, "HALOGEN_TOKENIZER=/models/tokenizer-absent: no such directory"),
        # Without a declared pool_tokens the driver cannot count the pool: the engine refuses it.
        (RADIANCE, {"kv_cache_memory_bytes": "4 MiB", "pool_tokens": None}, "under one 4,096-token window"),
    ],
)
def test_a_shape_the_engine_refuses_at_boot_rolls_back_to_the_last_known_good(tmp_path, fresh, name, changes, fatal):
    ensure_deployed(tmp_path)
    unit = f"{name}.service"
    good = json.loads(on_host("cat", f"/var/lib/llm-fleet/{name}/last-good.json"))
    shape = {key: value for key, value in {**shape_of(name), **changes}.items() if value is not None}
    started = time.monotonic()
    rc, _stats, out = deploy(tmp_path, with_shape(tmp_path, name, shape), limit=name)
    assert rc != 0, out[-3000:]
    assert "the new shape failed" in out and "last-known-good shape is serving again" in out, failures(out)
    assert fatal in on_host("journalctl", "-u", unit, "--no-pager", "-n", "400"), "the stand-in's refusal is not in the unit's journal"
    # The good shape serves again, and its record is the one it was.
    assert unit_property(unit, "ActiveState") == "active"
    status, models, _seconds = on_port(PORTS[name], "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == [name]
    assert json.loads(on_host("cat", f"/var/lib/llm-fleet/{name}/last-good.json"))["shape"] == good["shape"]
    assert time.monotonic() - started < 300
    rc, stats, out = deploy(tmp_path, limit=name)
    assert rc == 0 and stats["changed"] == 0, failures(out) or out[-3000:]
