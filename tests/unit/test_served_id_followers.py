"""What follows a host (wire) rename in the same fleet run (issue 28): the endpoint renamed in the
inventory (the host frank-secondary becomes frank-zealot, the old unit in endpoint_retired_units)
starts with records of its own, so the old served id is read from the retired endpoint's kept
record (playbooks/retired_served_ids.yml, filter retired_served_ids) and OpenWebUI's rows move
from it; Prometheus's jobs and rules and Grafana's dashboards are written in the run
(playbooks/observability.yml, filter observability_files), the same bytes `llm-fleet generate`
writes. The reverse edit returns everything."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from openwebui_db import config_value, rows, seed_config, seed_connections, seed_model

from ansible_collections.frank.llm_fleet.plugins.filter.fleet_site import fleet_endpoints, observability_files, served_id_renames
from ansible_collections.frank.llm_fleet.plugins.plugin_utils import served_ids
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.fleet_artifacts import exported_series, facts_from_hostvars, generate, serialise

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SECONDARY = {
    "runtime": "llamacpp",
    "port": 7771,
    "model_file": "m.gguf",
    "ctx_size": 8192,
    "parallel": 2,
    "model_geometry": {"n_layer": 2, "n_head_kv": 2, "head_dim": 32},
}
PRIMARY = {"runtime": "vllm", "port": 7770, "model_file": ".", "max_model_len": 4096, "max_num_seqs": 2, "kv_cache_memory_bytes": "64 MiB"}


def read_of(unit: str, record) -> dict:
    """One slurp result under the loop, as Ansible registers it."""
    text = record if isinstance(record, (str, bytes)) else json.dumps(record)
    raw = text if isinstance(text, bytes) else text.encode()
    return {"item": unit, "content": base64.b64encode(raw).decode(), "encoding": "base64", "failed": False}


def test_the_retired_units_records_give_their_last_served_ids():
    reads = [
        read_of("frank-secondary.service", {"shape": {"served_id": "frank-secondary", "runtime": "llamacpp"}}),
        {"item": "frank-small.service", "failed": False, "msg": "file not found: /var/lib/llm-fleet/frank-small/last-good.json"},
        read_of("frank-large.service", "not json"),
        read_of("frank-medium.service", {"shape": {"runtime": "vllm"}}),
        read_of("frank-huge.service", b"{" + b" " * served_ids.MAX_RECORD_BYTES + b"}"),
        read_of("frank-again.service", {"shape": {"served_id": "frank-secondary"}}),
    ]
    ids, notes = served_ids.retired_served_ids(reads)
    assert ids == ["frank-secondary"]
    # A unit with no record says nothing; the others are named, with why.
    assert [note.split(":", 1)[0] for note in notes] == ["frank-large.service", "frank-medium.service", "frank-huge.service"]
    assert "no served id (shape.served_id)" in notes[1] and "over 1,048,576" in notes[2]
    assert served_ids.record_path("/var/lib/llm-fleet/", "frank-secondary.service") == "/var/lib/llm-fleet/frank-secondary/last-good.json"


def hostvars(**hosts):
    return {name: {"ansible_host": "lab-host", **hv} for name, hv in hosts.items()}


def test_a_host_rename_moves_the_old_id_the_retired_record_names_and_the_reverse_edit_moves_it_back():
    renamed = hostvars(
        **{
            # The renamed host: a fresh record directory, so its own records name only its new id.
            "frank-zealot": {"endpoint_shape": SECONDARY, "__endpoint_deploy": {"generations": [{"served_id": "frank-zealot"}]}},
            "frank-primary": {"endpoint_shape": PRIMARY},
        }
    )
    assert served_id_renames(fleet_endpoints(["frank-zealot", "frank-primary"], renamed)) == []  # before: nothing to follow
    renamed["frank-zealot"]["__fleet_retired_served_ids"] = ["frank-secondary"]
    assert served_id_renames(fleet_endpoints(["frank-zealot", "frank-primary"], renamed)) == [{"from": "frank-secondary", "to": "frank-zealot"}]
    # The rollback: frank-secondary again, frank-zealot's unit retired; its records also name the
    # new id from the earlier era (renamed twice): one rename, not two.
    back = hostvars(
        **{
            "frank-secondary": {
                "endpoint_shape": SECONDARY,
                "__endpoint_deploy": {"generations": [{"served_id": "frank-secondary"}, {"served_id": "frank-zealot"}]},
                "__fleet_retired_served_ids": ["frank-zealot"],
            },
            "frank-primary": {"endpoint_shape": PRIMARY},
        }
    )
    assert served_id_renames(fleet_endpoints(["frank-secondary", "frank-primary"], back)) == [{"from": "frank-zealot", "to": "frank-secondary"}]
    # An id another endpoint serves now went with it: it is never renamed away.
    renamed["frank-primary"]["endpoint_shape"] = {**PRIMARY, "served_id": "frank-secondary"}
    assert served_id_renames(fleet_endpoints(["frank-zealot", "frank-primary"], renamed)) == []


def lab_hostvars(names: dict[str, dict]) -> dict:
    return hostvars(**{name: {"endpoint_shape": shape} for name, shape in names.items()})


def test_the_observability_files_are_what_llm_fleet_generate_writes_and_follow_a_host_rename():
    hv = lab_hostvars({"frank-primary": PRIMARY, "frank-zealot": SECONDARY})
    files = observability_files(fleet_endpoints(["frank-primary", "frank-zealot"], hv))
    exported = exported_series(str(ROOT / "observability" / "exported"))
    generated = generate([facts_from_hostvars(name, hv[name]) for name in ("frank-primary", "frank-zealot")], exported, "lab").files
    expected = {path: serialise(value).decode() for path, value in generated.items() if path.startswith(("prometheus/", "grafana/"))}
    assert files == expected
    assert sorted(files) == [
        "grafana/llamacpp.json",
        "grafana/vllm.json",
        "prometheus/prometheus.yml",
        "prometheus/rules/frank-primary.rules.yml",
        "prometheus/rules/frank-zealot.rules.yml",
    ]
    jobs = [job["job_name"] for job in yaml.safe_load(files["prometheus/prometheus.yml"])["scrape_configs"]]
    assert jobs == ["frank-primary", "frank-zealot", "llm-fleet-node"]
    assert "frank-secondary" not in "".join(files.values())


def test_a_failed_series_check_fails_the_filter_so_nothing_is_written(monkeypatch):
    # The generator's own check (a rule or panel naming a series the runtime does not export) is
    # tests/unit/test_observability.py's; here: the filter refuses to hand such files on.
    from ansible_collections.frank.llm_fleet.plugins.filter import fleet_site
    from ansible_collections.frank.llm_fleet.plugins.plugin_utils.fleet_artifacts import Artifacts

    made = Artifacts(files={"prometheus/prometheus.yml": {}}, problems=["llm-fleet-frank-zealot/FrankZealotMade: names series llamacpp does not export: x"])
    monkeypatch.setattr(fleet_site, "observability_artifacts", lambda endpoints, exported: made)
    with pytest.raises(AnsibleFilterError, match=r"^observability: the series check failed, nothing is written: llm-fleet-frank-zealot/FrankZealotMade: "):
        observability_files(fleet_endpoints(["frank-zealot"], lab_hostvars({"frank-zealot": SECONDARY})))


def _inventory(root: Path, endpoint: str, retired: str | None, db: Path, tmp: Path) -> Path:
    """A fleet of two endpoints and OpenWebUI, all on this machine (local connection): `endpoint`
    the llama.cpp one, retiring `retired`'s unit when given. Only the companions run against it."""
    inventory = root / "inventory"
    (inventory / "host_vars").mkdir(parents=True)
    common = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "endpoint_state_dir": str(tmp / "state"),
        "fleet_observability_dir": str(tmp / "observability"),
        "fleet_client_dir": str(tmp / "client"),
    }
    hosts = {
        "llm_endpoints": {"hosts": {endpoint: None, "frank-primary": None}},
        "openwebui_services": {"hosts": {"openwebui": {"openwebui_models_db_path": str(db)}}},
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"vars": common, "children": hosts}}))
    mine = {"endpoint_shape": SECONDARY, **({"endpoint_retired_units": [f"{retired}.service"]} if retired else {})}
    (inventory / "host_vars" / f"{endpoint}.yml").write_text(yaml.safe_dump(mine))
    (inventory / "host_vars" / "frank-primary.yml").write_text(yaml.safe_dump({"endpoint_shape": PRIMARY}))
    return inventory


