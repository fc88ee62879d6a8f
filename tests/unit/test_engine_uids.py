"""One UID per engine on a host. Containers: engine_uid hashes a name into 20,000 UIDs, so two names
can draw the same one (frank-e18406 draws frank-primary's 46790; lab-node1 and lab-node47 share
41474). A deploy refuses an engine whose UID another installed engine of the host runs as, naming
both and a free UID; the inventories' engines have none in common per host."""

from __future__ import annotations

import json
import pwd
import sys
from pathlib import Path

import pytest
import yaml
from fake_host import FakeRunner

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import check_engine_uid, deploy_endpoint
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.podman_engine import engine_uid, free_engine_uid, uid_collisions
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

ROOT = Path(__file__).resolve().parents[2]


class _Inventory(yaml.SafeLoader):
    """An inventory file as YAML: a vaulted value is an opaque string here."""


_Inventory.add_constructor("!vault", lambda loader, node: loader.construct_scalar(node))
HEADER = "# Managed by frank.llm_fleet.systemd_root_unit; local edits are replaced on the next deploy.\n"


def test_two_names_can_hash_to_one_uid_and_a_given_user_settles_it():
    assert engine_uid("frank-primary") == engine_uid("frank-e18406") == 46790
    assert engine_uid("lab-node1") == engine_uid("lab-node47") == 41474
    assert uid_collisions({"frank-primary": "", "frank-e18406": ""}) == [("frank-e18406", "frank-primary", 46790)]
    assert uid_collisions({"frank-primary": "", "frank-e18406": "40001:40001"}) == []
    assert uid_collisions({"a": "40001:40001", "b": "40001:40002"}) == [("a", "b", 40001)]
    assert free_engine_uid({46790, 46791}, "frank-primary") == 46792


def installed(tmp_path, name, user="", unit_file=True, port=7770):
    """Another endpoint on the host: its kept record (engine and unit) and its unit file."""
    record = tmp_path / "state" / name / "last-good.json"
    record.parent.mkdir(parents=True)
    engine = {"name": name, **({"user": user} if user else {})}
    record.write_text(json.dumps({"shape": {"port": port}, "engine": engine, "unit": {"name": f"{name}.service"}}))
    if unit_file:
        (tmp_path / "units").mkdir(exist_ok=True)
        (tmp_path / "units" / f"{name}.service").write_text(HEADER)


def params(tmp_path, name="frank-e18406", **engine):
    unit = {"name": f"{name}.service", "command": [sys.executable], "unit_dir": str(tmp_path / "units"), "env_dir": str(tmp_path / "env")}
    return {"unit": unit, "engine": {"name": name, **engine}, "shape": {"port": 7799}, "record_dir": str(tmp_path / "state" / name)}


def test_a_second_engine_with_an_installed_engines_uid_is_refused_before_the_host_changes(tmp_path):
    installed(tmp_path, "frank-primary")
    host = Host(FakeRunner())
    with pytest.raises(
        StepError,
        match=r"endpoint_container.user: frank-e18406 would run as UID 46790, the UID its name hashes to \(engine_uid\), which frank-primary "
        r"\(kept record .*/state/frank-primary/last-good.json\) already runs as on this host: .* e.g. endpoint_container.user: '46791:46791'",
    ):
        deploy_endpoint(params(tmp_path), host, diff=False)
    assert host.actions == []


@pytest.mark.parametrize(
    ("case", "mine", "theirs", "unit_file"),
    [
        ("a UID given to the new engine", {"user": "40001:40001"}, "", True),
        ("a UID given to the installed engine", {}, "40002:40002", True),
        ("the other endpoint's unit is gone (retired)", {}, "", False),
    ],
)
def test_no_refusal_when_the_uids_differ_or_the_other_engine_is_not_installed(tmp_path, case, mine, theirs, unit_file):
    installed(tmp_path, "frank-primary", theirs, unit_file)
    given = params(tmp_path, **mine)
    assert check_engine_uid(given, given["engine"]) is None, case


