"""Hostile payload input: planted files, a lying or foreign server, unsafe manifests. Each case is
refused with an error that names the file or URL, and nothing outside the manifest is written
(see README.md for which finding each case proves)."""

import contextlib
import datetime
import ipaddress
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hub_payload import REPO, TOKEN

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import build_manifest, fetch_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient, HubError
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import Manifest, ManifestError, ManifestFile, destination_path, parse_manifest


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
    assert sorted(p.name for p in tmp_path.iterdir()) == []


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
            assert sorted(p.name for p in dest.iterdir()) == [f"{LFS_FILE}.partial"]


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