def _record(tmp: Path, endpoint: str) -> None:
    """The last-known-good record a deploy of `endpoint` leaves (host/records.py; only what is read here)."""
    record = tmp / "state" / endpoint / "last-good.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"shape": {**SECONDARY, "served_id": endpoint}, "unit": {"name": f"{endpoint}.service"}}))


def _run(tmp: Path, inventory: Path) -> tuple[int, dict, str]:
    """The companions as deploy_fleet.yml runs them, with this change's two playbooks where
    companions.yml is to import them (until it does)."""
    play = tmp / "fleet-followers.yml"
    companions = (ROOT / "playbooks" / "companions.yml").read_text()
    imports = ["companions.yml"] if "retired_served_ids.yml" in companions else ["retired_served_ids.yml", "companions.yml", "observability.yml"]
    play.write_text(yaml.safe_dump([{"name": f"Run {name}", "ansible.builtin.import_playbook": str(ROOT / "playbooks" / name)} for name in imports]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "PATH": f"{BIN}:{os.environ['PATH']}"}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(play)], capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    changed = sum(stats.get("changed", 0) for stats in out["stats"].values())
    return proc.returncode, {"changed": changed}, proc.stdout + proc.stderr


def _everything_names(tmp: Path, db: Path, old: str, new: str) -> None:
    """OpenWebUI's trio, the fragments and the observability files name `new` only."""
    assert [r[0] for r in rows(db, "SELECT id FROM model ORDER BY id")] == [new]
    assert [r[0] for r in rows(db, "SELECT DISTINCT resource_id FROM access_grant WHERE resource_type = 'model'")] == [new]
    assert config_value(db, "openai.api_configs")["0"]["model_ids"] == [new]
    assert config_value(db, "ui.default_models") == new
    assert sorted(p.name for p in (tmp / "client").iterdir()) == ["frank-primary.models.yml", f"{new}.models.yml"]
    generated = {p.relative_to(tmp / "observability").as_posix(): p.read_text() for p in (tmp / "observability").rglob("*") if p.is_file()}
    assert f"prometheus/rules/{new}.rules.yml" in generated and f"prometheus/rules/{old}.rules.yml" not in generated
    for path, text in {**generated, **{p.name: p.read_text() for p in (tmp / "client").iterdir()}}.items():
        assert old not in text, path
    jobs = [job["job_name"] for job in yaml.safe_load(generated["prometheus/prometheus.yml"])["scrape_configs"]]
    assert new in jobs and old not in jobs


