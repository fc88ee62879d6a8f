"""A served-id rename on the lab, as an operator does it: one inventory edit (frank-secondary's
endpoint_shape.served_id) and one run of playbooks/deploy_fleet.yml. In that run the engine
restarts answering the new id on /v1/models, the harness's models.yml fragment, OpenWebUI's
id-keyed rows (in the real database open-webui's own migrations build, backed up first) and the
homepage's card and model guide all move to it, and the browser gate crawls the result green.
Renaming back is the same edit and run, and moves everything back (seed 004: "harness id ==
served id; one id per model everywhere"; "re-key it in the same deploy")."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from lab_host import (
    BIN,
    HOST,
    LAB_INVENTORY,
    ROOT,
    cli,
    env,
    failures,
    inventory_with_shape,
    lab_addresses,
    lab_shape,
    on_host,
    playbook,
    remove_endpoint,
    require_lab_host,
    served,
)

sys.path.insert(0, str(ROOT / "tests" / "unit"))
from openwebui_db import config_value, rows, seed_config, seed_connections, seed_model

pytestmark = pytest.mark.lab

require_lab_host()

OLD, NEW = "frank-secondary", "frank-zealot"
PORT = lab_shape(OLD)["port"]
DB = "/var/lib/open-webui/webui.db"
LIMIT = "frank-secondary,openwebui,homepage"


def _copy_db(source: str, dest: str) -> None:
    subprocess.run(["podman", "cp", source, dest], check=True, env=env(), capture_output=True)


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def _openwebui_ids(local: Path) -> dict[str, list]:
    _copy_db(f"{HOST}:{DB}", str(local))
    return {
        "model": [r[0] for r in rows(local, "SELECT id FROM model ORDER BY id")],
        "grants": [r[0] for r in rows(local, "SELECT DISTINCT resource_id FROM access_grant WHERE resource_type = 'model' ORDER BY 1")],
        "connections": config_value(local, "openai.api_configs")["0"]["model_ids"],
    }


@pytest.fixture
def openwebui_with_the_old_id(tmp_path, request):
    """OpenWebUI's database on the lab host with frank-secondary's model row, two grants and the
    connection listing it, as a user who set the model up would leave it. The database as it was
    comes back afterwards, and frank-secondary serves its own name again."""
    pristine = tmp_path / "pristine.db"
    _copy_db(f"{HOST}:{DB}", str(pristine))
    seeded = tmp_path / "seeded.db"
    seeded.write_bytes(pristine.read_bytes())
    seed_model(seeded, OLD, grants=(("user", "*", "read"), ("group", "ops", "write")))
    seed_connections(seeded, [OLD], [])
    seed_config(seeded, "ui.default_models", OLD)
    _copy_db(str(seeded), f"{HOST}:{DB}")

    def restore():
        try:
            playbook(tmp_path, "deploy_fleet.yml", limit=LIMIT, extra_vars={"fleet_client_dir": str(tmp_path / "client-restore")})
        finally:
            _copy_db(str(pristine), f"{HOST}:{DB}")
            on_host("sh", "-c", f"rm -f {DB}.bak-*")

    request.addfinalizer(restore)


def test_a_rename_is_one_inventory_edit_and_one_run(tmp_path, openwebui_with_the_old_id):
    client_dir = tmp_path / "client"
    # Before: the endpoint is deployed under its own name (the lab's state after the other tests).
    rc, _stats, out = playbook(tmp_path, "deploy_fleet.yml", limit=LIMIT, extra_vars={"fleet_client_dir": str(client_dir)})
    assert rc == 0, failures(out) or out[-3000:]
    assert served(PORT) == OLD

    inventory = inventory_with_shape(tmp_path, OLD, {**lab_shape(OLD), "served_id": NEW})
    gate_dir = tmp_path / "gate"
    rc, stats, out = playbook(
        tmp_path,
        "deploy_fleet.yml",
        limit=LIMIT,
        inventory=inventory,
        extra_vars={"fleet_client_dir": str(client_dir), "browser_gate_report_dir": str(gate_dir)},
    )
    assert rc == 0, failures(out) or out[-3000:]

    # The wire: verified on /v1/models, never on a chat answer (seed 004).
    assert served(PORT) == NEW
    # The harness's fragment.
    fragment = yaml.safe_load((client_dir / f"{OLD}.models.yml").read_text())
    assert [m["id"] for m in fragment["models"]] == [NEW]
    # OpenWebUI: the trio moved, and a backup was taken first.
    after = _openwebui_ids(tmp_path / "after.db")
    assert NEW in after["model"] and OLD not in after["model"]
    assert after["grants"] == [NEW]
    assert after["connections"] == [NEW]
    assert on_host("sh", "-c", f"ls {DB}.bak-* | wc -l") == "1"
    # The homepage: the card and the model guide name the new id only.
    own = lab_addresses()[0]
    docs = _fetch(f"http://{own}:8088/docs")
    index = _fetch(f"http://{own}:8088/")
    assert f'id="model-{NEW}"' in docs and f'id="model-{OLD}"' not in docs
    assert f"/docs#model-{NEW}" in index and f"/docs#model-{OLD}" not in index

    # The browser gate crawled the renamed homepage, its cards and the docs page in the same run.
    report = json.loads((gate_dir / "report.json").read_text())
    assert report["ok"] and report["links_total"] >= 2, report
    assert any(link["url"].endswith("/docs") or "/docs#" in link["url"] for link in report["links"]), report

    # A rerun of the same inventory changes nothing anywhere.
    rc, stats, out = playbook(tmp_path, "deploy_fleet.yml", limit=LIMIT, inventory=inventory, extra_vars={"fleet_client_dir": str(client_dir)})
    assert rc == 0 and stats["changed"] == 0, failures(out) or out[-3000:]
    assert on_host("sh", "-c", f"ls {DB}.bak-* | wc -l") == "1"

    # Renaming back is the same edit: every place follows again.
    rc, _stats, out = playbook(tmp_path, "deploy_fleet.yml", limit=LIMIT, extra_vars={"fleet_client_dir": str(client_dir)})
    assert rc == 0, failures(out) or out[-3000:]
    assert served(PORT) == OLD
    back = _openwebui_ids(tmp_path / "back.db")
    assert OLD in back["model"] and NEW not in back["model"] and back["grants"] == [OLD]
    assert sqlite3.connect(tmp_path / "back.db").execute("SELECT COUNT(*) FROM access_grant WHERE resource_id = ?", (OLD,)).fetchone()[0] == 2


def _renamed_inventory(root: Path, old: str, new: str) -> Path:
    """inventories/lab copied under root with endpoint `old` renamed `new` (the seeds' latest-era
    wire name): the host renamed in every group, its host_vars moved, its cache directory its own,
    and the old unit listed for retirement. This is the whole inventory edit of the rename."""
    inventory = root / "inventories" / "lab"
    shutil.copytree(LAB_INVENTORY, inventory)
    (root / ".lab").symlink_to(ROOT / ".lab")
    text = (inventory / "hosts.yml").read_text()
    (inventory / "hosts.yml").write_text(re.sub(rf"\b{old}:", f"{new}:", text))
    data = yaml.safe_load((inventory / "host_vars" / f"{old}.yml").read_text())
    (inventory / "host_vars" / f"{old}.yml").unlink()
    data["endpoint_container"] = {**data["endpoint_container"], "cache_dir": f"/var/cache/{new}"}
    data["endpoint_retired_units"] = [f"{old}.service"]
    (inventory / "host_vars" / f"{new}.yml").write_text(yaml.safe_dump(data))
    return inventory


def _unit_state(unit: str) -> tuple[str, str]:
    return on_host("systemctl", "is-enabled", unit, check=False), on_host("systemctl", "is-active", unit, check=False)


@pytest.fixture
def wire_rename(request):
    """frank-secondary serving under its own name before; afterwards the renamed units are gone,
    frank-secondary is unmasked and deployed as the lab inventory has it."""

    def restore():
        remove_endpoint(NEW)
        on_host("systemctl", "unmask", f"{OLD}.service", check=False)
        on_host("sh", "-c", f"rm -rf /var/lib/llm-fleet/archive/*/{NEW}.service* /var/lib/llm-fleet/archive/*/{OLD}.service*")
        on_host("find", "/var/lib/llm-fleet/archive", "-mindepth", "1", "-maxdepth", "1", "-type", "d", "-empty", "-delete", check=False)
        on_host("systemctl", "daemon-reload")
        subprocess.run([str(BIN / "ansible-playbook"), "playbooks/deploy_secondary.yml"], cwd=ROOT, env=env(), capture_output=True, check=False)

    request.addfinalizer(restore)


def test_a_wire_rename_moves_the_endpoint_and_a_rollback_returns_to_the_old_name(tmp_path, wire_rename):
    # Before: frank-secondary serves under its own name.
    rc, _stats, out = playbook(tmp_path, "deploy_fleet.yml", limit=OLD)
    assert rc == 0, failures(out) or out[-3000:]
    assert served(PORT) == OLD

    # The rename to the latest era's wire name: one inventory edit, one deploy_fleet run.
    renamed = _renamed_inventory(tmp_path / "renamed", OLD, NEW)
    rc, _stats, out = playbook(tmp_path, "deploy_fleet.yml", limit=NEW, inventory=renamed)
    assert rc == 0, failures(out) or out[-3000:]
    assert served(PORT) == NEW
    assert _unit_state(f"{NEW}.service") == ("enabled", "active")
    # The old unit is retired (stopped, archived, masked), its container gone: nothing answers
    # under the old name, and the generated scrape jobs, rules and client fragments name the new one.
    assert _unit_state(f"{OLD}.service") == ("masked", "inactive")
    assert on_host("sh", "-c", f"ls /var/lib/llm-fleet/archive/*/{OLD}.service")
    assert OLD not in on_host("podman", "ps", "--format", "{{.Names}}").split()
    generated = tmp_path / "generated"
    proc = cli("generate", "-i", str(renamed), "-o", str(generated))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for folder in ("prometheus", "client"):
        texts = "\n".join(path.read_text() for path in (generated / folder).rglob("*") if path.is_file())
        assert NEW in texts and OLD not in texts, folder

    # The rollback to the old names is the reverse edit: frank-secondary again, frank-zealot retired.
    back = tmp_path / "back"
    inventory = back / "inventories" / "lab"
    shutil.copytree(LAB_INVENTORY, inventory)
    (back / ".lab").symlink_to(ROOT / ".lab")
    data = yaml.safe_load((inventory / "host_vars" / f"{OLD}.yml").read_text())
    (inventory / "host_vars" / f"{OLD}.yml").write_text(yaml.safe_dump({**data, "endpoint_retired_units": [f"{NEW}.service"]}))
    rc, _stats, out = playbook(tmp_path, "deploy_fleet.yml", limit=OLD, inventory=inventory)
    assert rc == 0, failures(out) or out[-3000:]
    assert served(PORT) == OLD
    assert _unit_state(f"{OLD}.service") == ("enabled", "active")
    assert _unit_state(f"{NEW}.service") == ("masked", "inactive")
