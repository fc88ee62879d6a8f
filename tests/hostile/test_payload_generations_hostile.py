"""Hostile input to payload generations: a record naming a path instead of a digest, symlinks
planted where a generation, the staging area or the payload link should be, a purge nobody
approved. Each is refused naming the path, and nothing outside the payload's own tree moves."""

import os
import sys
from pathlib import Path

import pytest
from fake_host import SYSTEMCTL, FakeRunner, show
from generation_payloads import quiet_host, ready, snapshot, write_manifest

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint, restore_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.generations import GenerationError, Layout, manifest_digest, prepare, retain, switch
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

A = {"model.gguf": b"payload A"}
C = {"model.gguf": b"payload C"}


@pytest.fixture
def payload(tmp_path):
    return tmp_path / "models" / "tiny"


@pytest.fixture
def outside(tmp_path):
    """A directory that must never be moved, written or deleted through a planted link."""
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep.me").write_bytes(b"not a payload")
    return target


@pytest.mark.parametrize("name", ["../../../precious", "..", "a" * 63 + "/", "A" * 64, "a" * 64 + "/../x", "", None])
def test_a_generation_name_that_is_not_a_digest_is_refused_before_any_path_is_built(payload, outside, name):
    ready(payload, "a", A)
    if name:  # a record without a generation is one from before generations (checked by its manifest)
        record = {"payload": {"dir": str(payload), "generation": name, "manifest_sha256": "0" * 64}}
        with pytest.raises(StepError, match=r"generation: .* is not a manifest sha256 \(64 lowercase hex digits\)"):
            restore_payload(record, quiet_host())
    with pytest.raises(GenerationError, match="payload generations are named by digest only"):
        switch(str(payload), name, quiet_host())
    assert (outside / "keep.me").read_bytes() == b"not a payload" and (payload / "model.gguf").read_bytes() == b"payload A"


@pytest.mark.parametrize("payload_dir", ["relative/tiny", "/srv/../etc", "/", "/srv/tiny\n"])
def test_a_payload_dir_that_climbs_or_is_not_absolute_is_refused(payload_dir):
    with pytest.raises(GenerationError, match=r"payload.dir: .*(absolute|'\.\.'|cannot be a payload directory)"):
        Layout(payload_dir)


def test_a_symlink_planted_where_a_generation_should_be_is_refused_and_never_followed(payload, outside, tmp_path):
    ready(payload, "a", A)
    manifest = write_manifest(tmp_path / "c.manifest.json", C)
    planted = payload.parent / "tiny.generations" / manifest_digest(Path(manifest).read_text())
    planted.symlink_to(outside)
    before = snapshot(tmp_path)
    with pytest.raises(GenerationError, match=rf"{planted} is a symlink \(to '{outside}'\); payload generations are never reached through one"):
        prepare(str(payload), manifest, quiet_host())
    with pytest.raises(GenerationError, match="is a symlink"):
        switch(str(payload), planted.name, quiet_host())
    with pytest.raises(GenerationError, match="is a symlink"):
        retain(str(payload), keep=1, keep_rejected=0, approved=True, host=quiet_host())
    assert snapshot(tmp_path) == before


def test_a_symlink_planted_as_the_staging_area_is_refused(payload, outside, tmp_path):
    ready(payload, "a", A)
    c = ready(payload, "c", C)
    (payload.parent / "tiny.generations" / ".purge-staged").symlink_to(outside)
    switch(str(payload), c["generation"], quiet_host())
    before = snapshot(tmp_path)
    with pytest.raises(GenerationError, match=r"\.purge-staged is a symlink"):
        retain(str(payload), keep=1, keep_rejected=0, approved=True, host=quiet_host())
    assert snapshot(tmp_path) == before


def test_a_payload_link_pointing_elsewhere_is_not_ours_to_move(payload, outside, tmp_path):
    payload.parent.mkdir(parents=True)
    payload.symlink_to(outside)
    manifest = write_manifest(tmp_path / "a.manifest.json", A)
    with pytest.raises(GenerationError, match=rf"payload.dir: {payload} is a symlink to '{outside}', not to one of its generations"):
        prepare(str(payload), manifest, quiet_host())
    assert os.readlink(payload) == str(outside)


def test_a_purge_without_approval_deletes_nothing(payload, tmp_path):
    a, c = ready(payload, "a", A), ready(payload, "c", C)
    switch(str(payload), c["generation"], quiet_host())
    first = retain(str(payload), keep=1, keep_rejected=2, approved=False, host=quiet_host())
    again = retain(str(payload), keep=1, keep_rejected=2, approved=False, host=quiet_host())
    staged = payload.parent / "tiny.generations" / ".purge-staged" / a["generation"]
    assert first["purged"] == again["purged"] == [] and first["bytes_freed"] == again["bytes_freed"] == 0
    assert [e["name"] for e in again["awaiting_approval"]] == [a["generation"]]
    assert (staged / "model.gguf").read_bytes() == b"payload A"


def test_an_approved_purge_removes_a_planted_link_without_entering_it(payload, outside, tmp_path):
    a, c = ready(payload, "a", A), ready(payload, "c", C)
    (Path(a["dir"]) / "escape").symlink_to(outside)
    switch(str(payload), c["generation"], quiet_host())
    result = retain(str(payload), keep=1, keep_rejected=2, approved=True, host=quiet_host())
    assert [e["name"] for e in result["purged"]] == [a["generation"]]
    assert (outside / "keep.me").read_bytes() == b"not a payload"


def test_a_record_whose_generation_dir_holds_another_manifest_is_refused(payload, tmp_path):
    a = ready(payload, "a", A)
    c = ready(payload, "c", C)
    switch(str(payload), c["generation"], quiet_host())
    # A generation renamed to another's name: its manifest copy does not hash to that name.
    os.rename(a["dir"], a["dir"] + ".moved")
    os.rename(c["dir"], a["dir"])
    record = {"payload": {"dir": str(payload), "generation": a["generation"]}}
    with pytest.raises(StepError, match=r"has no manifest copy .* of sha256 .*not a generation this collection made"):
        restore_payload(record, quiet_host())
    assert os.readlink(payload).endswith(c["generation"])  # the link was not moved


def test_a_planted_staging_link_fails_a_green_deploy_loudly_after_it_is_recorded(payload, outside, tmp_path):
    # Retention runs in the deploy's own call: a planted link there must fail the task, not pass silently.
    a = ready(payload, "a", A)
    (payload.parent / "tiny.generations" / ".purge-staged").symlink_to(outside)
    unit = {"name": "lab.service", "command": [sys.executable, "-m", "http.server"], "unit_dir": str(tmp_path / "units"), "env_dir": str(tmp_path / "env")}
    params = {"unit": unit, "record_dir": str(tmp_path / "record"), "payload": {"dir": str(payload), "manifest": a["manifest"], "generations": 2}}
    with pytest.raises(StepError, match=r"the deploy is green and recorded, but keeping its payload generations failed: .*\.purge-staged is a symlink"):
        deploy_endpoint(params, Host(FakeRunner({(SYSTEMCTL, "show"): [show(LoadState="loaded", ActiveState="inactive")]})), diff=False)
    assert (tmp_path / "record" / "last-good.json").exists() and sorted(p.name for p in outside.iterdir()) == ["keep.me"]
