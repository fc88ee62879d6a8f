# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A minimal Hugging Face Hub client for payloads, on http.client (stdlib only).

Why not urllib: redirects must be handled by hand. The resolve endpoint's 3xx carries the truth
(`X-Linked-Size`, `X-Linked-Etag` = the LFS sha256) that the CDN's final answer does not (a Xet
CDN's ETag is a Xet hash, not a sha256), and the token must reach only the Hub's origin (its
scheme, host and port), never a CDN and never the same host over plain http after a downgrade.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import ManifestError, safe_relative_path

DEFAULT_ENDPOINT = "https://huggingface.co"
MAX_REDIRECTS = 5
# Bounds on what a Hub or mirror may answer, each named in the error that refuses it.
MAX_JSON_BYTES = 32 << 20  # one API answer (a tree page of 1,000 entries is about 300 KiB)
MAX_TREE_PAGES = 1000  # pages of one tree listing (the Hub pages 1,000 entries at a time)
MAX_TREE_ENTRIES = 500_000  # entries of one tree listing, all pages together (the Hub caps a repo near 100,000 files)
MAX_PATH_BYTES = 1024  # one tree path, UTF-8
MAX_FILE_BYTES = 1 << 50  # one file's size (1 PiB; the largest payload parts are tens of GiB)
MAX_DISCARD_BYTES = 64 << 10  # a redirect's body, read to reuse its connection
_SIZE_RE = re.compile(r"^[0-9]{1,16}$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
USER_AGENT = "frank.llm_fleet-hf_payload_gate/0.1"
DEFAULT_PORTS = {"https": 443, "http": 80}


class HubError(RuntimeError):
    """An HTTP answer the payload gate cannot use; `status` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class FileProbe:
    """What the Hub says about one file, from a HEAD that does not follow the CDN redirect."""

    path: str
    kind: str  # lfs (incl. Xet-backed) | git | direct
    size: int
    sha256: str | None  # only from X-Linked-Etag; a git file's ETag is a blob sha, never a sha256
    commit: str | None


def endpoint_from_env(explicit: str | None = None) -> str:
    return (explicit or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) as a browser's same-origin rule compares them."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:  # a malformed port matches no origin
        port = -1
    return scheme, (parts.hostname or "").lower(), port


def _strip_etag(value: str | None) -> str | None:
    if not value:
        return None
    value = value.strip()
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"') or None


def _checked_size(value: Any, header: bool = False) -> int | None:
    """A whole, non-negative byte count within MAX_FILE_BYTES: digits in a header, an integer in JSON;
    None when it is none."""
    if header and isinstance(value, str):
        value = int(value) if _SIZE_RE.match(value.strip()) else None
    elif isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value is not None and 0 <= value <= MAX_FILE_BYTES else None


class HubClient:
    def __init__(self, endpoint: str | None = None, token: str | None = None, timeout: float = 60.0) -> None:
        self.endpoint = endpoint_from_env(endpoint)
        self._hub_origin = _origin(self.endpoint)
        self._token = token
        self.timeout = timeout
        self._ssl = ssl.create_default_context()

    def __repr__(self) -> str:  # never show the token
        return f"HubClient(endpoint={self.endpoint!r}, token={'set' if self._token else 'unset'})"

    # --- transport -------------------------------------------------------------------------

    def _headers_for(self, url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        # The token goes to the Hub's origin only: a CDN redirect target never sees it, nor does the
        # Hub's own host after a redirect from https down to http (the token would cross in clear).
        if self._token and _origin(url) == self._hub_origin:
            headers["Authorization"] = f"Bearer {self._token}"
        headers.update(extra or {})
        return headers

    def connect(self, url: str) -> http.client.HTTPConnection:
        """A new (not yet opened) connection to the URL's origin."""
        parts = urlsplit(url)
        if parts.scheme == "https":
            return http.client.HTTPSConnection(parts.netloc, timeout=self.timeout, context=self._ssl)
        if parts.scheme == "http":
            return http.client.HTTPConnection(parts.netloc, timeout=self.timeout)
        raise HubError(f"unsupported URL scheme in {self.redact(url)}")

    def send(self, conn: http.client.HTTPConnection, method: str, url: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
        """One request on `conn` (new or kept alive), no redirect following."""
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request(method, target or "/", headers=self._headers_for(url, headers))
            return conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise HubError(f"{method} {self.redact(url)}: {exc}") from None

    def request(self, method: str, url: str, headers: dict[str, str] | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """One request on a new connection, no redirect following. The caller reads and closes the response."""
        conn = self.connect(url)
        return conn, self.send(conn, method, url, headers)

    def redact(self, text: str) -> str:
        """Strip the token and any signed query from text bound for a log."""
        if self._token:
            text = text.replace(self._token, "***")
        return re.sub(r"\?.*$", "?…", text) if "Signature" in text else text

    def _error_from(self, response: http.client.HTTPResponse, what: str) -> HubError:
        # Read a little of the body for the message; it never goes near a payload file.
        detail = response.getheader("X-Error-Message") or response.read(512).decode("utf-8", "replace").strip()
        hint = ""
        if response.status in (401, 403):
            hint = " (gated or private repo: give a token with access, via HF_TOKEN or the module's token)"
        return HubError(f"{what}: HTTP {response.status}{hint}: {self.redact(detail)[:300]}", response.status)

    def get_json(self, url: str) -> tuple[Any, http.client.HTTPResponse]:
        for _hop in range(MAX_REDIRECTS):
            conn, response = self.request("GET", url)
            try:
                if response.status in (301, 302, 307, 308) and response.getheader("Location"):
                    url = urljoin(url, response.getheader("Location", ""))
                    continue  # the connection is closed, its body never read
                if response.status != 200:
                    raise self._error_from(response, f"GET {self.redact(url)}")
                return self._json_body(response, url), response
            finally:
                conn.close()
        raise HubError(f"GET {self.redact(url)}: too many redirects")

    def _json_body(self, response: http.client.HTTPResponse, url: str) -> Any:
        """The answer's JSON, read within MAX_JSON_BYTES (a Content-Length over it is refused unread)."""
        too_big = HubError(
            f"GET {self.redact(url)}: the answer is more than {MAX_JSON_BYTES} bytes (MAX_JSON_BYTES); "
            "no Hub API answer is that large: check the endpoint (HF_ENDPOINT)",
            response.status,
        )
        length = (response.getheader("Content-Length") or "").strip()
        if length.isdigit() and int(length) > MAX_JSON_BYTES:
            raise too_big
        try:
            body = response.read(MAX_JSON_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise HubError(f"GET {self.redact(url)}: {exc}") from None
        if len(body) > MAX_JSON_BYTES:
            raise too_big
        content_type = response.getheader("Content-Type") or "no Content-Type"
        try:
            return json.loads(body.decode("utf-8"))
        except RecursionError:
            raise HubError(
                self.redact(f"GET {url}: expected JSON from a Hugging Face Hub, got {content_type} nested too deep to read; check the endpoint (HF_ENDPOINT)"),
                response.status,
            ) from None
        except ValueError:  # JSONDecodeError and UnicodeDecodeError alike: a portal, a proxy, a wrong endpoint
            raise HubError(
                self.redact(f"GET {url}: expected JSON from a Hugging Face Hub, got {content_type} starting {body[:120]!r}; check the endpoint (HF_ENDPOINT)"),
                response.status,
            ) from None

    # --- the API ---------------------------------------------------------------------------

    def _repo_path(self, repo_id: str, repo_type: str = "model") -> str:
        prefix = {"model": "models", "dataset": "datasets", "space": "spaces"}[repo_type]
        return f"/api/{prefix}/{repo_id}"

    def resolve_commit(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> str:
        data, _response = self.get_json(f"{self.endpoint}{self._repo_path(repo_id, repo_type)}/revision/{quote(revision, safe='')}")
        commit = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(commit, str) or not re.match(r"^[0-9a-f]{40}$", commit):
            raise HubError(f"{repo_id}@{revision}: the Hub reported no commit sha")
        return commit

    def list_tree(self, repo_id: str, commit: str, repo_type: str = "model") -> list[dict[str, Any]]:
        """The file entries of the tree at `commit`, every page. The pages are bounded (MAX_TREE_PAGES,
        a next page already read, a next page off the Hub's origin) and so are the entries
        (MAX_TREE_ENTRIES); every file's path, size and digests are checked here, where they are read,
        so a path that would leave the destination never reaches a manifest."""
        url: str | None = f"{self.endpoint}{self._repo_path(repo_id, repo_type)}/tree/{commit}?recursive=true"
        entries: list[dict[str, Any]] = []
        seen_urls: set[str] = set()
        seen_paths: set[str] = set()
        count = 0
        while url:
            if len(seen_urls) >= MAX_TREE_PAGES:
                raise HubError(f"tree of {repo_id}@{commit}: more than {MAX_TREE_PAGES} pages (MAX_TREE_PAGES); check the endpoint (HF_ENDPOINT)")
            seen_urls.add(url)
            data, response = self.get_json(url)
            if not isinstance(data, list):
                raise HubError(f"GET {self.redact(url)}: expected a list of tree entries with a path each, got {str(data)[:120]}")
            count += len(data)
            if count > MAX_TREE_ENTRIES:
                raise HubError(f"tree of {repo_id}@{commit}: more than {MAX_TREE_ENTRIES} entries (MAX_TREE_ENTRIES); check the endpoint (HF_ENDPOINT)")
            for index, entry in enumerate(data):
                if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
                    raise HubError(f"GET {self.redact(url)}: expected a list of tree entries with a path each, got {str(entry)[:120]}")
                if entry.get("type") == "file":
                    entries.append(self._tree_file(entry, index, url, seen_paths))
            match = re.search(r'<([^>]+)>;\s*rel="next"', response.getheader("Link") or "")
            url = self._next_page(url, match.group(1), seen_urls) if match else None
        return entries

    def _next_page(self, url: str, link: str, seen: set[str]) -> str:
        following = urljoin(url, link)
        if _origin(following) != self._hub_origin:
            raise HubError(
                f"GET {self.redact(url)}: its Link rel=next leads off the Hub's origin to {self.redact(following)[:200]}; check the endpoint (HF_ENDPOINT)"
            )
        if following in seen:
            raise HubError(
                f"GET {self.redact(url)}: its Link rel=next points back to a page already read ({self.redact(following)[:200]}); "
                "check the endpoint (HF_ENDPOINT)"
            )
        return following

    def _tree_file(self, entry: dict[str, Any], index: int, url: str, seen: set[str]) -> dict[str, Any]:
        """One file entry, checked: a safe relative path listed once, whole non-negative sizes, string digests."""
        where = f"GET {self.redact(url)}: tree entry {index}"
        path = entry["path"]
        problem = None
        if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
            problem = f"is longer than {MAX_PATH_BYTES} bytes (MAX_PATH_BYTES)"
        elif _CONTROL_RE.search(path):
            problem = "contains a control character"
        else:
            try:
                safe_relative_path(path)
            except ManifestError as exc:
                problem = str(exc).split(": ", 1)[-1]
        if problem:
            raise HubError(f"{where} path {path[:80]!r} {problem}; a Hub never lists such a path: check the endpoint (HF_ENDPOINT)")
        if path in seen:
            raise HubError(f"{where} path {path!r} is listed twice; check the endpoint (HF_ENDPOINT)")
        seen.add(path)
        named = f"{where} ({path})"
        if "size" in entry and _checked_size(entry["size"]) is None:
            raise HubError(
                f"{named} size {entry['size']!r} is not a whole, non-negative byte count (at most {MAX_FILE_BYTES}); check the endpoint (HF_ENDPOINT)"
            )
        oid = entry.get("oid")
        if oid is not None and not isinstance(oid, str):
            raise HubError(f"{named} oid is {repr(oid)[:60]}, expected a string; check the endpoint (HF_ENDPOINT)")
        lfs = entry.get("lfs")
        if lfs is not None:
            if not isinstance(lfs, dict):
                raise HubError(f"{named} lfs is {repr(lfs)[:60]}, expected a mapping; check the endpoint (HF_ENDPOINT)")
            if "size" in lfs and _checked_size(lfs["size"]) is None:
                raise HubError(f"{named} lfs.size {lfs['size']!r} is not a whole, non-negative byte count; check the endpoint (HF_ENDPOINT)")
            if lfs.get("oid") is not None and not isinstance(lfs["oid"], str):
                raise HubError(f"{named} lfs.oid is {repr(lfs['oid'])[:60]}, expected a string; check the endpoint (HF_ENDPOINT)")
        return entry

    def resolve_url(self, repo_id: str, commit: str, path: str, repo_type: str = "model") -> str:
        prefix = {"model": "", "dataset": "datasets/", "space": "spaces/"}[repo_type]
        return f"{self.endpoint}/{prefix}{repo_id}/resolve/{commit}/{quote(path)}"

    def probe(self, repo_id: str, commit: str, path: str, repo_type: str = "model") -> FileProbe:
        """HEAD the resolve URL without following the CDN redirect, and classify the file."""
        url = self.resolve_url(repo_id, commit, path, repo_type)
        conn, response = self.request("HEAD", url)
        try:
            response.read()
            status = response.status
            headers = {k.lower(): v for k, v in response.getheaders()}
        finally:
            conn.close()
        commit_header = headers.get("x-repo-commit")
        if status in (301, 302, 303, 307, 308):
            if "x-linked-size" in headers:
                # LFS (Xet-backed or not): the redirect's X-Linked-* headers are the truth.
                size = self._size_header(headers["x-linked-size"], "X-Linked-Size", url)
                return FileProbe(path, "lfs", size, _strip_etag(headers.get("x-linked-etag")), commit_header)
            # A plain git file behind a redirect: follow once, trust its size only.
            location = urljoin(url, headers.get("location", ""))
            conn, response = self.request("HEAD", location)
            try:
                response.read()
                if response.status != 200:
                    raise self._error_from(response, f"HEAD {self.redact(location)}")
                size = self._size_header(response.getheader("Content-Length"), "Content-Length", location)
                commit_header = response.getheader("X-Repo-Commit") or commit_header
            finally:
                conn.close()
            return FileProbe(path, "git", size, None, commit_header)
        if status == 200:
            return FileProbe(path, "direct", self._size_header(headers.get("content-length"), "Content-Length", url), None, commit_header)
        conn, response = self.request("GET", url)  # re-ask with a body, for the error message
        try:
            raise self._error_from(response, f"HEAD {self.redact(url)}")
        finally:
            conn.close()

    def _size_header(self, value: str | None, header: str, url: str) -> int:
        """A file size from a HEAD answer: whole, non-negative, within MAX_FILE_BYTES."""
        if value is None:
            raise HubError(f"HEAD {self.redact(url)}: no {header}, so the file's size is unknown; check the endpoint (HF_ENDPOINT)")
        size = _checked_size(value, header=True)
        if size is None:
            raise HubError(
                f"HEAD {self.redact(url)}: {header} {value[:40]!r} is not a whole, non-negative byte count (at most {MAX_FILE_BYTES}); "
                "check the endpoint (HF_ENDPOINT)"
            )
        return size

    def open_download(
        self, repo_id: str, commit: str, path: str, start: int = 0, repo_type: str = "model"
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """GET the file from `start`, following redirects by hand. No Range header when start is 0:
        Xet CDNs refuse `bytes=0-`. Returns an open 200/206/416 response; any other status raises
        without the body being handed to the caller."""
        url = self.resolve_url(repo_id, commit, path, repo_type)
        extra = {"Range": f"bytes={start}-"} if start > 0 else {}
        for _hop in range(MAX_REDIRECTS):
            conn, response = self.request("GET", url, extra)
            if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                url = urljoin(url, response.getheader("Location", ""))
                conn.close()  # its body is never read
                continue
            if response.status in (200, 206, 416):
                return conn, response
            error = self._error_from(response, f"GET {self.redact(url)}")
            conn.close()
            raise error
        raise HubError(f"GET {path}: too many redirects")

    def open_range(self, conns: dict[str, http.client.HTTPConnection], url: str, start: int, end: int) -> tuple[http.client.HTTPResponse, str]:
        """GET bytes start..end (inclusive) of `url`, following redirects by hand, on connections kept
        alive per origin in `conns` (one worker's own). Returns the open 206 response and the URL that
        answered it, so the next range goes straight there (the token still reaches the Hub's origin
        only: _headers_for decides per URL). Anything but a 206 raises without handing over the body."""
        for _hop in range(MAX_REDIRECTS):
            origin = _origin(url)
            conn = conns.get(origin)
            if conn is None:
                conn = conns[origin] = self.connect(url)
            try:
                response = self.send(conn, "GET", url, {"Range": f"bytes={start}-{end}"})
            except HubError:
                # A kept-alive connection the server closed meanwhile: retry once on a new one.
                conn = conns[origin] = self.connect(url)
                response = self.send(conn, "GET", url, {"Range": f"bytes={start}-{end}"})
            if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                url = urljoin(url, response.getheader("Location", ""))
                # Read the redirect's body to reuse the connection, unless it is larger than a redirect's.
                if len(response.read(MAX_DISCARD_BYTES + 1)) > MAX_DISCARD_BYTES or not response.isclosed():
                    conns.pop(origin).close()
                continue
            if response.status == 206:
                return response, url
            if response.status == 200:
                conns.pop(origin).close()
                raise HubError(f"GET {self.redact(url)}: the server ignores Range requests (HTTP 200 to bytes={start}-{end}); fetch with connections: 1", 200)
            error = self._error_from(response, f"GET {self.redact(url)} bytes={start}-{end}")
            conns.pop(origin).close()
            raise error
        raise HubError(f"GET {self.redact(url)}: too many redirects")
