#!/usr/bin/env python3
"""A Hugging Face Hub emulator: real HTTP on loopback, for tests, benchmarks and the lab.

It behaves like the Hub where payload fetching depends on it:
- `GET /api/models/{repo}[/revision/{rev}]` (model_info), `/api/models/{repo}/tree/{rev}[/{path}]`
  (`lfs.oid` is the sha256, `oid` the git blob sha, `Link` pagination) and
  `POST /api/models/{repo}/paths-info/{rev}` (get_paths_info: the tree entries of the named paths);
- `HEAD|GET /{repo}/resolve/{rev}/{path}`:
  * LFS file: 302 to the LFS CDN (another listener, so another host:port) with `X-Linked-Size`,
    `X-Linked-Etag` (the sha256) and `X-Repo-Commit`; the 302's own ETag is the pointer's blob sha;
  * Xet-style file: the same 302 headers, to a Xet-style CDN whose ETag is a content hash that is
    NOT the sha256 and which answers 400 to `Range: bytes=0-`;
  * plain git file: a relative 307 to `/api/resolve-cache/...` without `X-Linked-Size`; the final
    200 carries the git blob sha as ETag;
- gated repos answer 401 to API and resolve requests without the right bearer token;
- ranges: 206 with Content-Range, 416 on a range that starts at or past the end;
- a mirror mode (`mirror = True`): resolve answers 200 with the body itself, no redirect and no
  `X-Linked-*` headers, as some mirrors and proxies do;
- injectable faults per file: cut the connection after N body bytes, or sleep between chunks;
- like a CDN, a rate limit per connection (`per_connection_rate`, bytes/s) and one for all
  connections together (`aggregate_rate`); `bytes_served` counts the body bytes sent per file;
- bodies are sent with os.sendfile, so a client is what a benchmark measures.

Run standalone: `python lab/hub_emulator.py --serve DIR` serves DIR's files as repo `lab/payload`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlparse

CHUNK = 1 << 20


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK * 8), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Fault:
    cut_after: int | None = None  # close the connection after this many body bytes
    delay: float = 0.0  # seconds between chunks
    times: int = 1  # how many responses the fault applies to (then it is spent)


@dataclass
class HubFile:
    path: str
    source: Path
    kind: str  # lfs | xet | git
    size: int
    sha256: str
    blob_sha: str
    xet_hash: str


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile] = field(default_factory=dict)
    token: str | None = None  # gated when set

    @property
    def commit(self) -> str:
        listing = "\n".join(f"{f.path}:{f.sha256}" for f in sorted(self.files.values(), key=lambda f: f.path))
        return hashlib.sha1(f"{self.repo_id}\n{listing}".encode()).hexdigest()


@dataclass
class SeenRequest:
    server: str  # hub | lfs | xet
    method: str
    path: str
    headers: dict[str, str]


class HubEmulator:
    def __init__(self, host: str = "127.0.0.1", page_size: int = 1000, per_connection_rate: float | None = None, aggregate_rate: float | None = None) -> None:
        self.host = host
        self.page_size = page_size
        self.per_connection_rate = per_connection_rate
        self.aggregate_rate = aggregate_rate
        self.mirror = False
        self.bytes_served: dict[str, int] = {}
        self._aggregate_next = 0.0
        self.repos: dict[str, HubRepo] = {}
        self.faults: dict[str, Fault] = {}
        self.requests: list[SeenRequest] = []
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []
        self.hub_url = self.lfs_url = self.xet_url = ""

    # --- content ---------------------------------------------------------------------------

    def add_file(self, repo_id: str, path: str, source: Path | bytes, kind: str = "lfs", workdir: Path | None = None) -> HubFile:
        if kind not in ("lfs", "xet", "git"):
            raise ValueError(f"kind: lfs, xet or git, not {kind!r}")
        repo = self.repos.setdefault(repo_id, HubRepo(repo_id))
        if isinstance(source, bytes):
            if workdir is None:
                raise ValueError("bytes content needs a workdir to live in")
            target = Path(workdir) / "hub-content" / repo_id / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source)
            source = target
        source = Path(source)
        size = source.stat().st_size
        sha = sha256_file(source)
        if kind == "git":
            blob = git_blob_sha(source.read_bytes())
        else:
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n".encode()
            blob = git_blob_sha(pointer)
        xet = hashlib.sha256(b"xet-merkle:" + sha.encode()).hexdigest()
        hub_file = HubFile(path, source, kind, size, sha, blob, xet)
        repo.files[path] = hub_file
        return hub_file

    def gate(self, repo_id: str, token: str) -> None:
        self.repos.setdefault(repo_id, HubRepo(repo_id)).token = token

    def inject(self, path: str, fault: Fault) -> None:
        self.faults[path] = fault

    def _take_fault(self, path: str) -> Fault | None:
        with self._lock:
            fault = self.faults.get(path)
            if fault is None:
                return None
            fault.times -= 1
            if fault.times <= 0:
                del self.faults[path]
            return fault

    def _served(self, path: str, count: int) -> None:
        with self._lock:
            self.bytes_served[path] = self.bytes_served.get(path, 0) + count

    def _aggregate_slot(self, count: int) -> float:
        """When `count` more bytes may leave under the aggregate cap (a shared timeline)."""
        with self._lock:
            start = max(time.monotonic(), self._aggregate_next)
            self._aggregate_next = start + count / self.aggregate_rate
            return start

    def _record(self, server: str, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.requests.append(SeenRequest(server, handler.command, handler.path, dict(handler.headers.items())))

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> HubEmulator:
        for role in ("hub", "lfs", "xet"):
            server = ThreadingHTTPServer((self.host, 0), _make_handler(self, role))
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"hub-emulator-{role}", daemon=True).start()
            self._servers.append(server)
            setattr(self, f"{role}_url", f"http://{self.host}:{server.server_address[1]}")
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()

    def __enter__(self) -> HubEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- lookups ---------------------------------------------------------------------------

    def by_sha(self, sha: str) -> HubFile | None:
        return self._find(lambda hub_file: hub_file.sha256 == sha)

    def by_xet(self, xet: str) -> HubFile | None:
        return self._find(lambda hub_file: hub_file.xet_hash == xet)

    def _find(self, match) -> HubFile | None:
        for repo in self.repos.values():
            for hub_file in repo.files.values():
                if match(hub_file):
                    return hub_file
        return None


def _make_handler(emulator: HubEmulator, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        pass

    Handler.emulator = emulator
    Handler.role = role
    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    emulator: HubEmulator
    role: str

    def log_message(self, format: str, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self._connection_next = 0.0  # the per-connection timeline: one handler serves one connection

    # --- plumbing --------------------------------------------------------------------------

    def handle(self) -> None:
        # Clients that hang up mid-request (a cut, a refused resume) are normal here.
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            super().handle()

    def _send(self, status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, status: int, data: object, headers: dict[str, str] | None = None) -> None:
        self._send(status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(data).encode())

    def _error(self, status: int, message: str) -> None:
        # A body that must never end up in a payload file.
        self._json(status, {"error": message}, {"X-Error-Message": message})

    def _authorised(self, repo: HubRepo) -> bool:
        if repo.token is None:
            return True
        return self.headers.get("Authorization") == f"Bearer {repo.token}"

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        self.emulator._record(self.role, self)
        url = urlparse(self.path)
        path = unquote(url.path)
        try:
            if self.command == "POST":
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(min(length, 1 << 20)).decode("utf-8", "replace"))
                if self.role == "hub":
                    self._hub_post(path, form)
                else:
                    self._error(405, "POST is for the Hub's API")
            elif self.role == "hub":
                self._hub(path, parse_qs(url.query))
            else:
                self._cdn(path)
        except (BrokenPipeError, ConnectionResetError):
            pass

    # --- the Hub ---------------------------------------------------------------------------

    def _hub(self, path: str, query: dict[str, list[str]]) -> None:
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and "revision" in parts:
            at = parts.index("revision")
            return self._revision("/".join(parts[2:at]), "/".join(parts[at + 1 :]))
        if parts[:2] == ["api", "models"] and len(parts) == 4:
            return self._revision(f"{parts[2]}/{parts[3]}", "main")
        if parts[:2] == ["api", "models"] and "tree" in parts:
            at = parts.index("tree")
            repo_id = "/".join(parts[2:at])
            rev, sub = parts[at + 1], "/".join(parts[at + 2 :])
            return self._tree(repo_id, rev, sub, query)
        if parts[:3] == ["api", "resolve-cache", "models"]:
            # /api/resolve-cache/models/{owner}/{name}/{commit}/{path...}
            return self._serve_git(f"{parts[3]}/{parts[4]}", parts[5], "/".join(parts[6:]))
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        self._error(404, f"no route for {path}")

    def _hub_post(self, path: str, form: dict[str, list[str]]) -> None:
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "paths-info":
            repo_id, rev = f"{parts[2]}/{parts[3]}", "/".join(parts[5:])
            repo = self._repo_or_error(repo_id, rev)
            if repo is None:
                return
            wanted = [p for value in form.get("paths", []) for p in value.split(",")] if form.get("paths") else []
            self._json(200, [_tree_entry(repo.files[p]) for p in wanted if p in repo.files])
            return
        self._error(404, f"no route for POST {path}")

    def _repo_or_error(self, repo_id: str, rev: str) -> HubRepo | None:
        repo = self.emulator.repos.get(repo_id)
        if repo is None:
            self._error(404, f"Repository not found: {repo_id}")
            return None
        if not self._authorised(repo):
            self._error(401, f"Access to model {repo_id} is restricted. You must have access to it and be authenticated.")
            return None
        if rev not in ("main", repo.commit):
            self._error(404, f"Revision not found: {rev}")
            return None
        return repo

    def _revision(self, repo_id: str, rev: str) -> None:
        repo = self._repo_or_error(repo_id, rev)
        if repo is None:
            return
        siblings = [{"rfilename": p, "size": repo.files[p].size} for p in sorted(repo.files)]
        info = {"_id": repo.commit[:24], "id": repo_id, "modelId": repo_id, "sha": repo.commit, "siblings": siblings, "private": False}
        self._json(200, {**info, "gated": "manual" if repo.token is not None else False, "disabled": False, "downloads": 0, "likes": 0, "tags": []})

    def _tree(self, repo_id: str, rev: str, sub: str, query: dict[str, list[str]]) -> None:
        repo = self._repo_or_error(repo_id, rev)
        if repo is None:
            return
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        prefix = f"{sub}/" if sub else ""
        entries: dict[str, dict] = {}
        for hub_file in sorted(repo.files.values(), key=lambda f: f.path):
            if not hub_file.path.startswith(prefix):
                continue
            rest = hub_file.path[len(prefix) :]
            if "/" in rest:
                # Directories appear as entries of their own.
                dirs = rest.split("/")[:-1]
                depth = len(dirs) if recursive else 1
                for level in range(1, depth + 1):
                    dir_path = prefix + "/".join(dirs[:level])
                    entries.setdefault(dir_path, {"type": "directory", "oid": git_blob_sha(dir_path.encode()), "size": 0, "path": dir_path})
                if not recursive:
                    continue
            entries[hub_file.path] = _tree_entry(hub_file)
        items = list(entries.values())
        cursor = int(query.get("cursor", ["0"])[0])
        page = items[cursor : cursor + self.emulator.page_size]
        headers = {}
        if cursor + self.emulator.page_size < len(items):
            base = f"{self.emulator.hub_url}/api/models/{repo_id}/tree/{rev}" + (f"/{quote(sub)}" if sub else "")
            headers["Link"] = f'<{base}?recursive={str(recursive).lower()}&cursor={cursor + self.emulator.page_size}>; rel="next"'
        self._json(200, page, headers)

    def _resolve(self, repo_id: str, rev: str, path: str) -> None:
        repo = self._repo_or_error(repo_id, rev)
        if repo is None:
            return
        hub_file = repo.files.get(path)
        if hub_file is None:
            self._error(404, f"Entry not found: {path}")
            return
        common = {"X-Repo-Commit": repo.commit}
        if self.emulator.mirror:
            self._body(hub_file, {**common, "Accept-Ranges": "bytes"})
            return
        if hub_file.kind == "git":
            location = f"/api/resolve-cache/models/{repo_id}/{repo.commit}/{quote(path)}"
            self._send(307, {**common, "Location": location, "ETag": f'"{hub_file.blob_sha}"'})
            return
        cdn = self.emulator.lfs_url if hub_file.kind == "lfs" else self.emulator.xet_url
        key = hub_file.sha256 if hub_file.kind == "lfs" else hub_file.xet_hash
        headers = {
            **common,
            "Location": f"{cdn}/{hub_file.kind}/{key}?X-Amz-Signature=emulated",
            "X-Linked-Size": str(hub_file.size),
            "X-Linked-Etag": f'"{hub_file.sha256}"',
            "ETag": f'"{hub_file.blob_sha}"',
        }
        self._send(302, headers)

    def _serve_git(self, repo_id: str, commit: str, path: str) -> None:
        repo = self._repo_or_error(repo_id, commit)
        if repo is None:
            return
        hub_file = repo.files.get(path)
        if hub_file is None or hub_file.kind != "git":
            self._error(404, f"Entry not found: {path}")
            return
        self._body(hub_file, {"X-Repo-Commit": repo.commit, "ETag": f'"{hub_file.blob_sha}"'})

    # --- the CDNs --------------------------------------------------------------------------

    def _cdn(self, path: str) -> None:
        parts = path.strip("/").split("/")
        if len(parts) != 2 or parts[0] != self.role:
            self._error(404, "no such object")
            return
        hub_file = self.emulator.by_sha(parts[1]) if self.role == "lfs" else self.emulator.by_xet(parts[1])
        if hub_file is None:
            self._error(404, "no such object")
            return
        if self.role == "xet" and self.headers.get("Range", "").replace(" ", "") == "bytes=0-":
            self._error(400, "Invalid range: bytes=0-")
            return
        etag = hub_file.sha256 if self.role == "lfs" else hub_file.xet_hash
        self._body(hub_file, {"ETag": f'"{etag}"', "Accept-Ranges": "bytes"})

    def _body(self, hub_file: HubFile, headers: dict[str, str]) -> None:
        start, end = 0, hub_file.size - 1
        status = 200
        wanted = self.headers.get("Range")
        if wanted:
            try:
                unit, _eq, spec = wanted.partition("=")
                first, _dash, last = spec.partition("-")
                if unit.strip() != "bytes":
                    raise ValueError(unit)
                start = int(first)
                end = int(last) if last else hub_file.size - 1
            except ValueError:
                self._error(400, f"Invalid range: {wanted}")
                return
            if start >= hub_file.size:
                self._send(416, {"Content-Range": f"bytes */{hub_file.size}", **headers})
                return
            end = min(end, hub_file.size - 1)
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{hub_file.size}"}
        length = end - start + 1
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if self.command == "HEAD":
            return
        fault = self.emulator._take_fault(hub_file.path)
        self._sendfile(hub_file.source, start, length, fault, hub_file.path)

    def _pace(self, count: int) -> None:
        """Wait until `count` more bytes fit both caps: this connection's, then everyone's."""
        emulator = self.emulator
        if emulator.per_connection_rate:
            start = max(time.monotonic(), self._connection_next)
            self._connection_next = start + count / emulator.per_connection_rate
            time.sleep(max(0.0, start - time.monotonic()))
        if emulator.aggregate_rate:
            time.sleep(max(0.0, emulator._aggregate_slot(count) - time.monotonic()))

    def _sendfile(self, source: Path, offset: int, length: int, fault: Fault | None, path: str = "") -> None:
        limit = length if fault is None or fault.cut_after is None else min(length, fault.cut_after)
        sock = self.connection
        limited = self.emulator.per_connection_rate or self.emulator.aggregate_rate
        with open(source, "rb") as handle:
            sent = 0
            step = CHUNK if (fault and fault.delay) or limited else 64 * CHUNK
            while sent < limit:
                if limited:
                    self._pace(min(step, limit - sent))
                count = os.sendfile(sock.fileno(), handle.fileno(), offset + sent, min(step, limit - sent))
                if count == 0:
                    break
                sent += count
                self.emulator._served(path, count)
                if fault and fault.delay:
                    time.sleep(fault.delay)
        if sent < length:
            # The injected cut: the client sees the connection end before Content-Length.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            self.close_connection = True


def _tree_entry(hub_file: HubFile) -> dict:
    entry = {"type": "file", "oid": hub_file.blob_sha, "size": hub_file.size, "path": hub_file.path}
    if hub_file.kind != "git":
        entry["lfs"] = {"oid": hub_file.sha256, "size": hub_file.size, "pointerSize": 134}
    # No `xetHash`, unlike the Hub: the emulator does not speak Xet's CAS protocol, and a client that
    # sees one (snapshot_download) asks for a Xet read token instead of following the resolve redirect.
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", type=Path, required=True, help="directory whose files become repo lab/payload")
    parser.add_argument("--repo", default="lab/payload")
    parser.add_argument("--per-connection-mib-s", type=float, help="rate limit of each connection, MiB/s (like a CDN)")
    parser.add_argument("--aggregate-mib-s", type=float, help="rate limit of all connections together, MiB/s")
    args = parser.parse_args()
    per_connection = args.per_connection_mib_s * (1 << 20) if args.per_connection_mib_s else None
    aggregate = args.aggregate_mib_s * (1 << 20) if args.aggregate_mib_s else None
    emulator = HubEmulator(per_connection_rate=per_connection, aggregate_rate=aggregate)
    for path in sorted(p for p in args.serve.rglob("*") if p.is_file()):
        rel = path.relative_to(args.serve).as_posix()
        emulator.add_file(args.repo, rel, path, "lfs" if path.stat().st_size > 1 << 20 else "git")
    emulator.start()
    print(json.dumps({"hub_url": emulator.hub_url, "repo_id": args.repo, "commit": emulator.repos[args.repo].commit}), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        emulator.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