@pytest.mark.parametrize("inventory", ["production", "lab", "example", "lab-standins"])
def test_no_two_container_engines_of_one_host_in_the_inventories_share_a_uid(inventory):
    root = ROOT / "inventories" / inventory
    hosts = yaml.load((root / "hosts.yml").read_text(), Loader=_Inventory)
    endpoints = (hosts["all"]["children"].get("llm_endpoints") or {}).get("hosts") or {}
    by_host: dict[str, dict[str, str]] = {}
    for name, host_vars in endpoints.items():
        path = root / "host_vars" / f"{name}.yml"
        data = {**(host_vars or {}), **(yaml.load(path.read_text(), Loader=_Inventory) if path.exists() else {})}
        user = str((data.get("endpoint_container") or {}).get("user") or "")
        by_host.setdefault(str(data.get("ansible_host", name)), {})[name] = user
    assert endpoints, inventory
    for machine, engines in by_host.items():
        assert uid_collisions(engines) == [], (inventory, machine)


def installed_native(tmp_path, name, user="", port=7770):
    """Another endpoint on the host whose engine runs natively: its kept record has no engine, and
    its unit's User= is `user` (none: root)."""
    record = tmp_path / "state" / name / "last-good.json"
    record.parent.mkdir(parents=True)
    unit = {"name": f"{name}.service", **({"user": user} if user else {})}
    record.write_text(json.dumps({"shape": {"port": port}, "engine": None, "unit": unit}))
    (tmp_path / "units").mkdir(exist_ok=True)
    (tmp_path / "units" / f"{name}.service").write_text(HEADER)


def native_params(tmp_path, name="frank-zealot", user="", **extra):
    given = params(tmp_path, name)
    given["engine"] = None
    if user:
        given["unit"]["user"] = user
    return {**given, **extra}


@pytest.mark.parametrize(
    ("mine", "theirs", "shown"),
    [
        ("", "", r"root, its unit having no User= \(endpoint_user empty\)"),
        ("nobody", "nobody", rf"UID {pwd.getpwnam('nobody').pw_uid}, its unit's User=nobody \(endpoint_user\)"),
        ("llm-not-on-this-host", "llm-not-on-this-host", r"user llm-not-on-this-host, its unit.s User=llm-not-on-this-host \(endpoint_user\)"),
    ],
)
def test_two_native_engines_of_one_user_are_refused_before_the_host_changes(tmp_path, mine, theirs, shown):
    installed_native(tmp_path, "frank-large", theirs)
    host = Host(FakeRunner())
    with pytest.raises(
        StepError,
        match=rf"endpoint_user: frank-zealot would run as .*{shown}, which frank-large \(kept record .*/state/frank-large/last-good.json\) "
        r"already runs as on this host: .* e.g. endpoint_user: a system user only frank-zealot runs as",
    ):
        deploy_endpoint(native_params(tmp_path, user=mine), host, diff=False)
    assert host.actions == []


@pytest.mark.parametrize(
    ("case", "mine", "theirs", "extra", "port"),
    [
        ("users of their own", "nobody", "root", {}, 7770),
        ("root and a service user (molecule's fleet host)", "", "nobody", {}, 7770),
        ("the old unit of a rename, which this deploy retires", "nobody", "nobody", {}, 7799),
        ("a unit this deploy retires by name", "nobody", "nobody", {"retire_units": ["frank-large.service"]}, 7770),
    ],
)
def test_no_refusal_for_native_engines_of_different_users_or_a_unit_this_deploy_retires(tmp_path, case, mine, theirs, extra, port):
    installed_native(tmp_path, "frank-large", theirs, port)
    given = native_params(tmp_path, user=mine, **extra)
    assert check_engine_uid(given, given["engine"]) is None, case


def test_a_native_engine_and_a_container_of_one_uid_are_refused(tmp_path):
    """UIDs are one space: a container given nobody's UID and a native engine running as nobody."""
    nobody = pwd.getpwnam("nobody").pw_uid
    installed(tmp_path, "frank-dragoon", f"{nobody}:{nobody}")
    given = native_params(tmp_path, user="nobody")
    with pytest.raises(StepError, match=rf"endpoint_user: frank-zealot would run as UID {nobody}, .* which frank-dragoon"):
        check_engine_uid(given, given["engine"])


