"""Hostile payload input: planted files, a lying or foreign server, unsafe manifests. Each case is
refused with an error that names the file or URL, and nothing outside the manifest is written
(see README.md for which finding each case proves)."""

import contextlib
import datetime
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hub_payload import REPO, TOKEN, split_first_part

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import FetchError, build_manifest, fetch_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient, HubError
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import Manifest, ManifestError, ManifestFile, destination_path, parse_manifest
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import verify_payload
from ansible_collections.frank.llm_fleet.plugins.modules.hf_payload_gate import gguf_split_count

LOCK = ".llm-fleet-fetch.lock"  # one fetch per destination holds it


def test_sha_mismatch_is_kept_aside_and_never_takes_the_final_name(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    good = build_manifest(client, REPO, "main", ["model-00001-of-00002.gguf"])
    wrong = Manifest(good.repo_id, good.revision, [ManifestFile(good.files[0].path, good.files[0].size, "0" * 64, True)])
    [result] = fetch_payload(client, wrong, str(tmp_path))
    assert result.action == "failed" and "sha256" in result.detail
    assert not (tmp_path / "model-00001-of-00002.gguf").exists()
    aside = list(tmp_path.glob("model-00001-of-00002.gguf.rejected-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == hub.blobs["model-00001-of-00002.gguf"][0]


def test_http_error_body_is_never_written(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", ["config.json"])
    missing = Manifest(manifest.repo_id, manifest.revision, [ManifestFile("not-on-the-hub.gguf", 100, None, False)])
    [result] = fetch_payload(client, missing, str(tmp_path))
    assert result.action == "failed" and "HTTP 404" in result.detail
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK]  # the fetch's own lock, nothing else


@pytest.mark.parametrize("bad", ["../escape.gguf", "/etc/passwd", "a/../../b", "a//b", "./x", "C:/x", "a\\b"])
def test_unsafe_manifest_paths_are_refused(bad):
    with pytest.raises(ManifestError, match=r"files\[0\]\.path"):
        parse_manifest({"repo_id": "a/b", "revision": "0" * 40, "files": [{"path": bad, "size": 1}]})


def test_symlinked_directory_escaping_the_destination_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(ManifestError, match="resolves outside the destination"):
        destination_path(str(dest), "sub/file.gguf")


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"revision": "main"}, "revision"),
        ({"repo_id": "no spaces allowed"}, "repo_id"),
        ({"files": []}, "files"),
        ({"files": [{"path": "a", "size": -1}]}, r"files\[0\]\.size"),
        ({"files": [{"path": "a", "size": 1, "sha256": "xyz"}]}, r"files\[0\]\.sha256"),
        ({"files": [{"path": "a", "size": 1}, {"path": "a", "size": 1}]}, r"files\[1\]\.path"),
    ],
)
def test_malformed_manifests_name_the_field(patch, field):
    data = {"repo_id": "a/b", "revision": "0" * 40, "files": [{"path": "a", "size": 1}]}
    data.update(patch)
    with pytest.raises(ManifestError, match=f"^{field}"):
        parse_manifest(data)


LFS_FILE = "model-00001-of-00002.gguf"


