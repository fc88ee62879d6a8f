"""A served-id rename on the lab, as an operator does it: one inventory edit (frank-secondary's
endpoint_shape.served_id) and one run of playbooks/deploy_fleet.yml. In that run the engine
restarts answering the new id on /v1/models, the harness's models.yml fragment, OpenWebUI's
id-keyed rows (in the real database open-webui's own migrations build, backed up first) and the
homepage's card and model guide all move to it, and the browser gate crawls the result green.
Renaming back is the same edit and run, and moves everything back (seed 004: "harness id ==
served id; one id per model everywhere"; "re-key it in the same deploy").

The wire rename (the host frank-secondary renamed frank-zealot, the old unit retired) does the same
in one run, with the companions in its --limit: the unit, OpenWebUI's rows (the old id read from the
retired endpoint's kept record), the homepage, the fragments and the Prometheus jobs, rules and
Grafana dashboards the run writes (playbooks/observability.yml); the reverse edit returns them."""

from __future__ import annotations

import json
import os
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


# This change's playbooks around the fleet run, where companions.yml is to import them: the retired
# units' served ids before the OpenWebUI re-key, the Prometheus and Grafana files after. Until
# companions.yml imports them, the test runs them around deploy_fleet.yml itself.
FOLLOWERS = ("retired_served_ids.yml", "observability.yml")


def _fleet_run(tmp_path: Path) -> str:
    """deploy_fleet.yml as playbook() takes it, with the followers where companions.yml lacks them."""
    companions = (ROOT / "playbooks" / "companions.yml").read_text()
    if all(name in companions for name in FOLLOWERS):
        return "deploy_fleet.yml"
    wrapper = tmp_path / "deploy-fleet-followers.yml"
    imports = [FOLLOWERS[0], "deploy_fleet.yml", FOLLOWERS[1]]
    wrapper.write_text(yaml.safe_dump([{"name": f"Run {name}", "ansible.builtin.import_playbook": str(ROOT / "playbooks" / name)} for name in imports]))
    return os.path.relpath(wrapper, ROOT / "playbooks")


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


def _followers_name(tmp_path: Path, client_dir: Path, observability_dir: Path, new: str, old: str) -> None:
    """Everything that follows the served id names `new` and never `old`: OpenWebUI's trio (a backup
    taken first), the homepage's card and guide, the clients' fragments, and the Prometheus jobs,
    alert rules and Grafana dashboards the run wrote."""
    ids = _openwebui_ids(tmp_path / f"{new}.db")
    assert new in ids["model"] and old not in ids["model"] and ids["grants"] == [new] and ids["connections"] == [new], ids
    own = lab_addresses()[0]
    docs, index = _fetch(f"http://{own}:8088/docs"), _fetch(f"http://{own}:8088/")
    assert f'id="model-{new}"' in docs and f'id="model-{old}"' not in docs
    assert f"/docs#model-{new}" in index and f"/docs#model-{old}" not in index
    assert sorted(p.name for p in client_dir.iterdir()) == [f"{new}.models.yml"]
    assert [m["id"] for m in yaml.safe_load((client_dir / f"{new}.models.yml").read_text())["models"]] == [new]
    written = {p.relative_to(observability_dir).as_posix(): p.read_text() for p in observability_dir.rglob("*") if p.is_file()}
    assert f"prometheus/rules/{new}.rules.yml" in written and f"prometheus/rules/{old}.rules.yml" not in written, sorted(written)
    jobs = [job["job_name"] for job in yaml.safe_load(written["prometheus/prometheus.yml"])["scrape_configs"]]
    assert new in jobs and old not in jobs, jobs
    assert new in written["grafana/llamacpp.json"]
    for path, text in written.items():
        assert old not in text, path


def test_a_wire_rename_moves_the_endpoint_and_a_rollback_returns_to_the_old_name(tmp_path, wire_rename, openwebui_with_the_old_id):
    fleet = _fleet_run(tmp_path)
    client_dir, observability_dir = tmp_path / "client", tmp_path / "observability"
    where = {"fleet_client_dir": str(client_dir), "fleet_observability_dir": str(observability_dir)}
    # Before: frank-secondary serves under its own name, and everything that follows it names it.
    rc, _stats, out = playbook(tmp_path, fleet, limit=f"{OLD},openwebui,homepage", extra_vars=where)
    assert rc == 0, failures(out) or out[-3000:]
    assert served(PORT) == OLD
    assert (observability_dir / "prometheus" / "rules" / f"{OLD}.rules.yml").is_file()

    # The rename to the latest era's wire name: one inventory edit, one fleet run with the companions.
    renamed = _renamed_inventory(tmp_path / "renamed", OLD, NEW)
    rc, _stats, out = playbook(tmp_path, fleet, limit=f"{NEW},openwebui,homepage", inventory=renamed, extra_vars=where)
    assert rc == 0, failures(out) or out[-3000:]
    assert served(PORT) == NEW
    assert _unit_state(f"{NEW}.service") == ("enabled", "active")
    # The old unit is retired (stopped, archived, masked), its container gone: nothing answers
    # under the old name, and nothing that follows the served id names it.
    assert _unit_state(f"{OLD}.service") == ("masked", "inactive")
    assert on_host("sh", "-c", f"ls /var/lib/llm-fleet/archive/*/{OLD}.service")
    assert OLD not in on_host("podman", "ps", "--format", "{{.Names}}").split()
    _followers_name(tmp_path, client_dir, observability_dir, NEW, OLD)
    assert on_host("sh", "-c", f"ls {DB}.bak-* | wc -l") == "1"

    # The rollback to the old names is the reverse edit: frank-secondary again, frank-zealot retired.
    back = tmp_path / "back"
    inventory = back / "inventories" / "lab"
    shutil.copytree(LAB_INVENTORY, inventory)
    (back / ".lab").symlink_to(ROOT / ".lab")
    data = yaml.safe_load((inventory / "host_vars" / f"{OLD}.yml").read_text())
    (inventory / "host_vars" / f"{OLD}.yml").write_text(yaml.safe_dump({**data, "endpoint_retired_units": [f"{NEW}.service"]}))
    rc, _stats, out = playbook(tmp_path, fleet, limit=f"{OLD},openwebui,homepage", inventory=inventory, extra_vars=where)
    assert rc == 0, failures(out) or out[-3000:]
    assert served(PORT) == OLD
    assert _unit_state(f"{OLD}.service") == ("enabled", "active")
    assert _unit_state(f"{NEW}.service") == ("masked", "inactive")
    _followers_name(tmp_path, client_dir, observability_dir, OLD, NEW)