def test_a_renamed_container_keeps_the_uid_it_was_given(tmp_path):
    """The old name's unit serves this endpoint's port, so this deploy retires it: no clash."""
    installed(tmp_path, "frank-old-name", "40001:40001", port=7799)
    given = params(tmp_path, "frank-new-name", user="40001:40001")
    assert check_engine_uid(given, given["engine"]) is None


def test_the_user_systemd_runs_a_native_unit_as_is_the_one_judged(tmp_path):
    """A numeric User= is that UID; endpoint_unit_extra's User= is the later line, so systemd's."""
    nobody = pwd.getpwnam("nobody").pw_uid
    installed_native(tmp_path, "frank-large", "nobody")
    given = native_params(tmp_path, user=str(nobody))
    with pytest.raises(StepError, match=rf"endpoint_user: frank-zealot would run as UID {nobody}, its unit's User={nobody}"):
        check_engine_uid(given, given["engine"])
    given = native_params(tmp_path, user="root")
    given["unit"]["extra_service"] = {"User": "nobody"}
    with pytest.raises(StepError, match=r"endpoint_unit_extra.User: frank-zealot would run as .* e.g. endpoint_unit_extra.User: a system user"):
        check_engine_uid(given, given["engine"])


def test_dynamic_users_and_unreadable_names_are_never_a_clash_or_a_traceback(tmp_path):
    installed_native(tmp_path, "frank-large", "")  # root
    installed_native(tmp_path, "frank-old", "a\u0000b")  # a kept record no user database can read
    for extra in ({"DynamicUser": "yes"}, {"DynamicUser": "true"}):
        given = native_params(tmp_path)  # root, but systemd allocates the unit a UID of its own
        given["unit"]["extra_service"] = extra
        assert check_engine_uid(given, given["engine"]) is None, extra
    given = native_params(tmp_path, user="nobody")
    assert check_engine_uid(given, given["engine"]) is None


def _native_users(endpoints: dict, read_vars) -> dict[str, list[tuple[str, str]]]:
    by_machine: dict[str, list[tuple[str, str]]] = {}
    for name, host_vars in endpoints.items():
        data = {**(host_vars or {}), **read_vars(name)}
        shape, extra = data.get("endpoint_shape") or {}, data.get("endpoint_unit_extra") or {}
        if shape.get("launch") == "native" and str(extra.get("DynamicUser", "")).lower() not in ("yes", "true", "1", "on"):
            by_machine.setdefault(str(data.get("ansible_host", name)), []).append((name, str(extra.get("User") or data.get("endpoint_user") or "root")))
    return by_machine


@pytest.mark.parametrize("source", ["production", "lab", "example", "lab-standins", "molecule/fleet", "molecule/default"])
def test_no_two_native_engines_of_one_machine_in_the_inventories_or_scenarios_share_a_user(source):
    if source.startswith("molecule/"):
        path = ROOT / source / "molecule.yml"
        if not path.exists():
            pytest.skip(f"{source} has no scenario file")
        inventory = yaml.safe_load(path.read_text())["provisioner"].get("inventory") or {}
        endpoints = ((inventory.get("hosts") or {}).get("all", {}).get("children", {}).get("llm_endpoints") or {}).get("hosts") or {}
        by_machine = _native_users(endpoints, lambda name: (inventory.get("host_vars") or {}).get(name) or {})
    else:
        root = ROOT / "inventories" / source
        hosts = yaml.load((root / "hosts.yml").read_text(), Loader=_Inventory)
        endpoints = (hosts["all"]["children"].get("llm_endpoints") or {}).get("hosts") or {}

        def read_vars(name):
            path = root / "host_vars" / f"{name}.yml"
            return yaml.load(path.read_text(), Loader=_Inventory) if path.exists() else {}

        by_machine = _native_users(endpoints, read_vars)
    for machine, engines in by_machine.items():
        users = [user for _name, user in engines]
        assert len(users) == len(set(users)), (source, machine, engines)
