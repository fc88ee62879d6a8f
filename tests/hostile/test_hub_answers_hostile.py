"""Hostile Hub or mirror answers, from a small HTTP server of the test's own on 127.0.0.1: endless
or looping pagination, oversized or deeply nested JSON, sizes that are no byte count and tree paths
that would leave the destination. Each is refused with a HubError naming the URL and the field, in
bounded requests and time, before anything reaches a manifest (see README.md for the finding each
case proves)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload import hub_client
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import build_manifest
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient, HubError

REPO = "frank/hostile"
COMMIT = "c" * 40
TREE = f"/api/models/{REPO}/tree/{COMMIT}"
# A server that answers this many requests, then 500: code that would follow a hostile answer
# forever fails the test on the 500 instead of hanging it.
REQUEST_BUDGET = 200


class HostileHub:
    """revision -> COMMIT; the tree and HEAD answers are the test's (`tree`, `link`, `head`)."""

    def __init__(self) -> None:
        self.tree_body: bytes = b"[]"
        self.pages: dict[int, bytes] = {}  # cursor -> that page's body, else tree_body
        self.link = None  # callable(cursor) -> the Link header's URL, or None
        self.head_headers: dict[str, str] = {}
        self.head_status = 302
        self.requests: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status, headers, body=b""):
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                owner.requests.append(f"{self.command} {self.path}")
                if len(owner.requests) > REQUEST_BUDGET:
                    self._send(500, {"Content-Length": "6"}, b"budget")
                    return
                path, _sep, query = self.path.partition("?")
                if path == f"/api/models/{REPO}/revision/main":
                    body = json.dumps({"sha": COMMIT}).encode()
                    self._send(200, {"Content-Type": "application/json", "Content-Length": str(len(body))}, body)
                elif path == TREE:
                    cursor = int(dict(p.split("=") for p in query.split("&") if "=" in p).get("cursor", 0))
                    body = owner.pages.get(cursor, owner.tree_body)
                    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
                    next_url = owner.link(cursor) if owner.link else None
                    if next_url:
                        headers["Link"] = f'<{next_url}>; rel="next"'
                    self._send(200, headers, body)
                elif "/resolve/" in path:
                    self._send(owner.head_status, {"Location": "/cdn/x", **owner.head_headers})
                else:
                    self._send(404, {"Content-Length": "0"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def files(self, *entries: dict) -> None:
        self.tree_body = json.dumps(list(entries)).encode()


@pytest.fixture
def hostile():
    server = HostileHub()
    yield server
    server.server.shutdown()
    server.server.server_close()


def _file(path: str, size: int = 4, **extra) -> dict:
    return {"type": "file", "path": path, "size": size, "oid": "0" * 40, **extra}


def test_a_self_referencing_next_page_is_read_once(hostile):
    # Before: followed forever (401 requests and 281 MiB RSS when the reviewer stopped it).
    hostile.files(_file("config.json"))
    hostile.link = lambda cursor: f"{hostile.url}{TREE}?recursive=true"
    with pytest.raises(
        HubError, match=r"GET http://127\.0\.0\.1:\d+/api/models/frank/hostile/tree/c+\?recursive=true: its Link rel=next points back to a page already read"
    ):
        HubClient(hostile.url).list_tree(REPO, COMMIT)
    assert len(hostile.requests) == 1


def test_endless_distinct_pages_stop_at_the_page_cap(hostile, monkeypatch):
    monkeypatch.setattr(hub_client, "MAX_TREE_PAGES", 20, raising=False)
    hostile.files()  # empty pages, each with a new next page
    hostile.link = lambda cursor: f"{hostile.url}{TREE}?recursive=true&cursor={cursor + 1}"
    with pytest.raises(HubError, match=r"tree of frank/hostile@c+: more than 20 pages \(MAX_TREE_PAGES\)"):
        HubClient(hostile.url).list_tree(REPO, COMMIT)
    assert len(hostile.requests) == 20


def test_a_next_page_on_another_origin_is_refused(hostile):
    hostile.files(_file("config.json"))
    hostile.link = lambda cursor: "http://169.254.169.254/latest/meta-data?cursor=1"
    with pytest.raises(HubError, match=r"Link rel=next leads off the Hub's origin to http://169\.254\.169\.254/"):
        HubClient(hostile.url).list_tree(REPO, COMMIT)


def test_a_json_body_over_the_bound_is_refused_unparsed(hostile, monkeypatch):
    monkeypatch.setattr(hub_client, "MAX_JSON_BYTES", 64 << 10, raising=False)
    hostile.files(*[_file(f"f{i}.bin") for i in range(5000)])  # about 400 KiB of valid JSON
    with pytest.raises(HubError, match=r"tree/c+\?recursive=true: the answer is more than 65536 bytes \(MAX_JSON_BYTES\)"):
        HubClient(hostile.url).list_tree(REPO, COMMIT)


def test_too_many_tree_entries_are_refused(hostile, monkeypatch):
    monkeypatch.setattr(hub_client, "MAX_TREE_ENTRIES", 100, raising=False)
    hostile.files(*[_file(f"f{i}.bin") for i in range(101)])
    with pytest.raises(HubError, match=r"tree of frank/hostile@c+: more than 100 entries \(MAX_TREE_ENTRIES\)"):
        HubClient(hostile.url).list_tree(REPO, COMMIT)


def test_deeply_nested_json_is_a_hub_error(hostile):
    hostile.tree_body = b"[" * 200_000 + b"]" * 200_000
    with pytest.raises(HubError, match=r"expected JSON from a Hugging Face Hub, got .*nested too deep"):
        HubClient(hostile.url).list_tree(REPO, COMMIT)


@pytest.mark.parametrize(
    "path",
    ["../../etc/cron.d/evil", "/etc/cron.d/evil", "a/../../b", "a//b", "./x", "", "a\\b", "C:/x", "a/\x1b[31mred", "a\nb", "a\x7fb", "x" * 5000],
    ids=["dotdot", "absolute", "inner-dotdot", "empty-segment", "dot", "empty", "backslash", "drive", "escape", "newline", "del", "too-long"],
)
def test_a_tree_path_that_could_leave_the_destination_is_refused_where_it_is_read(hostile, path):
    # Before: written into the manifest, refused only when the manifest was loaded again.
    hostile.files(_file("config.json"), _file(path))
    with pytest.raises(HubError, match=r"GET http://127\.0\.0\.1:\d+/api/models/frank/hostile/tree/c+\?recursive=true: tree entry 1 path .*") as info:
        build_manifest(HubClient(hostile.url), REPO, "main")
    assert "check the endpoint (HF_ENDPOINT)" in str(info.value)
    assert not [r for r in hostile.requests if r.startswith("HEAD")], "refused before any file is probed"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        pytest.param(_file("m.bin", size=-5), r"tree entry 0 \(m\.bin\) size -5 is not a whole, non-negative byte count", id="size-negative"),
        pytest.param(_file("m.bin", size="4"), r"tree entry 0 \(m\.bin\) size '4' is not a whole, non-negative byte count", id="size-string"),
        pytest.param(_file("m.bin", lfs="x"), r"tree entry 0 \(m\.bin\) lfs is 'x', expected a mapping", id="lfs-string"),
        pytest.param(_file("m.bin", lfs={"oid": "a" * 64, "size": 1.5}), r"tree entry 0 \(m\.bin\) lfs\.size 1\.5 is not a whole", id="lfs-size-float"),
        pytest.param(_file("m.bin", oid=["x"]), r"tree entry 0 \(m\.bin\) oid is \['x'\], expected a string", id="oid-list"),
        pytest.param({"type": "file", "path": "m.bin", "size": 4, "oid": "0" * 40, "x": 1} | {"path": "m.bin"}, None, id="extra-key-is-fine"),
    ],
)
def test_a_tree_entry_whose_size_or_digest_is_no_value_is_refused(hostile, entry, message):
    hostile.files(entry)
    client = HubClient(hostile.url)
    if message is None:
        assert [e["path"] for e in client.list_tree(REPO, COMMIT)] == ["m.bin"]
        return
    with pytest.raises(HubError, match=message):
        client.list_tree(REPO, COMMIT)


