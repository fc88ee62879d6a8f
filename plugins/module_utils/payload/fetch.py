# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fetch a payload: resumable, idempotent, verified while downloading, never losing data.

Per file:
- the final name is taken only when size and sha256 match; until then bytes live in `NAME.partial`;
- a file already at its final name, size and (stamped or recomputed) sha256 is skipped;
- a partial file resumes with `Range: bytes=N-` after hashing its existing prefix; a missing file
  is requested with no Range header (Xet CDNs answer 400 to `bytes=0-`); a 416 on a complete
  partial is success;
- an HTTP error never writes the response body: the status is checked before the file is opened;
- a sha256 or size mismatch moves the file aside to `NAME.rejected-<time>` and fails, unless
  `refetch` asks to fetch it again (the rejected copy is still kept for inspection);
- nothing the manifest does not name is touched: a `NAME.partial` that is a symlink or not a
  regular file is refused, never followed (O_NOFOLLOW), so a planted link cannot redirect the write;
- a body longer than the manifest size is cut at that size and refused: the partial is kept for
  inspection and never takes the final name.
Hashing runs in a second thread, overlapped with the network reads.
"""

from __future__ import annotations

import hashlib
import os
import queue
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient, HubError
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import Manifest, ManifestFile, destination_path, safe_relative_path
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import ProgressCallback, size_gate, stamped_sha256, write_stamp

READ_CHUNK = 4 << 20
PREFIX_CHUNK = 64 << 20


class FetchError(RuntimeError):
    pass


@dataclass
class FetchResult:
    path: str
    action: str  # skipped | fetched | resumed | completed | would_fetch | would_resume | failed
    size: int
    bytes_transferred: int = 0
    sha256: str | None = None
    detail: str = ""

    @property
    def changed(self) -> bool:
        return self.action in ("fetched", "resumed", "completed")

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"path": self.path, "action": self.action, "size": self.size, "bytes_transferred": self.bytes_transferred}
        if self.sha256:
            out["sha256"] = self.sha256
        if self.detail:
            out["detail"] = self.detail
        return out


class _Hasher:
    """sha256 in a worker thread: the download loop hands it buffers and moves on."""

    def __init__(self, digest: hashlib._Hash) -> None:
        self.digest = digest
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            block = self._queue.get()
            if block is None:
                return
            self.digest.update(block)

    def update(self, block: bytes) -> None:
        self._queue.put(block)

    def finish(self) -> str:
        self._queue.put(None)
        self._thread.join()
        return self.digest.hexdigest()


def _partial_size(partial: str) -> int:
    """Bytes already in NAME.partial (0 when there is none). A symlink or anything but a regular
    file is refused: following a planted link would overwrite the link's target."""
    try:
        info = os.lstat(partial)
    except FileNotFoundError:
        return 0
    if stat.S_ISLNK(info.st_mode):
        raise FetchError(f"{partial}: is a symlink, and a partial download is never written through one; remove it and run again")
    if not stat.S_ISREG(info.st_mode):
        raise FetchError(f"{partial}: is not a regular file; remove it and run again")
    return info.st_size


