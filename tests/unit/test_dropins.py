"""Every place systemd reads a service's drop-ins from is refused or reported, on a made-up file
tree and a fake host: the admin, runtime, control (`systemctl set-property`), transient, generator,
attached and vendor directories of the search path; the unit's own NAME.service.d, its
dash-prefix directories (`frank-.service.d`) and the type's (`service.d`); what systemd itself
says it loaded (`DropInPaths`); and a unit file that shadows the deploy's (`FragmentPath`)."""

from __future__ import annotations

import sys

import pytest
from fake_host import DROPIN_QUERY, SYSTEMCTL, FakeRunner, show

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.systemd_unit import UNIT_SEARCH_PATH, dropin_dir_names, unit_overrides
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_step import ensure_unit
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

UNIT = "frank-primary.service"
VENDOR = ("/usr/local/lib/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")


def test_the_drop_in_directories_of_a_name_its_prefixes_its_template_and_its_type():
    assert dropin_dir_names("frank-primary.service") == ["frank-primary.service.d", "frank-.service.d", "service.d"]
    assert dropin_dir_names("llm-fleet-webhook-relay.service") == [
        "llm-fleet-webhook-relay.service.d",
        "llm-fleet-webhook-.service.d",
        "llm-fleet-.service.d",
        "llm-.service.d",
        "service.d",
    ]
    assert dropin_dir_names("lab.service") == ["lab.service.d", "service.d"]
    assert dropin_dir_names("engine@gpu0.service") == ["engine@gpu0.service.d", "engine@.service.d", "service.d"]


def plant(sysroot, root: str, directory: str, name: str = "override.conf"):
    path = sysroot / root.lstrip("/") / directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[Service]\nEnvironment=BENCH=1\n")
    return str(path)


@pytest.mark.parametrize("directory", dropin_dir_names(UNIT))
@pytest.mark.parametrize("root", UNIT_SEARCH_PATH)
def test_a_drop_in_anywhere_systemd_reads_is_refused_or_reported(tmp_path, root, directory):
    sysroot = tmp_path / "root"
    path = plant(sysroot, root, directory)
    refused, reported, shadows = unit_overrides(UNIT, str(sysroot / "etc/systemd/system"), [], sysroot=str(sysroot))
    found = refused + reported
    assert [d.path for d in found] == [path] and shadows == []
    # A package's drop-in for every service is named, not refused; everything else is refused.
    assert bool(reported) is (root in VENDOR and directory == "service.d")
    assert found[0].root == root and found[0].origin


@pytest.mark.parametrize(
    ("root", "words"),
    [
        ("/etc/systemd/system.control", "systemctl revert frank-primary.service"),
        ("/run/systemd/system.control", "set-property --runtime"),
        ("/run/systemd/transient", "systemd-run"),
        ("/run/systemd/generator", "generator"),
        ("/run/systemd/generator.early", "generator"),
        ("/run/systemd/generator.late", "generator"),
        ("/run/systemd/system", "runtime drop-in"),
        ("/etc/systemd/system", "administrator"),
        ("/usr/lib/systemd/system", "package"),
    ],
)
def test_each_refusal_says_what_put_the_drop_in_there_and_the_fix(tmp_path, root, words):
    sysroot = tmp_path / "root"
    plant(sysroot, root, f"{UNIT}.d")
    refused, _reported, _shadows = unit_overrides(UNIT, str(sysroot / "etc/systemd/system"), [], sysroot=str(sysroot))
    assert words in refused[0].origin


def test_a_listed_drop_in_is_kept_by_file_name_or_path_and_a_masked_one_ignored(tmp_path):
    sysroot = tmp_path / "root"
    kept = plant(sysroot, "/etc/systemd/system.control", f"{UNIT}.d", "50-CPUWeight.conf")
    by_path = plant(sysroot, "/run/systemd/system", "frank-.service.d", "bench.conf")
    masked = sysroot / "etc/systemd/system/service.d/10-timeout.conf"
    masked.parent.mkdir(parents=True)
    masked.symlink_to("/dev/null")
    refused, reported = unit_overrides(UNIT, str(sysroot / "etc/systemd/system"), ["50-CPUWeight.conf", by_path], sysroot=str(sysroot))[:2]
    assert (refused, reported) == ([], [])
    assert kept  # planted, and listed by its file name


