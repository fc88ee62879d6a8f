"""The Host runner's file methods, and writers that go through it: check mode makes nothing, a
real run names every change in `actions`."""

import os

import pytest
from hub_payload import REPO

from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import build_manifest, fetch_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.tree_writer import write_tree


def test_open_write_in_check_mode_opens_and_creates_nothing(tmp_path):
    host = Host.files_only(check_mode=True)
    assert host.open_write(str(tmp_path / "new"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600) is None
    assert not (tmp_path / "new").exists()
    assert host.actions == [f"open {tmp_path / 'new'} (mode 0600)"]


def test_open_write_outside_check_mode_opens_with_the_mode(tmp_path):
    host = Host.files_only()
    fd = host.open_write(str(tmp_path / "new"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o600


def test_a_files_only_host_runs_no_command():
    with pytest.raises(RuntimeError, match="runs no command: true"):
        Host.files_only().change(["true"])


def test_write_without_dir_mode_needs_the_directory(tmp_path):
    host = Host.files_only()
    with pytest.raises(FileNotFoundError):
        host.write(str(tmp_path / "missing" / "f"), "x", 0o644, dir_mode=None)
    host.write(str(tmp_path / "f"), b"bytes", 0o644, dir_mode=None)
    assert (tmp_path / "f").read_bytes() == b"bytes"


def test_remove_with_missing_ok_false_unlinks_a_dangling_link(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    Host.files_only().remove(str(link))
    assert os.path.lexists(link)  # missing_ok: a name whose target is gone counts as gone
    Host.files_only().remove(str(link), missing_ok=False)
    assert not os.path.lexists(link)


def test_the_generated_tree_in_check_mode_writes_nothing_and_names_what_it_would(tmp_path):
    host = Host.files_only(check_mode=True)
    report = write_tree(str(tmp_path / "out"), {"a/b.txt": b"x\n"}, host=host)
    assert report.changed == ["a/b.txt"] and not (tmp_path / "out").exists()
    assert host.actions == [f"write {tmp_path / 'out' / 'a/b.txt'} (mode 0644)"]


def test_a_fetch_through_a_host_names_its_changes_and_check_mode_makes_none(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", ["config.json"])
    planned = Host.files_only(check_mode=True)
    [plan] = fetch_payload(client, manifest, str(tmp_path / "dest"), host=planned)
    assert plan.action == "would_fetch" and not (tmp_path / "dest").exists() and planned.actions == []
    host = Host.files_only()
    [result] = fetch_payload(client, manifest, str(tmp_path / "dest"), host=host)
    assert result.action == "fetched"
    final = tmp_path / "dest" / "config.json"
    assert f"move {final}.partial {final}" in host.actions
    assert any(action.startswith(f"open {final}.partial") for action in host.actions)