def test_planted_partial_symlink_is_refused_and_its_target_untouched(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", [LFS_FILE])
    victim = tmp_path / "victim.conf"
    victim.write_bytes(b"precious\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / f"{LFS_FILE}.partial").symlink_to(victim)
    [result] = fetch_payload(client, manifest, str(dest))
    assert result.action == "failed"
    assert f"{LFS_FILE}.partial" in result.detail and "symlink" in result.detail
    assert victim.read_bytes() == b"precious\n"
    assert not (dest / LFS_FILE).exists()
    [planned] = fetch_payload(client, manifest, str(dest), check_mode=True)
    assert planned.action == "failed" and "symlink" in planned.detail


def test_non_regular_partial_is_refused(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", [LFS_FILE])
    (tmp_path / f"{LFS_FILE}.partial").mkdir()
    [result] = fetch_payload(client, manifest, str(tmp_path))
    assert result.action == "failed" and "not a regular file" in result.detail


def test_body_longer_than_the_manifest_stops_at_the_manifest_size(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    served = build_manifest(client, REPO, "main", [LFS_FILE]).files[0]
    short = 1000
    for sha256 in (None, served.sha256):  # a git-style file (size only), then an LFS one
        dest = tmp_path / str(bool(sha256))
        manifest = Manifest(REPO, hub.emulator.repos[REPO].commit, [ManifestFile(LFS_FILE, short, sha256, bool(sha256))])
        for _run in range(2):  # a rerun resumes the kept partial and is refused again
            [result] = fetch_payload(client, manifest, str(dest))
            assert result.action == "failed" and f"more than the manifest's {short} bytes" in result.detail
            assert (dest / f"{LFS_FILE}.partial").stat().st_size == short
            assert sorted(p.name for p in dest.iterdir()) == [LOCK, f"{LFS_FILE}.partial"]


class _DualStackHandler(BaseHTTPRequestHandler):
    """Answers https resolve requests with a redirect to the same host and port over plain http."""

    seen: list

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        type(self).seen.append((self.path, isinstance(self.connection, ssl.SSLSocket), self.headers.get("Authorization")))
        if isinstance(self.connection, ssl.SSLSocket):
            host, port = self.server.server_address
            self.send_response(302)
            self.send_header("Location", f"http://{host}:{port}/downgraded{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


class _DualStackServer(ThreadingHTTPServer):
    """One port speaking TLS or plain HTTP, chosen by the client's first byte: a downgrade to the
    very same host and port."""

    daemon_threads = True

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), _DualStackHandler)
        self.context = context

    def get_request(self):
        sock, address = super().get_request()
        if sock.recv(1, 0x2) == b"\x16":  # MSG_PEEK: a TLS ClientHello starts with 0x16
            sock = self.context.wrap_socket(sock, server_side=True)
        return sock, address


def _self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


def test_token_is_never_sent_after_a_downgrade_to_http_on_the_same_host(tmp_path):
    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    _DualStackHandler.seen = []
    server = _DualStackServer(context)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        host, port = server.server_address
        client = HubClient(f"https://{host}:{port}", token=TOKEN)
        client._ssl = ssl.create_default_context(cafile=str(cert))  # trust the test's own CA only
        conn, response = client.open_download(REPO, "0" * 40, "model.gguf")
        with contextlib.closing(conn):
            assert (response.status, response.read()) == (200, b"ok")
    finally:
        server.shutdown()
        server.server_close()
    [(_first, first_tls, first_auth), (second, second_tls, second_auth)] = _DualStackHandler.seen
    assert (first_tls, first_auth) == (True, f"Bearer {TOKEN}")  # the Hub over https gets it
    assert second.startswith("/downgraded/") and not second_tls
    assert second_auth is None  # the same host over plain http never does


class _HtmlHandler(BaseHTTPRequestHandler):
    """A captive portal or a wrong endpoint: 200 and HTML for every URL."""

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        body = b"<!DOCTYPE html><html><body>Please log in</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_html_instead_of_json_is_a_clear_error(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HtmlHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        host, port = server.server_address
        with pytest.raises(HubError) as info:
            build_manifest(HubClient(f"http://{host}:{port}"), REPO, "main")
    finally:
        server.shutdown()
        server.server_close()
    message = str(info.value)
    assert f"http://{host}:{port}/api/models/{REPO}/revision/main" in message
    assert "text/html" in message and "<!DOCTYPE html>" in message


# --- payload gate v2: integrity for every file, stamps, lock, free space, whole sets ------------------


def git_blob_sha1(data: bytes) -> str:
    """Git's own object id of a file, computed here as git does (not by the code under test). The Hub
    names non-LFS files by it (seeds/001_3ec7cf0f5a3e3f71.txt: "answers 200 with the real
    Content-Length and a git-blob-sha ETag that" / "the 64-hex gate correctly rejects (size-only
    check for those files)."), which left config.json (seeds/001: "config.json 72514") size-only."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_same_size_html_in_place_of_a_git_file_is_refused(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", ["config.json"])
    real = hub.blobs["config.json"][0]
    assert manifest.files[0].as_dict().get("git_blob_sha1") == git_blob_sha1(real)
    html = b"<html>log in</html>".ljust(len(real), b" ")
    hub.emulator.repos[REPO].files["config.json"].source.write_bytes(html)  # the server now lies
    [result] = fetch_payload(client, manifest, str(tmp_path))
    assert result.action == "failed" and "git_blob_sha1" in result.detail
    assert not (tmp_path / "config.json").exists()
    [aside] = tmp_path.glob("config.json.rejected-*")
    assert aside.read_bytes() == html


def test_a_mirror_answering_200_on_resolve_keeps_every_digest_from_the_tree(hub):
    hub.emulator.mirror = True
    files = {f.path: f.as_dict() for f in build_manifest(HubClient(hub.emulator.hub_url), REPO, "main").files}
    for path in ("model-00001-of-00002.gguf", "model-00002-of-00002.gguf"):
        assert files[path]["sha256"] == hashlib.sha256(hub.blobs[path][0]).hexdigest()
        assert files[path]["lfs"] is True
    assert files["config.json"]["git_blob_sha1"] == git_blob_sha1(hub.blobs["config.json"][0])
    assert [r.server for r in hub.emulator.requests if r.method == "HEAD"] == ["hub"] * 3  # no redirect was followed


def test_a_same_size_edit_with_its_mtime_restored_fools_no_stamp(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    path = "model-00002-of-00002.gguf"
    manifest = build_manifest(client, REPO, "main", [path])
    fetch_payload(client, manifest, str(tmp_path))
    target = tmp_path / path
    before = target.stat()
    with open(target, "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\0" * 16)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # `touch -d` the old time back
    assert (target.stat().st_size, target.stat().st_mtime_ns, target.stat().st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    [verdict] = verify_payload(manifest, str(tmp_path), check_hash=True, trust_stamps=True)
    assert verdict.status == "hash_mismatch"
    [refused] = fetch_payload(client, manifest, str(tmp_path))
    assert refused.action == "failed" and "set refetch" in refused.detail


def test_a_second_fetch_of_a_held_destination_is_refused_at_once(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", ["config.json"])
    before = len(hub.emulator.requests)
    with open(tmp_path / LOCK, "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running fetch holds
        started = time.monotonic()
        with pytest.raises(FetchError, match=rf"{LOCK}.*refused, not queued"):
            fetch_payload(client, manifest, str(tmp_path))
        assert time.monotonic() - started < 5  # refused, not waiting
    assert len(hub.emulator.requests) == before
    assert not (tmp_path / "config.json").exists()


def test_a_fetch_that_cannot_fit_is_refused_with_the_numbers_before_any_byte(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    served = build_manifest(client, REPO, "main", [LFS_FILE]).files[0]
    huge = 1 << 60  # an exabyte: more than any test machine's free space
    manifest = Manifest(REPO, hub.emulator.repos[REPO].commit, [ManifestFile(LFS_FILE, huge, served.sha256, True)])
    before = len(hub.emulator.requests)
    with pytest.raises(FetchError, match=rf"needs {huge:,} more bytes.*free") as info:
        fetch_payload(client, manifest, str(tmp_path))
    # The free space is named too (within 1 GiB: other work on the host writes meanwhile).
    named = int(re.search(r"has ([\d,]+) bytes", str(info.value)).group(1).replace(",", ""))
    assert abs(named - os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize) < 1 << 30
    assert len(hub.emulator.requests) == before
    assert not (tmp_path / f"{LFS_FILE}.partial").exists()


def _safetensors_repo(hub, tmp_path, weight_map):
    repo = "frank/sharded"
    index = json.dumps({"metadata": {"total_size": 2 << 20}, "weight_map": weight_map}).encode()
    hub.emulator.add_file(repo, "model.safetensors.index.json", index, "git", workdir=tmp_path)
    for no in (1, 2):
        hub.emulator.add_file(repo, f"model-0000{no}-of-00002.safetensors", os.urandom(1 << 20), "lfs", workdir=tmp_path)
    return repo


@pytest.mark.parametrize(
    ("weight_map", "listed", "named"),
    [
        # the manifest forgot shard 2, which the weight map needs
        ({"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}, [1], "model-00002-of-00002.safetensors"),
        # the manifest lists shard 2, which the weight map never names
        ({"a": "model-00001-of-00002.safetensors"}, [1, 2], "model-00002-of-00002.safetensors"),
    ],
)
def test_a_safetensors_index_is_cross_checked_with_the_manifest(hub, tmp_path, weight_map, listed, named):
    repo = _safetensors_repo(hub, tmp_path / "hub", weight_map)
    client = HubClient(hub.emulator.hub_url)
    paths = ["model.safetensors.index.json"] + [f"model-0000{no}-of-00002.safetensors" for no in listed]
    manifest = build_manifest(client, repo, "main", paths)
    results = {r.path: r for r in fetch_payload(client, manifest, str(tmp_path / "dest"))}
    index = results["model.safetensors.index.json"]
    assert index.action == "failed" and named in index.detail
    verdicts = {v.path: v for v in verify_payload(manifest, str(tmp_path / "dest"), check_hash=True)}
    assert not verdicts["model.safetensors.index.json"].ok and named in verdicts["model.safetensors.index.json"].detail


def test_a_whole_safetensors_set_passes(hub, tmp_path):
    repo = _safetensors_repo(hub, tmp_path / "hub", {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, repo, "main")
    assert {r.action for r in fetch_payload(client, manifest, str(tmp_path / "dest"))} == {"fetched"}
    assert all(v.ok for v in verify_payload(manifest, str(tmp_path / "dest"), check_hash=True))


def test_a_split_gguf_manifest_missing_a_part_is_refused(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", [LFS_FILE])  # part 1 of 2 only
    [result] = fetch_payload(client, manifest, str(tmp_path), split_count=gguf_split_count)
    assert result.action == "failed" and "model-00002-of-00002.gguf" in result.detail and "not in the manifest" in result.detail
    [verdict] = verify_payload(manifest, str(tmp_path), check_hash=True)  # by the names alone too
    assert not verdict.ok and "model-00002-of-00002.gguf" in verdict.detail


def test_a_split_gguf_whose_header_disagrees_with_its_names_is_refused(hub, tmp_path):
    repo = "frank/split-liar"
    first = split_first_part(tmp_path, 3, 1 << 20)  # the header says 3 parts, the names say 2
    hub.emulator.add_file(repo, "m-00001-of-00002.gguf", first, "lfs", workdir=tmp_path / "hub")
    hub.emulator.add_file(repo, "m-00002-of-00002.gguf", os.urandom(1 << 20), "lfs", workdir=tmp_path / "hub")
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, repo, "main")
    results = {r.path: r for r in fetch_payload(client, manifest, str(tmp_path / "dest"), split_count=gguf_split_count)}
    assert results["m-00001-of-00002.gguf"].action == "failed" and "split.count 3" in results["m-00001-of-00002.gguf"].detail
    verdicts = {v.path: v for v in verify_payload(manifest, str(tmp_path / "dest"), check_hash=True, split_count=gguf_split_count)}
    assert verdicts["m-00001-of-00002.gguf"].status == "inconsistent"


# --- the multi-connection path ----------------------------------------------------------------

RANGED = {"connections": 4, "piece_size": 256 << 10}


def test_planted_range_record_symlink_is_refused_and_its_target_untouched(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", ["model-00002-of-00002.gguf"])
    victim = tmp_path / "victim.conf"
    victim.write_bytes(b"precious\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "model-00002-of-00002.gguf.partial.ranges").symlink_to(victim)
    [result] = fetch_payload(client, manifest, str(dest), **RANGED)
    assert result.action == "failed" and "partial.ranges" in result.detail and "symlink" in result.detail
    assert victim.read_bytes() == b"precious\n"
    assert not (dest / "model-00002-of-00002.gguf").exists()


def test_ranged_fetch_never_asks_or_writes_past_the_manifest_size(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    served = build_manifest(client, REPO, "main", ["model-00002-of-00002.gguf"]).files[0]
    short = served.size - 100_000  # the manifest says less than the server holds
    manifest = Manifest(REPO, hub.emulator.repos[REPO].commit, [ManifestFile(served.path, short, served.sha256, True)])
    [result] = fetch_payload(client, manifest, str(tmp_path), **RANGED)
    assert result.action == "failed" and f"/{served.size}" in result.detail  # the server's Content-Range total is named
    asked = [r.headers["Range"] for r in hub.emulator.requests if "Range" in r.headers]
    assert asked and all(int(a.split("-")[1]) < short for a in asked)
    partial = tmp_path / f"{served.path}.partial"
    assert not partial.exists() or partial.stat().st_size <= short
    assert not (tmp_path / served.path).exists()


class _NoRangeHandler(BaseHTTPRequestHandler):
    """A server that ignores Range and answers 200 with the whole body."""

    body = b""

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


def test_a_server_ignoring_ranges_is_refused_and_nothing_is_written(tmp_path):
    _NoRangeHandler.body = os.urandom(1 << 20)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoRangeHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        host, port = server.server_address
        manifest = Manifest(REPO, "0" * 40, [ManifestFile("w.gguf", 1 << 20, hashlib.sha256(_NoRangeHandler.body).hexdigest(), True)])
        [result] = fetch_payload(HubClient(f"http://{host}:{port}"), manifest, str(tmp_path), **RANGED)
    finally:
        server.shutdown()
        server.server_close()
    assert result.action == "failed" and "ignores Range" in result.detail and "connections: 1" in result.detail
    partial = tmp_path / "w.gguf.partial"
    assert not (tmp_path / "w.gguf").exists()
    assert not partial.exists() or not partial.read_bytes().strip(b"\0")  # no byte of a 200 body written


def test_planted_lock_symlink_is_refused_and_its_target_untouched(hub, tmp_path):
    client = HubClient(hub.emulator.hub_url)
    manifest = build_manifest(client, REPO, "main", ["config.json"])
    victim = tmp_path / "victim.conf"
    victim.write_bytes(b"precious\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / LOCK).symlink_to(victim)
    with pytest.raises(FetchError, match=rf"{LOCK}: is a symlink"):
        fetch_payload(client, manifest, str(dest))
    assert victim.read_bytes() == b"precious\n"