def test_a_duplicate_tree_path_is_refused(hostile):
    hostile.files(_file("m.bin"), _file("m.bin", size=5))
    with pytest.raises(HubError, match=r"tree entry 1 path 'm\.bin' is listed twice"):
        HubClient(hostile.url).list_tree(REPO, COMMIT)


@pytest.mark.parametrize(
    ("status", "headers", "message"),
    [
        pytest.param(
            302, {"X-Linked-Size": "abc"}, r"HEAD .*/resolve/c+/m\.bin: X-Linked-Size 'abc' is not a whole, non-negative byte count", id="linked-size-abc"
        ),
        pytest.param(302, {"X-Linked-Size": "-5"}, r"X-Linked-Size '-5' is not a whole, non-negative byte count", id="linked-size-negative"),
        pytest.param(302, {"X-Linked-Size": "4.0"}, r"X-Linked-Size '4\.0' is not a whole", id="linked-size-float"),
        pytest.param(302, {"X-Linked-Size": "9" * 30}, r"X-Linked-Size '9+' is not a whole, non-negative byte count", id="linked-size-huge"),
        pytest.param(
            200, {"Content-Length": "-5"}, r"HEAD .*/resolve/c+/m\.bin: Content-Length '-5' is not a whole, non-negative byte count", id="direct-negative"
        ),
        pytest.param(200, {}, r"HEAD .*/resolve/c+/m\.bin: no Content-Length", id="direct-missing"),
    ],
)
def test_a_size_that_is_no_byte_count_never_reaches_the_manifest(hostile, status, headers, message):
    # Before: 'abc' was a ValueError traceback, -5 and a missing length (-1) went into the manifest.
    hostile.files({"type": "file", "path": "m.bin", "oid": "0" * 40})
    hostile.head_status, hostile.head_headers = status, headers
    started = time.monotonic()
    with pytest.raises(HubError, match=message):
        build_manifest(HubClient(hostile.url), REPO, "main")
    assert time.monotonic() - started < 10


def test_a_revision_answer_whose_sha_is_no_string_is_a_hub_error(hostile, monkeypatch):
    client = HubClient(hostile.url)
    monkeypatch.setattr(client, "get_json", lambda url: ({"sha": 5}, None))
    with pytest.raises(HubError, match=r"frank/hostile@main: the Hub reported no commit sha"):
        client.resolve_commit(REPO, "main")


def test_the_bounds_leave_a_real_paginated_tree_alone(hostile):
    hostile.pages = {cursor: json.dumps([_file(f"dir/f{cursor}.bin")]).encode() for cursor in range(3)}
    # Relative next links, as a mirror may write them, on the Hub's own origin.
    hostile.link = lambda cursor: f"{TREE}?recursive=true&cursor={cursor + 1}" if cursor < 2 else None
    listed = HubClient(hostile.url).list_tree(REPO, COMMIT)
    assert [e["path"] for e in listed] == ["dir/f0.bin", "dir/f1.bin", "dir/f2.bin"]
    assert len(hostile.requests) == 3
