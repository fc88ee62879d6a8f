"""hf_payload_gate core against the Hub emulator (real HTTP on loopback)."""

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from hub_emulator import Fault, HubEmulator
from hub_payload import GATED, REPO, TOKEN

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import build_manifest, fetch_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient, HubError
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import Manifest, ManifestFile
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.structure import structure_problems
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import STAMP_FILE, verify_payload


def by_path(results):
    return {r.path: r for r in results}


def test_manifest_takes_sha256_from_linked_etag_and_pins_the_commit(hub):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main")
    files = {f.path: f for f in manifest.files}
    assert manifest.revision == hub.emulator.repos[REPO].commit
    lfs, xet, git = files["model-00001-of-00002.gguf"], files["model-00002-of-00002.gguf"], files["config.json"]
    assert (lfs.sha256, lfs.size, lfs.lfs) == (hub.sha256(lfs.path), 3 << 20, True)
    # The Xet CDN's ETag is not the sha256; the manifest must hold the sha256 all the same.
    xet_file = hub.emulator.repos[REPO].files[xet.path]
    assert xet.sha256 == hub.sha256(xet.path) != xet_file.xet_hash
    # A git file: size only; its ETag is a blob sha and never taken for a sha256.
    assert (git.sha256, git.lfs, git.size) == (None, False, len(hub.blobs["config.json"][0]))


def test_manifest_of_chosen_files_and_unknown_file(hub):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", ["config.json"])
    assert [f.path for f in manifest.files] == ["config.json"]
    with pytest.raises(HubError, match="nope.gguf is not in the repository"):
        build_manifest(client, REPO, "main", ["nope.gguf"])