def _open_partial(partial: str, append: bool) -> BinaryIO:
    """Open NAME.partial for writing without following a symlink swapped in since _partial_size
    looked: append to it, truncate it, or create it exclusively when there is none."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    if append:
        flags |= os.O_APPEND
    elif os.path.lexists(partial):
        flags |= os.O_TRUNC
    else:
        flags |= os.O_CREAT | os.O_EXCL
    fd = os.open(partial, flags, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FetchError(f"{partial}: is not a regular file; remove it and run again")
    return os.fdopen(fd, "wb")


def _hash_prefix(path: str, length: int) -> hashlib._Hash:
    digest = hashlib.sha256()
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as handle:
        remaining = length
        while remaining:
            block = handle.read(min(PREFIX_CHUNK, remaining))
            if not block:
                raise FetchError(f"{path}: shorter than its recorded {length} bytes while hashing")
            digest.update(block)
            remaining -= len(block)
    return digest


def _set_aside(path: str, final: str) -> str:
    """Move a rejected file next to its final name, for inspection; never delete it."""
    aside = f"{final}.rejected-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    os.replace(path, aside)
    return aside


def _finalise(entry: ManifestFile, partial: str, final: str, sha256: str, dest: str) -> None:
    size = os.lstat(partial).st_size
    if size != entry.size:
        aside = _set_aside(partial, final)
        raise FetchError(f"{entry.path}: got {size} bytes, manifest says {entry.size}; kept aside as {os.path.basename(aside)}")
    if entry.sha256 and sha256 != entry.sha256:
        aside = _set_aside(partial, final)
        raise FetchError(f"{entry.path}: sha256 {sha256} != manifest {entry.sha256}; kept aside as {os.path.basename(aside)}")
    os.replace(partial, final)
    if entry.sha256:
        write_stamp(dest, entry.path, sha256)


def plan_file(entry: ManifestFile, dest: str) -> tuple[str, int]:
    """What fetch would do for this file, without doing it: (action, bytes to transfer)."""
    final = destination_path(dest, entry.path)
    if size_gate(entry, dest).ok and (not entry.sha256 or stamped_sha256(dest, entry.path) == entry.sha256):
        return "skipped", 0
    have = _partial_size(final + ".partial")
    if 0 < have <= entry.size:
        return "would_resume", entry.size - have
    return "would_fetch", entry.size


def fetch_file(
    client: HubClient,
    manifest: Manifest,
    entry: ManifestFile,
    dest: str,
    refetch: bool = False,
    progress: ProgressCallback | None = None,
) -> FetchResult:
    final = destination_path(dest, entry.path)
    partial = final + ".partial"
    os.makedirs(os.path.dirname(final), exist_ok=True)

    existing = size_gate(entry, dest)
    if existing.ok:
        # Complete under its final name: trust an unchanged stamp, else hash it once now.
        if not entry.sha256:
            return FetchResult(entry.path, "skipped", entry.size, detail="size matches (git file: no sha256 on the Hub)")
        stamped = stamped_sha256(dest, entry.path)
        actual = stamped or _hash_prefix(final, entry.size).hexdigest()
        if actual == entry.sha256:
            if not stamped:
                write_stamp(dest, entry.path, actual)
            return FetchResult(entry.path, "skipped", entry.size, 0, actual)
        if not refetch:
            raise FetchError(f"{entry.path}: present but sha256 {actual} != manifest {entry.sha256}; set refetch to fetch it again")
        _set_aside(final, final)
    elif existing.status in ("wrong_size", "not_regular", "symlink"):
        if not refetch:
            raise FetchError(f"{entry.path}: present but {existing.status} ({existing.detail or existing.actual_size}); set refetch to fetch it again")
        _set_aside(final, final)

    have = _partial_size(partial)
    if have > entry.size:
        _set_aside(partial, final)
        have = 0
    digest = _hash_prefix(partial, have) if have else hashlib.sha256()
    conn, response = client.open_download(manifest.repo_id, manifest.revision, entry.path, start=have, repo_type=manifest.repo_type)
    transferred = 0
    try:
        if response.status == 416:
            # A resume of a file that is already complete.
            response.read()
            if have != entry.size:
                raise FetchError(f"{entry.path}: the server refused range {have}- ({response.getheader('Content-Range')}) for a {entry.size}-byte file")
            _finalise(entry, partial, final, digest.hexdigest(), dest)
            return FetchResult(entry.path, "completed", entry.size, 0, digest.hexdigest(), "partial was complete (416)")
        if response.status == 200 and have:
            # The server ignored the range: start over rather than append a second copy.
            have, digest = 0, hashlib.sha256()
        elif response.status == 206:
            content_range = response.getheader("Content-Range") or ""
            if not content_range.startswith(f"bytes {have}-"):
                raise FetchError(f"{entry.path}: asked for bytes {have}-, got Content-Range {content_range!r}")
        hasher = _Hasher(digest)
        done = have
        try:
            with _open_partial(partial, append=bool(have)) as out:
                # Never past the manifest size: a server sending more cannot fill the disk.
                while done < entry.size:
                    block = response.read(min(READ_CHUNK, entry.size - done))
                    if not block:
                        break
                    out.write(block)
                    hasher.update(block)
                    transferred += len(block)
                    done += len(block)
                    if progress:
                        progress(entry.path, done, entry.size)
        finally:
            sha256 = hasher.finish()
        if done == entry.size and response.read(1):
            raise FetchError(
                f"{entry.path}: the server sends more than the manifest's {entry.size} bytes; stopped there, "
                f"{os.path.basename(partial)} is kept for inspection and never takes the final name (check the manifest's size)"
            )
        if done < entry.size:
            raise FetchError(f"{entry.path}: connection ended at {done} of {entry.size} bytes; the partial file is kept and the next run resumes it")
        _finalise(entry, partial, final, sha256, dest)
        return FetchResult(entry.path, "resumed" if have else "fetched", entry.size, transferred, sha256)
    except (OSError, HubError) as exc:
        raise FetchError(f"{entry.path}: {exc} (after {transferred} bytes; the partial file is kept)") from None
    finally:
        conn.close()


def fetch_payload(
    client: HubClient,
    manifest: Manifest,
    dest: str,
    workers: int = 2,
    refetch: bool = False,
    check_mode: bool = False,
    progress: ProgressCallback | None = None,
) -> list[FetchResult]:
    """Fetch every manifest file (in parallel, bounded). Failures are collected, not raised."""
    os.makedirs(dest, exist_ok=True)
    if check_mode:
        results = []
        for entry in manifest.files:
            try:
                action, todo = plan_file(entry, dest)
            except FetchError as exc:
                results.append(FetchResult(entry.path, "failed", entry.size, detail=str(exc)))
                continue
            results.append(FetchResult(entry.path, action, entry.size, todo))
        return results

    def one(entry: ManifestFile) -> FetchResult:
        try:
            return fetch_file(client, manifest, entry, dest, refetch, progress)
        except (FetchError, HubError, OSError) as exc:
            return FetchResult(entry.path, "failed", entry.size, detail=client.redact(str(exc)))

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, manifest.files))


def build_manifest(client: HubClient, repo_id: str, revision: str, paths: list[str] | None = None, repo_type: str = "model") -> Manifest:
    """Pin the revision to the Hub's commit, then describe exactly the wanted files.

    Sizes and sha256 come from the tree API and are cross-checked with a HEAD on each resolve URL
    (without following the CDN redirect): a 3xx with X-Linked-Size is LFS/Xet and its
    X-Linked-Etag/-Size are the truth; a 3xx without it is a git file (size only)."""
    commit = client.resolve_commit(repo_id, revision, repo_type)
    tree = {entry["path"]: entry for entry in client.list_tree(repo_id, commit, repo_type)}
    wanted = [safe_relative_path(p) for p in paths] if paths else sorted(tree)
    files = []
    for path in wanted:
        if path not in tree:
            raise HubError(f"{repo_id}@{commit}: {path} is not in the repository")
        probe = client.probe(repo_id, commit, path, repo_type)
        lfs = tree[path].get("lfs") or {}
        tree_sha = lfs.get("oid")
        if probe.kind == "lfs":
            if tree_sha and probe.sha256 and tree_sha != probe.sha256:
                raise HubError(f"{path}: tree says sha256 {tree_sha}, resolve says {probe.sha256}")
            files.append(ManifestFile(path, probe.size, probe.sha256 or tree_sha, True))
        else:
            files.append(ManifestFile(path, probe.size, None, False))
    return Manifest(repo_id, commit, files, repo_type)