def test_what_systemd_says_it_loaded_counts_and_a_shadowing_unit_file_is_named(tmp_path):
    sysroot = tmp_path / "root"
    elsewhere = "/etc/systemd/system/frank-alias.service.d/bench.conf"  # e.g. an alias's directory
    answer = (0, f"DropInPaths={elsewhere}\nFragmentPath=/run/systemd/transient/{UNIT}\n", "")
    refused, _reported, shadows = unit_overrides(UNIT, str(sysroot / "etc/systemd/system"), [], query=lambda _argv: answer, sysroot=str(sysroot))
    assert [d.path for d in refused] == [elsewhere]
    assert shadows == [str(sysroot / f"run/systemd/transient/{UNIT}")]
    # A unit file of the same name in a directory systemd prefers, found on disk.
    control = sysroot / "etc/systemd/system.control" / UNIT
    control.parent.mkdir(parents=True)
    control.write_text("[Service]\n")
    assert unit_overrides(UNIT, str(sysroot / "etc/systemd/system"), [], sysroot=str(sysroot))[2] == [str(control)]
    # A lower-priority file (a package's unit of the same name) is overridden by the deploy's: fine.
    vendor = sysroot / "usr/lib/systemd/system" / UNIT
    vendor.parent.mkdir(parents=True)
    vendor.write_text("[Service]\n")
    assert str(vendor) not in unit_overrides(UNIT, str(sysroot / "etc/systemd/system"), [], sysroot=str(sysroot))[2]


# --- through the unit step, as a deploy meets them (each of these passed unnoticed before) -------

RUNNING = show(LoadState="loaded", ActiveState="active", UnitFileState="enabled", NRestarts=0)


def unit_params(tmp_path, **overrides):
    return {"name": UNIT, "command": [sys.executable, "-m", "http.server"], "unit_dir": str(tmp_path / "units"), "env_dir": str(tmp_path / "env"), **overrides}


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_set_property_drop_in_systemd_loaded_fails_the_step_naming_it_and_the_revert(tmp_path, check_mode):
    control = f"/etc/systemd/system.control/{UNIT}.d/50-CPUWeight.conf"
    runner = FakeRunner({(SYSTEMCTL, "show"): [RUNNING], DROPIN_QUERY: [(0, f"DropInPaths={control}\nFragmentPath=\n", "")]})
    host = Host(runner, check_mode=check_mode)
    named = rf"{UNIT}: drop-ins change this unit behind the deploy: {control} \(written by `systemctl set-property`: `systemctl revert {UNIT}`"
    with pytest.raises(StepError, match=named):
        ensure_unit(unit_params(tmp_path), host, diff=False)
    assert host.actions == []  # refused before anything was written
    assert ensure_unit(unit_params(tmp_path, dropins=["50-CPUWeight.conf"]), Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]}), check_mode=True), diff=False)


@pytest.mark.parametrize("directory", ["frank-.service.d", "service.d"])
def test_a_prefix_or_type_drop_in_beside_the_unit_fails_the_step(tmp_path, directory):
    path = tmp_path / "units" / directory / "bench.conf"
    path.parent.mkdir(parents=True)
    path.write_text("[Service]\nEnvironment=BENCH=1\n")
    with pytest.raises(StepError, match=rf"behind the deploy: {path} "):
        ensure_unit(unit_params(tmp_path), Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]}), check_mode=True), diff=False)


def test_a_transient_unit_that_shadows_the_deploys_fails_the_step(tmp_path):
    runner = FakeRunner({(SYSTEMCTL, "show"): [RUNNING], DROPIN_QUERY: [(0, f"DropInPaths=\nFragmentPath=/run/systemd/transient/{UNIT}\n", "")]})
    with pytest.raises(StepError, match=rf"/run/systemd/transient/{UNIT} \(a unit file systemd loads instead of "):
        ensure_unit(unit_params(tmp_path), Host(runner, check_mode=True), diff=False)


def test_a_packages_drop_in_for_every_service_is_reported_not_refused(tmp_path):
    vendor = "/usr/lib/systemd/system/service.d/10-timeout-abort.conf"
    runner = FakeRunner({(SYSTEMCTL, "show"): [RUNNING], DROPIN_QUERY: [(0, f"DropInPaths={vendor}\nFragmentPath=\n", "")]})
    result = ensure_unit(unit_params(tmp_path), Host(runner, check_mode=True), diff=False)
    assert result["dropins_reported"] == [vendor]
    assert any(vendor in warning and "every service" in warning for warning in result["warnings"])
