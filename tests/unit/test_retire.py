"""Retirement on a fake host: a retired endpoint's firewall goes with its unit (the table deleted,
the rules file archived beside the unit), and a unit the collection wrote for an endpoint the
inventory renamed is found from the kept records and retired without being listed."""

from __future__ import annotations

import json
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


# --- a renamed endpoint's old unit, found from the kept records ----------------------------------

HEADER = "# Managed by frank.llm_fleet.systemd_root_unit; local edits are replaced on the next deploy.\n"


def kept_endpoint(tmp_path, name, port, header=True, record=True):
    """An endpoint the collection deployed earlier: its unit file (with the collection's header or
    without it) and its kept record under the state directory; a native engine under a user of its
    own (one it shared with the deploying endpoint would be refused: test_engine_uids)."""
    units = tmp_path / "units"
    units.mkdir(exist_ok=True)
    (units / f"{name}.service").write_text((HEADER if header else "") + "[Service]\nExecStart=/usr/bin/llama-server\n")
    if record:
        directory = tmp_path / "state" / name
        directory.mkdir(parents=True, exist_ok=True)
        kept = {"shape": {"port": port, "served_id": name}, "unit": {"name": f"{name}.service", "user": name, "health": {"port": port}}, "engine": None}
        (directory / "last-good.json").write_text(json.dumps(kept))


def renamed_params(tmp_path, **extra):
    return {"unit": unit(tmp_path, "frank-zealot.service"), "shape": {"port": 7771}, "record_dir": str(tmp_path / "state" / "frank-zealot"), **extra}


def test_a_renamed_endpoints_old_unit_is_found_by_its_port_and_retired_without_being_listed(tmp_path):
    kept_endpoint(tmp_path, "frank-secondary", 7771)  # the old name, on the port the new one serves
    kept_endpoint(tmp_path, "frank-primary", 7770)  # another endpoint of this host: left alone
    runner = FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})
    retire = deploy_endpoint(renamed_params(tmp_path), Host(runner), diff=False)["steps"]["retire"]
    [retired] = retire["units"]
    assert retired["unit"] == "frank-secondary.service" and retired["state"] == "retired"
    assert "serves port 7771, this endpoint's" in retired["found"] and "state/frank-secondary/last-good.json" in retired["found"]
    assert retired["archived_to"].startswith(str(tmp_path / "state" / "archive"))
    assert [SYSTEMCTL, "mask", "frank-secondary.service"] in runner.calls
    assert not [argv for argv in runner.calls if "frank-primary.service" in argv]
    assert (tmp_path / "units" / "frank-primary.service").is_file() and "orphans" not in retire
    # The record of the old name stays: rollbacks and the OpenWebUI re-key read it.
    assert (tmp_path / "state" / "frank-secondary" / "last-good.json").is_file()
    # Masked now: the next deploy finds nothing to retire.
    (tmp_path / "units" / "frank-secondary.service").symlink_to("/dev/null")
    again = deploy_endpoint(renamed_params(tmp_path), Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})), diff=False)["steps"]["retire"]
    assert again["units"] == [] and not again["changed"]


def test_check_mode_shows_the_renamed_unit_it_would_retire(tmp_path):
    kept_endpoint(tmp_path, "frank-secondary", 7771)
    host = Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]}), check_mode=True)
    retire = deploy_endpoint(renamed_params(tmp_path), host, diff=False)["steps"]["retire"]
    assert retire["changed"] and retire["units"][0]["unit"] == "frank-secondary.service" and retire["units"][0]["found"]
    assert any(action.startswith(f"move {tmp_path}/units/frank-secondary.service ") for action in host.actions)
    assert (tmp_path / "units" / "frank-secondary.service").is_file() and not (tmp_path / "state" / "archive").exists()


@pytest.mark.parametrize(
    ("case", "header", "record"),
    [("a unit the collection did not write (no header)", False, True), ("a unit no kept record names", True, False)],
)
def test_a_unit_the_collection_did_not_write_or_keep_is_never_retired(tmp_path, case, header, record):
    kept_endpoint(tmp_path, "frank-secondary", 7771, header=header, record=record)
    if not record:  # a record of another name that points elsewhere does not make it ours either
        kept_endpoint(tmp_path, "frank-other", 7771, record=True)
        (tmp_path / "units" / "frank-other.service").unlink()
    runner = FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})
    retire = deploy_endpoint(renamed_params(tmp_path), Host(runner), diff=False)["steps"]["retire"]
    assert retire["units"] == [], case
    assert not [argv for argv in runner.calls if "frank-secondary.service" in argv], case


def test_an_orphan_on_another_port_is_reported_when_the_hosts_units_are_given_and_retire_renamed_can_be_off(tmp_path):
    kept_endpoint(tmp_path, "frank-secondary", 7771)
    kept_endpoint(tmp_path, "frank-gone", 7790)  # no endpoint of the inventory names it any more
    kept_endpoint(tmp_path, "frank-primary", 7770)
    off = deploy_endpoint(renamed_params(tmp_path, retire_renamed=False), Host(FakeRunner()), diff=False)["steps"]["retire"]
    assert off["units"] == [] and (tmp_path / "units" / "frank-secondary.service").is_file()
    result = deploy_endpoint(renamed_params(tmp_path, host_units=["frank-zealot.service", "frank-primary.service"]), Host(FakeRunner()), diff=False)
    retire = result["steps"]["retire"]
    assert [u["unit"] for u in retire["units"]] == ["frank-secondary.service"]
    assert [o["unit"] for o in retire["orphans"]] == ["frank-gone.service"]
    assert any("frank-gone.service" in w and "endpoint_retired_units" in w for w in result["warnings"])
    assert (tmp_path / "units" / "frank-gone.service").is_file()
