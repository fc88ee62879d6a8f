"""Retirement on a fake host: a retired endpoint's firewall goes with its unit (the table deleted,
the rules file archived beside the unit), and a unit the collection wrote for an endpoint the
inventory renamed is found from the kept records and retired without being listed."""

from __future__ import annotations

import sys

import pytest
from fake_host import SYSTEMCTL, FakeRunner, show

from ansible_collections.frank.llm_fleet.plugins.module_utils.host import firewall
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.firewall import Firewall, render_nft
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

RUNNING = show(LoadState="loaded", ActiveState="active", UnitFileState="enabled", NRestarts=0)
OLD = "frank-old"
TABLE = "llm_fleet_frank_old"


@pytest.fixture
def nft(tmp_path, monkeypatch):
    """An nft binary that exists (the fake runner answers for it) and the rules directory."""
    binary = tmp_path / "nft"
    binary.write_text("")
    rules = tmp_path / "etc-llm-fleet"
    rules.mkdir()
    monkeypatch.setattr(firewall, "nft_binary", lambda: str(binary))
    monkeypatch.setattr(firewall, "FIREWALL_DIR", str(rules))
    return str(binary), rules


def unit(tmp_path, name="frank-new.service", **overrides):
    return {"name": name, "command": [sys.executable, "-m", "http.server"], "unit_dir": str(tmp_path / "units"), "env_dir": str(tmp_path / "env"), **overrides}


def runner_with_table(binary, live=True):
    listed = (0, f"table inet {TABLE} {{\n}}\n", "") if live else (1, "", "Error: No such file or directory")
    return FakeRunner({(SYSTEMCTL, "show"): [RUNNING], (binary, "list", "table", "inet", TABLE): [listed]})


def old_lan_endpoint(tmp_path, rules):
    units = tmp_path / "units"
    units.mkdir(exist_ok=True)
    (units / f"{OLD}.service").write_text(f"[Service]\nExecStartPre=+/usr/sbin/nft -f /etc/llm-fleet/{OLD}.nft\nExecStart=/usr/bin/llama-server\n")
    (rules / f"{OLD}.nft").write_text(render_nft(Firewall(OLD, 7771, ("192.168.0.0/24",))))


def test_a_retired_lan_endpoint_loses_its_table_and_its_rules_file_moves_to_the_archive(tmp_path, nft):
    binary, rules = nft
    old_lan_endpoint(tmp_path, rules)
    runner = runner_with_table(binary)
    params = {"unit": unit(tmp_path), "record_dir": str(tmp_path / "state" / "frank-new"), "retire_units": [f"{OLD}.service"]}
    retired = deploy_endpoint(params, Host(runner), diff=False)["steps"]["retire"]["units"][0]
    assert retired["state"] == "retired" and retired["firewall"]["table_deleted"] is True
    assert [binary, "delete", "table", "inet", TABLE] in runner.calls
    archived = retired["firewall"]["file_archived_to"]
    assert archived.startswith(str(tmp_path / "state" / "archive")) and archived.endswith(f"/{OLD}.nft")
    assert not (rules / f"{OLD}.nft").exists()
    with open(archived, encoding="utf-8") as handle:
        assert "tcp dport 7771" in handle.read()
    # Masked, the table gone, the file archived: a rerun has nothing left to do.
    (tmp_path / "units" / f"{OLD}.service").symlink_to("/dev/null")
    again = deploy_endpoint(params, Host(runner_with_table(binary, live=False)), diff=False)["steps"]["retire"]
    assert again["units"][0] == {"unit": f"{OLD}.service", "changed": False, "state": "masked"} and not again["changed"]


def test_a_unit_retired_before_firewalls_were_has_its_table_removed_by_the_next_deploy(tmp_path, nft):
    binary, rules = nft
    old_lan_endpoint(tmp_path, rules)
    (tmp_path / "units" / f"{OLD}.service").unlink()
    (tmp_path / "units" / f"{OLD}.service").symlink_to("/dev/null")  # retired and masked, its table left live
    runner = runner_with_table(binary)
    params = {"unit": unit(tmp_path), "record_dir": str(tmp_path / "state" / "frank-new"), "retire_units": [f"{OLD}.service"]}
    retire = deploy_endpoint(params, Host(runner), diff=False)["steps"]["retire"]
    assert retire["changed"] and retire["units"][0]["state"] == "masked" and retire["units"][0]["firewall"]["table_deleted"]
    assert [binary, "delete", "table", "inet", TABLE] in runner.calls


def test_check_mode_names_the_table_and_file_it_would_retire_and_touches_nothing(tmp_path, nft):
    binary, rules = nft
    old_lan_endpoint(tmp_path, rules)
    host = Host(runner_with_table(binary), check_mode=True)
    params = {"unit": unit(tmp_path), "record_dir": str(tmp_path / "state" / "frank-new"), "retire_units": [f"{OLD}.service"]}
    deploy_endpoint(params, host, diff=False)
    assert f"{binary} delete table inet {TABLE}" in host.actions
    assert any(action.startswith(f"move {rules}/{OLD}.nft ") for action in host.actions)
    assert (rules / f"{OLD}.nft").exists() and (tmp_path / "units" / f"{OLD}.service").is_file()


def test_a_rules_file_the_collection_did_not_write_stays_where_it_is(tmp_path, nft):
    binary, rules = nft
    old_lan_endpoint(tmp_path, rules)
    (rules / f"{OLD}.nft").write_text("table inet mine { }\n")  # a hand-written file of that name
    params = {"unit": unit(tmp_path), "record_dir": str(tmp_path / "state" / "frank-new"), "retire_units": [f"{OLD}.service"]}
    retired = deploy_endpoint(params, Host(runner_with_table(binary, live=False)), diff=False)["steps"]["retire"]["units"][0]
    assert "firewall" not in retired and (rules / f"{OLD}.nft").read_text() == "table inet mine { }\n"


def test_an_endpoint_cannot_retire_its_own_unit(tmp_path):
    params = {"unit": unit(tmp_path), "record_dir": str(tmp_path / "state" / "frank-new"), "retire_units": ["frank-new.service"]}
    with pytest.raises(StepError, match=r"retire_units: frank-new.service is this endpoint's own unit"):
        deploy_endpoint(params, Host(FakeRunner()), diff=False)