def test_fetch_lfs_xet_and_git_then_verify(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main")
    dest = tmp_path / "dest"
    results = by_path(fetch_payload(client, manifest, str(dest)))
    assert {r.action for r in results.values()} == {"fetched"}
    for path, (data, _kind) in hub.blobs.items():
        assert (dest / path).read_bytes() == data
        assert not (dest / f"{path}.partial").exists()
    verdicts = verify_payload(manifest, str(dest), check_hash=True)
    assert all(v.ok for v in verdicts), [v.as_dict() for v in verdicts]
    # A missing file is never asked for with a Range header (the Xet CDN refuses bytes=0-).
    assert not [r for r in hub.emulator.requests if "Range" in r.headers]


def test_second_fetch_skips_everything_and_transfers_nothing(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main")
    fetch_payload(client, manifest, str(tmp_path))
    before = len(hub.emulator.requests)
    again = fetch_payload(client, manifest, str(tmp_path))
    assert {r.action for r in again} == {"skipped"}
    assert sum(r.bytes_transferred for r in again) == 0
    assert len(hub.emulator.requests) == before  # stamps: no network, no rehash


def test_resume_after_a_cut_transfers_exactly_the_missing_bytes(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main")
    path = "model-00002-of-00002.gguf"  # the Xet-style file: resume must use a non-zero start
    cut = 1_234_567
    hub.emulator.inject(path, Fault(cut_after=cut))
    first = by_path(fetch_payload(client, manifest, str(tmp_path)))
    assert first[path].action == "failed"
    assert "partial file is kept" in first[path].detail
    assert (tmp_path / f"{path}.partial").stat().st_size == cut
    assert not (tmp_path / path).exists()
    second = by_path(fetch_payload(client, manifest, str(tmp_path)))
    assert second[path].action == "resumed"
    assert second[path].bytes_transferred == len(hub.blobs[path][0]) - cut
    assert (tmp_path / path).read_bytes() == hub.blobs[path][0]
    ranges = [r.headers["Range"] for r in hub.emulator.requests if "Range" in r.headers]
    assert ranges and set(ranges) == {f"bytes={cut}-"}


def test_complete_partial_is_finished_by_a_416(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", ["model-00002-of-00002.gguf"])
    (tmp_path / "model-00002-of-00002.gguf.partial").write_bytes(hub.blobs["model-00002-of-00002.gguf"][0])
    [result] = fetch_payload(client, manifest, str(tmp_path))
    assert (result.action, result.bytes_transferred) == ("completed", 0)
    assert (tmp_path / "model-00002-of-00002.gguf").exists()


def test_corrupted_byte_is_detected_and_only_refetch_replaces_it(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", ["model-00002-of-00002.gguf"])
    fetch_payload(client, manifest, str(tmp_path))
    target = tmp_path / "model-00002-of-00002.gguf"
    with open(target, "r+b") as handle:
        handle.seek(1 << 20)
        byte = handle.read(1)
        handle.seek(1 << 20)
        handle.write(bytes([byte[0] ^ 0xFF]))
    [verdict] = verify_payload(manifest, str(tmp_path), check_hash=True, trust_stamps=True)
    assert verdict.status == "hash_mismatch"
    [refused] = fetch_payload(client, manifest, str(tmp_path))
    assert refused.action == "failed" and "set refetch" in refused.detail
    [fixed] = fetch_payload(client, manifest, str(tmp_path), refetch=True)
    assert fixed.action == "fetched"
    assert target.read_bytes() == hub.blobs[target.name][0]
    assert len(list(tmp_path.glob("model-00002-of-00002.gguf.rejected-*"))) == 1  # the bad copy is kept


def test_gated_repo_needs_the_token_and_the_token_never_leaks(hub, tmp_path, capsys):
    anonymous = HubClient(hub.emulator.hub_url)
    with pytest.raises(HubError, match="HTTP 401.*token") as info:
        build_manifest(anonymous, GATED, "main")
    assert info.value.status == 401
    client = HubClient(hub.emulator.hub_url, token=TOKEN)
    manifest = build_manifest(client, GATED, "main")
    unauth = Manifest(manifest.repo_id, manifest.revision, manifest.files)
    [denied] = fetch_payload(anonymous, unauth, str(tmp_path / "anon"))
    assert denied.action == "failed" and "401" in denied.detail
    assert [p.name for p in (tmp_path / "anon").iterdir()] == [".llm-fleet-fetch.lock"]  # the fetch's own lock, no payload byte
    [result] = fetch_payload(client, manifest, str(tmp_path / "ok"))
    assert result.action == "fetched"
    # The token reached the Hub and nothing else.
    hub_auth = [r for r in hub.emulator.requests if r.server == "hub" and r.headers.get("Authorization")]
    cdn_auth = [r for r in hub.emulator.requests if r.server != "hub" and r.headers.get("Authorization")]
    assert hub_auth and not cdn_auth
    # ... and appears in no result, no message, no file.
    out = capsys.readouterr()
    text = repr([result.as_dict(), denied.as_dict(), manifest.as_dict(), client]) + out.out + out.err
    assert TOKEN not in text
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes()


def test_size_gate_reads_metadata_only_and_judges_each_kind_of_wrong(tmp_path):
    dest = tmp_path
    (dest / "right.bin").write_bytes(b"x" * 10)
    (dest / "short.bin").write_bytes(b"x" * 9)
    (dest / "dir.bin").mkdir()
    (dest / "target.bin").write_bytes(b"x" * 10)
    (dest / "link.bin").symlink_to(dest / "target.bin")
    (dest / "dangling.bin").symlink_to(dest / "gone.bin")
    names = ["right.bin", "short.bin", "dir.bin", "link.bin", "dangling.bin", "absent.bin"]
    manifest = Manifest("a/b", "0" * 40, [ManifestFile(n, 10) for n in names])
    status = {v.path: v.status for v in verify_payload(manifest, str(dest))}
    assert status == {
        "right.bin": "ok",
        "short.bin": "wrong_size",
        "dir.bin": "not_regular",
        "link.bin": "symlink",
        "dangling.bin": "symlink",
        "absent.bin": "missing",
    }
    allowed = {v.path: v.status for v in verify_payload(manifest, str(dest), allow_symlinks=True)}
    assert allowed["link.bin"] == "ok" and allowed["dangling.bin"] == "missing"
    assert not (dest / STAMP_FILE).exists()  # a size gate writes nothing


def test_verify_checks_exactly_the_manifest_files(tmp_path):
    (tmp_path / "wanted.bin").write_bytes(b"abc")
    (tmp_path / "unrelated-huge-file.bin").write_bytes(b"zz")
    manifest = Manifest("a/b", "0" * 40, [ManifestFile("wanted.bin", 3)])
    verdicts = verify_payload(manifest, str(tmp_path))
    assert [v.path for v in verdicts] == ["wanted.bin"] and verdicts[0].ok
    assert (tmp_path / "unrelated-huge-file.bin").exists()


def test_check_mode_plans_without_touching_anything(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main")
    (tmp_path / "model-00001-of-00002.gguf.partial").write_bytes(b"\0" * 1000)
    before = len(hub.emulator.requests)
    plan = by_path(fetch_payload(client, manifest, str(tmp_path), check_mode=True))
    assert plan["model-00001-of-00002.gguf"].action == "would_resume"
    assert plan["model-00001-of-00002.gguf"].bytes_transferred == (3 << 20) - 1000
    assert plan["config.json"].action == "would_fetch"
    assert len(hub.emulator.requests) == before
    assert sorted(os.listdir(tmp_path)) == ["model-00001-of-00002.gguf.partial"]


def test_slow_responses_still_complete(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", ["model-00002-of-00002.gguf"])
    hub.emulator.inject("model-00002-of-00002.gguf", Fault(delay=0.05))
    [result] = fetch_payload(client, manifest, str(tmp_path))
    assert result.action == "fetched"
    assert Path(tmp_path / "model-00002-of-00002.gguf").stat().st_size == (2 << 20) + 17


def test_our_client_follows_tree_pagination(hub):
    hub.emulator.page_size = 1
    manifest = build_manifest(HubClient(hub.emulator.hub_url), REPO, "main")
    assert len(manifest.files) == 3


# --- multi-connection fetch -------------------------------------------------------------------

PIECE = 256 << 10


def ranged_repo(hub, tmp_path, size=(3 << 20) + 12345, kind="lfs"):
    data = os.urandom(size)
    hub.emulator.add_file("frank/big", "big.gguf", data, kind, workdir=tmp_path / "hub")
    client = HubClient(hub.emulator.hub_url)
    return client, build_manifest(client, "frank/big", "main"), data


@pytest.mark.parametrize("kind", ["lfs", "xet"])
def test_ranged_fetch_over_several_connections_is_exact(hub, tmp_path, kind):
    client, manifest, data = ranged_repo(hub, tmp_path, kind=kind)
    dest = tmp_path / "dest"
    [result] = fetch_payload(client, manifest, str(dest), connections=4, piece_size=PIECE)
    assert (result.action, result.bytes_transferred, result.sha256) == ("fetched", len(data), hashlib.sha256(data).hexdigest())
    assert (dest / "big.gguf").read_bytes() == data
    assert sorted(p.name for p in dest.iterdir()) == [".llm-fleet-fetch.lock", ".llm-fleet-verified.json", "big.gguf"]  # no partial, no record
    ranges = [r.headers["Range"] for r in hub.emulator.requests if r.server != "hub"]
    pieces = -(-len(data) // PIECE)
    assert len(ranges) == pieces and "bytes=0-" not in ranges
    assert ranges[0] == f"bytes=0-{PIECE - 1}" or f"bytes=0-{PIECE - 1}" in ranges
    assert f"bytes={(pieces - 1) * PIECE}-{len(data) - 1}" in ranges  # never a byte past the size
    assert hub.emulator.bytes_served["big.gguf"] == len(data)
    # Kept-alive connections: at most one per worker reaches the CDN.
    assert len([r for r in hub.emulator.requests if r.server == "hub" and r.method == "GET" and "/resolve/" in r.path]) <= 4


def test_ranged_fetch_retries_a_cut_piece_from_where_it_stopped(hub, tmp_path):
    client, manifest, data = ranged_repo(hub, tmp_path)
    hub.emulator.inject("big.gguf", Fault(cut_after=100_000, times=2))
    [result] = fetch_payload(client, manifest, str(tmp_path / "dest"), connections=3, piece_size=PIECE)
    assert (result.action, result.bytes_transferred) == ("fetched", len(data))
    assert (tmp_path / "dest" / "big.gguf").read_bytes() == data
    assert hub.emulator.bytes_served["big.gguf"] == len(data)  # the cut bytes were kept, not asked again


def test_ranged_fetch_resumes_after_a_failed_run_without_fetching_a_byte_twice(hub, tmp_path):
    client, manifest, data = ranged_repo(hub, tmp_path)
    dest = tmp_path / "dest"
    connections = 3
    hub.emulator.inject("big.gguf", Fault(cut_after=10_000, times=1000))  # every answer is cut short: the run gives up
    [first] = fetch_payload(client, manifest, str(dest), connections=connections, piece_size=PIECE)
    assert first.action == "failed" and "big.gguf.partial.ranges" in first.detail
    assert (dest / "big.gguf.partial.ranges").exists() and not (dest / "big.gguf").exists()
    hub.emulator.faults.clear()
    [second] = fetch_payload(client, manifest, str(dest), connections=connections, piece_size=PIECE)
    assert second.action == "resumed"
    assert (dest / "big.gguf").read_bytes() == data
    assert first.bytes_transferred + second.bytes_transferred == len(data)  # every byte written once
    # Served again at most: what the other connections had in flight when the run gave up.
    assert len(data) <= hub.emulator.bytes_served["big.gguf"] <= len(data) + (connections - 1) * PIECE


def test_ranged_fetch_with_every_piece_recorded_completes_without_a_request(hub, tmp_path):
    client, manifest, data = ranged_repo(hub, tmp_path)
    dest = tmp_path / "dest"
    hub.emulator.inject("big.gguf", Fault(cut_after=0, times=1))  # the last request of the first run dies
    fetch_payload(client, manifest, str(dest), connections=1, piece_size=len(data) // 2 + 1)
    before = len(hub.emulator.requests)
    [result] = fetch_payload(client, manifest, str(dest), connections=2, piece_size=PIECE)
    assert result.action in ("resumed", "fetched") and (dest / "big.gguf").read_bytes() == data
    assert hub.emulator.bytes_served["big.gguf"] == len(data)
    assert before <= len(hub.emulator.requests)


def test_ranged_fetch_sends_the_token_to_the_hub_only(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url, token=TOKEN)
    manifest = build_manifest(client, GATED, "main")
    [result] = fetch_payload(client, manifest, str(tmp_path), connections=4, piece_size=128 << 10)
    assert result.action == "fetched"
    cdn = [r for r in hub.emulator.requests if r.server != "hub"]
    assert len(cdn) == 8 and not [r for r in cdn if r.headers.get("Authorization")]
    assert [r for r in hub.emulator.requests if r.server == "hub" and r.headers.get("Authorization") == f"Bearer {TOKEN}"]


def test_ranged_fetch_of_a_single_stream_partial_keeps_its_prefix(hub, tmp_path):
    client, manifest, data = ranged_repo(hub, tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    prefix = PIECE * 2 + 1000
    (dest / "big.gguf.partial").write_bytes(data[:prefix])  # left by a one-connection run
    [result] = fetch_payload(client, manifest, str(dest), connections=4, piece_size=PIECE)
    assert (result.action, result.bytes_transferred) == ("resumed", len(data) - prefix)
    assert (dest / "big.gguf").read_bytes() == data
    assert hub.emulator.bytes_served["big.gguf"] == len(data) - prefix


def test_emulator_caps_each_connection_and_all_of_them(tmp_path):
    emulator = HubEmulator(per_connection_rate=8 << 20, aggregate_rate=16 << 20)
    data = os.urandom(4 << 20)
    emulator.add_file("frank/slow", "w.gguf", data, "lfs", workdir=tmp_path)
    with emulator:
        client = HubClient(emulator.hub_url)
        manifest = build_manifest(client, "frank/slow", "main")
        started = time.monotonic()
        fetch_payload(client, manifest, str(tmp_path / "one"), connections=1)
        one = time.monotonic() - started
        started = time.monotonic()
        fetch_payload(client, manifest, str(tmp_path / "four"), connections=4, piece_size=512 << 10)
        four = time.monotonic() - started
    # The first MiB of a connection leaves at once (a burst), the rest at the cap.
    assert one >= (4 - 1) / 8  # 4 MiB at 8 MiB/s on one connection
    assert four >= (4 - 0.5) / 16  # four connections (32 MiB/s together) still share 16 MiB/s


def test_ranged_record_from_another_boot_trusts_only_the_synced_bytes(hub, tmp_path):
    client, manifest, data = ranged_repo(hub, tmp_path)
    dest = tmp_path / "dest"
    hub.emulator.inject("big.gguf", Fault(cut_after=10_000, times=1000))
    fetch_payload(client, manifest, str(dest), connections=2, piece_size=PIECE)  # gives up, leaves a record
    hub.emulator.faults.clear()
    record_path = dest / "big.gguf.partial.ranges"
    record = json.loads(record_path.read_text())
    written = sum(record["have"])
    assert written > 0 and record["synced"] == record["have"]  # a failing run syncs before it leaves
    # As after a power loss: another boot, and nothing synced yet.
    record["boot_id"], record["synced"] = "another-boot", [0] * len(record["have"])
    record_path.write_text(json.dumps(record))
    [plan] = fetch_payload(client, manifest, str(dest), check_mode=True)
    assert (plan.action, plan.bytes_transferred) == ("would_fetch", len(data))
    [result] = fetch_payload(client, manifest, str(dest), connections=2, piece_size=PIECE)
    assert (result.action, result.bytes_transferred) == ("fetched", len(data))
    assert (dest / "big.gguf").read_bytes() == data


# seeds/000_70f4f3dffbd1d440.txt: "orcarouter/Qwen3.8-Flash-Next-Uncensored-FP8 (131 shards, 172.8 GiB," and its deployer's
# gate "frank-primary-qwen). Deployer gates rewritten (image digest + shard count" / "+ weight-map index)."
FLEET_SHARDS = 131


def test_the_fleets_131_shard_weight_map_is_cross_checked_with_the_manifest(tmp_path):
    shards = [f"model-{no:05d}-of-{FLEET_SHARDS:05d}.safetensors" for no in range(1, FLEET_SHARDS + 1)]
    weight_map = {f"model.layers.{no}.weight": shard for no, shard in enumerate(shards)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for shard in shards:
        (tmp_path / shard).write_bytes(b"")
    index = ManifestFile("model.safetensors.index.json", 1)
    whole = Manifest("a/b", "0" * 40, [index] + [ManifestFile(s, 0) for s in shards])
    assert structure_problems(whole, str(tmp_path)) == {}
    forgot = Manifest("a/b", "0" * 40, [index] + [ManifestFile(s, 0) for s in shards if s != shards[77]])
    assert structure_problems(forgot, str(tmp_path)) == {
        "model.safetensors.index.json": [f"weight_map names {shards[77]}, which the manifest does not list (add it to the manifest's files)"]
    }
