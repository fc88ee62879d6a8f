"""Payload generations (plugins/module_utils/payload/generations.py), driven on tmp dirs: each
payload in its own directory named by its manifest's sha256, the payload directory a link to the
one served, past K staged for purge, deleted only with approval."""

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from generation_payloads import quiet_host, ready, snapshot, write_manifest

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.generations import (
    MANIFEST_COPY,
    GenerationError,
    prepare,
    retain,
    switch,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import ManifestError, parse_manifest_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import stamped_digest, write_stamp

A = {"model.gguf": b"weights of payload A" * 64, "config.json": b'{"a": 1}'}
B = {"model.gguf": A["model.gguf"], "config.json": b'{"b": 2, "changed": true}'}  # a new revision: one config changed
C = {"model.gguf": b"weights of payload C, all new" * 64, "config.json": b'{"c": 3}'}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def payload(tmp_path):
    return tmp_path / "models" / "tiny"


def test_a_first_deploy_makes_the_generation_and_points_the_directory_at_it(payload):
    a = ready(payload, "a", A)
    assert a["generation"] == sha(Path(a["manifest"]).read_bytes())
    assert os.readlink(payload) == f"tiny.generations/{a['generation']}"  # relative: the same inside a RootDirectory
    assert (payload / "model.gguf").read_bytes() == A["model.gguf"]
    assert (Path(a["dir"]) / MANIFEST_COPY).read_bytes() == Path(a["manifest"]).read_bytes()
    # Ready again: nothing to do.
    assert prepare(str(payload), a["manifest"], quiet_host())["changed"] is False


def test_a_directory_from_before_generations_is_adopted_by_a_rename_not_a_copy(payload):
    payload.mkdir(parents=True)
    (payload / "model.gguf").write_bytes(A["model.gguf"])
    inode = (payload / "model.gguf").stat().st_ino
    manifest = write_manifest(payload.parent / "a.manifest.json", A)
    result = prepare(str(payload), manifest, quiet_host())
    assert result["adopted"] == str(payload) and payload.is_symlink()
    assert (Path(result["dir"]) / "model.gguf").stat().st_ino == inode


def test_a_new_revision_shares_unchanged_files_by_hard_link_and_carries_their_stamps(payload):
    a = ready(payload, "a", A)
    write_stamp(a["dir"], "model.gguf", "sha256", sha(A["model.gguf"]))
    b = ready(payload, "b", B)
    assert b["shared"] == ["model.gguf"] and b["generation"] != a["generation"]
    assert (Path(b["dir"]) / "model.gguf").stat().st_ino == (Path(a["dir"]) / "model.gguf").stat().st_ino
    assert not (Path(b["dir"]) / "config.json").samefile(Path(a["dir"]) / "config.json")
    # The link moved the file's ctime; both names keep a valid stamp, so no rehash of the shared bytes.
    assert stamped_digest(b["dir"], "model.gguf", "sha256") == sha(A["model.gguf"])
    assert stamped_digest(a["dir"], "model.gguf", "sha256") == sha(A["model.gguf"])
    # The running payload is not switched by prepare: the deploy does that before the restart.
    assert os.readlink(payload).endswith(a["generation"])


def test_the_manifest_may_not_live_inside_the_moving_directory(payload):
    payload.mkdir(parents=True)
    manifest = write_manifest(payload / "manifest.json", A)
    with pytest.raises(GenerationError, match=r"manifest: .* lies inside .*keep the manifest beside it \(e.g. .*tiny.manifest.yml\)"):
        prepare(str(payload), manifest, quiet_host())


def test_switch_points_at_a_kept_generation_and_refuses_one_not_whole(payload):
    a = ready(payload, "a", A)
    b = ready(payload, "b", C)
    moved = switch(str(payload), b["generation"], quiet_host())
    assert moved["changed"] and moved["previous"] == a["generation"]
    assert (payload / "model.gguf").read_bytes() == C["model.gguf"]
    assert switch(str(payload), b["generation"], quiet_host())["changed"] is False
    (Path(a["dir"]) / "model.gguf").unlink()
    with pytest.raises(GenerationError, match=r"generation .* is not whole: model.gguf \(missing\)"):
        switch(str(payload), a["generation"], quiet_host())
    assert os.readlink(payload).endswith(b["generation"])


def _age(directory: str, seconds_ago: float) -> None:
    then = time.time() - seconds_ago
    os.utime(Path(directory) / MANIFEST_COPY, (then, then))


def test_past_k_generations_are_staged_with_sizes_and_deleted_only_with_approval(payload):
    # seeds/004: "were purged from dankserver (trash-staged, emptied with approval; 763 GiB": past
    # K a payload is renamed into .purge-staged/ and reported, and only an approval deletes it.
    a, b, c = ready(payload, "a", A), ready(payload, "b", B), ready(payload, "c", C)
    switch(str(payload), c["generation"], quiet_host())
    _age(a["dir"], 300)
    _age(b["dir"], 100)
    kept = retain(str(payload), keep=2, keep_rejected=2, approved=False, host=quiet_host())
    assert kept["kept"] == [c["generation"], b["generation"]]
    held = sum(map(len, A.values())) + len(Path(a["manifest"]).read_bytes())  # the files and the manifest copy
    assert [(s["name"], s["kind"], s["bytes"]) for s in kept["staged"]] == [(a["generation"], "generation", held)]
    staged = payload.parent / "tiny.generations" / ".purge-staged" / a["generation"]
    assert (staged / "model.gguf").read_bytes() == A["model.gguf"]  # renamed, not deleted
    assert not Path(a["dir"]).exists() and kept["purged"] == [] and kept["bytes_freed"] == 0
    # A's model.gguf is hard-linked into B (kept): deleting the staged copy frees only what is A's alone.
    [waiting] = kept["awaiting_approval"]
    assert waiting["frees"] == waiting["bytes"] - len(A["model.gguf"])

    purged = retain(str(payload), keep=2, keep_rejected=2, approved=True, host=quiet_host())
    assert [p["name"] for p in purged["purged"]] == [a["generation"]] and purged["bytes_freed"] == waiting["frees"]
    assert not staged.exists() and (Path(b["dir"]) / "model.gguf").read_bytes() == A["model.gguf"]


def test_a_staged_generation_is_brought_back_and_a_purged_one_is_refused_by_name(payload):
    a, c = ready(payload, "a", A), ready(payload, "c", C)
    switch(str(payload), c["generation"], quiet_host())
    retain(str(payload), keep=1, keep_rejected=2, approved=False, host=quiet_host())
    back = switch(str(payload), a["generation"], quiet_host())
    assert back["unstaged"] == a["generation"] and (payload / "model.gguf").read_bytes() == A["model.gguf"]
    switch(str(payload), c["generation"], quiet_host())
    retain(str(payload), keep=1, keep_rejected=2, approved=True, host=quiet_host())
    with pytest.raises(GenerationError, match=rf"generation {a['generation']} is not in .* nor staged .*: it was purged\. Fetch that payload again"):
        switch(str(payload), a["generation"], quiet_host())


def test_rejected_copies_past_the_bound_are_staged_newest_kept(payload):
    a = ready(payload, "a", A)
    copies = []
    for age in (40, 30, 20, 10):
        copy = Path(a["dir"]) / f"model.gguf.rejected-2026113{age // 10}T000000-1"
        copy.write_bytes(b"bad bytes")
        os.utime(copy, (time.time() - age, time.time() - age))
        copies.append(copy)
    result = retain(str(payload), keep=2, keep_rejected=2, approved=False, host=quiet_host())
    assert sorted(p.name for p in Path(a["dir"]).glob("*.rejected-*")) == sorted(p.name for p in copies[2:])
    assert sorted(s["name"] for s in result["staged"]) == sorted(f"{a['generation']}/{p.name}" for p in copies[:2])
    assert all(s["kind"] == "rejected" and s["bytes"] == len(b"bad bytes") for s in result["staged"])


def test_rejected_copies_in_a_directory_without_generations_are_bounded_too(payload):
    payload.mkdir(parents=True)
    for n in range(3):
        copy = payload / f"config.json.rejected-2026113{n}T000000-1"
        copy.write_bytes(b"x")
        os.utime(copy, (time.time() - 100 + n, time.time() - 100 + n))
    result = retain(str(payload), keep=0, keep_rejected=1, approved=False, host=quiet_host())
    assert [p.name for p in payload.glob("*.rejected-*")] == ["config.json.rejected-20261132T000000-1"]
    assert len(result["staged"]) == 2 and not payload.is_symlink()


def test_check_mode_reports_every_move_and_touches_nothing(payload, tmp_path):
    a, c = ready(payload, "a", A), ready(payload, "c", C)
    (Path(a["dir"]) / "model.gguf.rejected-20261130T000000-1").write_bytes(b"bad")
    before = snapshot(tmp_path)
    host = quiet_host(check_mode=True)
    moved = switch(str(payload), c["generation"], host)
    kept = retain(str(payload), keep=1, keep_rejected=0, approved=True, host=host)
    fresh = prepare(str(payload), write_manifest(tmp_path / "d.manifest.json", {"x.gguf": b"x"}), host)
    assert snapshot(tmp_path) == {**before, "d.manifest.json": snapshot(tmp_path)["d.manifest.json"]}
    assert moved["changed"] and any(a.startswith(f"point {payload} -> ") for a in moved["actions"])
    # The link still names A (check mode switched nothing): C is past K=1, A's rejected copy past 0.
    assert [(s["name"][:64], s["kind"]) for s in kept["staged"]] == [(c["generation"], "generation"), (a["generation"], "rejected")]
    assert any(action.startswith("move ") for action in kept["actions"])
    assert fresh["changed"] and any(action.startswith("mkdir ") for action in fresh["actions"])


def test_check_mode_of_the_first_deploy_with_generations_verifies_the_directory_where_it_is(payload, tmp_path):
    payload.mkdir(parents=True)
    (payload / "model.gguf").write_bytes(A["model.gguf"])
    manifest = write_manifest(payload.parent / "a.manifest.json", A)
    before = snapshot(tmp_path)
    host = quiet_host(check_mode=True)
    readied = prepare(str(payload), manifest, host)
    assert readied["adopted"] == str(payload) and readied["dir"] == str(payload)
    moved = switch(str(payload), readied["generation"], host, bring_back=False)
    assert moved["changed"] and snapshot(tmp_path) == before


def test_a_manifest_text_reads_the_same_as_json_as_yaml_flow_and_as_block_yaml():
    # The JSON path is the fast one (the switch re-reads a generation's manifest copy each deploy);
    # a YAML flow mapping also starts with "{" and must still read.
    expected = {"repo_id": "lab/tiny", "revision": "a" * 40, "files": [{"path": "m.gguf", "size": 3, "sha256": "b" * 64}]}
    texts = [
        json.dumps(expected),
        "{repo_id: lab/tiny, revision: " + "a" * 40 + ", files: [{path: m.gguf, size: 3, sha256: " + "b" * 64 + "}]}",
        "repo_id: lab/tiny\nrevision: '" + "a" * 40 + "'\nfiles:\n  - {path: m.gguf, size: 3, sha256: " + "b" * 64 + "}\n",
    ]
    parsed = [parse_manifest_text(text, "m") for text in texts]
    assert all(p.as_dict() == parsed[0].as_dict() for p in parsed) and parsed[0].files[0].sha256 == "b" * 64
    with pytest.raises(ManifestError, match=r"files\[0\].size: expected a byte count"):
        parse_manifest_text(json.dumps({**expected, "files": [{"path": "m.gguf", "size": -1}]}), "m")