@pytest.mark.slow
def test_a_host_rename_moves_openwebui_fragments_and_observability_in_one_run_and_back(tmp_path, openwebui_db):
    old, new = "frank-secondary", "frank-zealot"
    seed_model(openwebui_db, old, grants=(("user", "*", "read"), ("group", "ops", "write")))
    seed_connections(openwebui_db, [old])
    seed_config(openwebui_db, "ui.default_models", old)
    # Before: the fleet as it ran, frank-secondary deployed (its record kept), its files written.
    _record(tmp_path, old)
    rc, _stats, out = _run(tmp_path, _inventory(tmp_path / "before", old, None, openwebui_db, tmp_path))
    assert rc == 0, out[-4000:]
    assert (tmp_path / "observability" / "prometheus" / "rules" / f"{old}.rules.yml").is_file()

    # The rename: the host renamed, the old unit retired. One run moves everything.
    _record(tmp_path, new)  # what the renamed endpoint's own deploy (deploy.yml) records in this run
    renamed = _inventory(tmp_path / "renamed", new, old, openwebui_db, tmp_path)
    rc, _stats, out = _run(tmp_path, renamed)
    assert rc == 0, out[-4000:]
    _everything_names(tmp_path, openwebui_db, old, new)
    backups = sorted(openwebui_db.parent.glob("webui.db.bak-*"))
    assert len(backups) == 1
    # A rerun changes nothing, and takes no second backup.
    rc, stats, out = _run(tmp_path, renamed)
    assert rc == 0 and stats["changed"] == 0, out[-4000:]
    assert sorted(openwebui_db.parent.glob("webui.db.bak-*")) == backups

    # The rollback is the reverse edit: frank-secondary again, frank-zealot's unit retired.
    rc, _stats, out = _run(tmp_path, _inventory(tmp_path / "back", old, new, openwebui_db, tmp_path))
    assert rc == 0, out[-4000:]
    _everything_names(tmp_path, openwebui_db, new, old)


def test_the_records_are_read_where_the_endpoint_role_keeps_them():
    # retired_served_ids.yml runs outside the role, so it repeats the role's default state directory.
    role = yaml.safe_load((ROOT / "roles" / "endpoint" / "defaults" / "main.yml").read_text())["endpoint_state_dir"]
    (read, _keep) = yaml.safe_load((ROOT / "playbooks" / "retired_served_ids.yml").read_text())[0]["tasks"]
    assert f"endpoint_state_dir | default('{role}')" in read["ansible.builtin.slurp"]["src"]
    assert read["ansible.builtin.slurp"]["src"].endswith(f"/{served_ids.RECORD_FILE}")
