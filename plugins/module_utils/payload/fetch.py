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
  inspection and never takes the final name;
- a git (non-LFS) file is proven by its git blob sha1 like an LFS file by its sha256: a same-size
  HTML page in place of config.json is refused;
- a file of at least two pieces is fetched over `connections` ranged connections (ranged.py);
- one fetch at a time per destination (a lock file), and never one that cannot fit: the free space
  is checked against the bytes still to come before any byte is asked for;
- every directory made, file opened for writing and name moved goes through the Host runner
  (host_runner.py): check mode plans and writes nothing, and the actions name each change. The
  bytes themselves are written through the descriptor it opened, outside it.
Hashing runs in a second thread, overlapped with the network reads.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import queue
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient, HubError
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import (
    Manifest,
    ManifestFile,
    destination_path,
    digest_fields,
    safe_relative_path,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.ranged import (
    PIECE_SIZE,
    RangedError,
    RangedFetch,
    pending_bytes,
    remove_state,
    state_path,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.structure import SplitCount, structure_problems
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import (
    ProgressCallback,
    hash_path,
    new_digest,
    size_gate,
    stamped_digest,
    write_stamp,
)

READ_CHUNK = 4 << 20
PREFIX_CHUNK = 64 << 20
LOCK_FILE = ".llm-fleet-fetch.lock"
DEFAULT_CONNECTIONS = 8  # measured: docs/hf_payload_gate.md, "Multi-connection fetch"


class FetchError(RuntimeError):
    """A file (or the whole fetch) that cannot be completed now; `transferred`: bytes this run wrote."""

    def __init__(self, message: str, transferred: int = 0) -> None:
        super().__init__(message)
        self.transferred = transferred


@dataclass
class FetchResult:
    path: str
    action: str  # skipped | fetched | resumed | completed | would_fetch | would_resume | failed
    size: int
    bytes_transferred: int = 0
    sha256: str | None = None
    detail: str = ""
    git_blob_sha1: str | None = None

    @property
    def changed(self) -> bool:
        return self.action in ("fetched", "resumed", "completed")

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"path": self.path, "action": self.action, "size": self.size, "bytes_transferred": self.bytes_transferred}
        out.update(digest_fields(self.sha256, self.git_blob_sha1))
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


def _open(host: Host, path: str, flags: int, mode: int = 0o644) -> int:
    fd = host.open_write(path, flags, mode)
    if fd is None:  # check mode plans (plan_file) and never opens a file
        raise FetchError(f"{path}: check mode plans a fetch and writes nothing")
    return fd


def _open_partial(partial: str, append: bool, host: Host) -> BinaryIO:
    """Open NAME.partial for writing without following a symlink swapped in since _partial_size
    looked: append to it, truncate it, or create it exclusively when there is none."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    if append:
        flags |= os.O_APPEND
    elif os.path.lexists(partial):
        flags |= os.O_TRUNC
    else:
        flags |= os.O_CREAT | os.O_EXCL
    fd = _open(host, partial, flags, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FetchError(f"{partial}: is not a regular file; remove it and run again")
    return os.fdopen(fd, "wb")


def _hash_prefix(path: str, length: int, digest: hashlib._Hash) -> hashlib._Hash:
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as handle:
        remaining = length
        while remaining:
            block = handle.read(min(PREFIX_CHUNK, remaining))
            if not block:
                raise FetchError(f"{path}: shorter than its recorded {length} bytes while hashing")
            digest.update(block)
            remaining -= len(block)
    return digest


def _set_aside(path: str, final: str, host: Host) -> str:
    """Move a rejected file next to its final name, for inspection; never delete it."""
    aside = f"{final}.rejected-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    host.move(path, aside)
    return aside


def _digests(entry: ManifestFile, actual: str) -> dict[str, str]:
    """The result fields naming the proven digest (sha256 or git_blob_sha1)."""
    return {entry.digest[0]: actual} if entry.digest else {}


def _finalise(entry: ManifestFile, partial: str, final: str, actual: str, dest: str, host: Host) -> None:
    size = os.lstat(partial).st_size
    if size != entry.size:
        aside = _set_aside(partial, final, host)
        raise FetchError(f"{entry.path}: got {size} bytes, manifest says {entry.size}; kept aside as {os.path.basename(aside)}")
    if entry.digest and actual != entry.digest[1]:
        aside = _set_aside(partial, final, host)
        algorithm, expected = entry.digest
        raise FetchError(f"{entry.path}: {algorithm} {actual} != manifest {expected}; kept aside as {os.path.basename(aside)}")
    host.move(partial, final)
    if entry.digest:
        write_stamp(dest, entry.path, entry.digest[0], actual)


def _ranged(entry: ManifestFile, partial: str, connections: int, piece_size: int) -> bool:
    """A ranged fetch for this file: it is worth several connections, or one left its record."""
    return os.path.lexists(state_path(partial)) or (connections > 1 and entry.size >= 2 * piece_size)


def _to_fetch(entry: ManifestFile, final: str) -> int:
    """Bytes still to transfer for a file not complete under its final name (metadata only)."""
    partial = final + ".partial"
    try:
        pending = pending_bytes(partial, entry)
    except RangedError:
        pending = None
    if pending is not None:
        return pending
    have = _partial_size(partial)
    return entry.size - have if 0 < have <= entry.size else entry.size


def plan_file(entry: ManifestFile, dest: str) -> tuple[str, int]:
    """What fetch would do for this file, without doing it: (action, bytes to transfer)."""
    final = destination_path(dest, entry.path)
    if size_gate(entry, dest).ok and (not entry.digest or stamped_digest(dest, entry.path, entry.digest[0]) == entry.digest[1]):
        return "skipped", 0
    todo = _to_fetch(entry, final)
    return ("would_resume" if todo < entry.size else "would_fetch"), todo


def fetch_file(
    client: HubClient,
    manifest: Manifest,
    entry: ManifestFile,
    dest: str,
    refetch: bool = False,
    progress: ProgressCallback | None = None,
    connections: int = 1,
    piece_size: int = PIECE_SIZE,
    host: Host | None = None,
) -> FetchResult:
    host = host or Host.files_only()
    final = destination_path(dest, entry.path)
    partial = final + ".partial"
    host.makedirs(os.path.dirname(final), 0o777)

    existing = size_gate(entry, dest)
    if existing.ok:
        # Complete under its final name: trust an unchanged stamp, else hash it once now.
        if not entry.digest:
            return FetchResult(entry.path, "skipped", entry.size, detail="size matches (the manifest names no digest)")
        algorithm, expected = entry.digest
        stamped = stamped_digest(dest, entry.path, algorithm)
        actual = stamped or hash_path(final, new_digest(entry))
        if actual == expected:
            if not stamped:
                write_stamp(dest, entry.path, algorithm, actual)
            return FetchResult(entry.path, "skipped", entry.size, 0, **_digests(entry, actual))
        if not refetch:
            raise FetchError(f"{entry.path}: present but {algorithm} {actual} != manifest {expected}; set refetch to fetch it again")
        _set_aside(final, final, host)
    elif existing.status in ("wrong_size", "not_regular", "symlink"):
        if not refetch:
            raise FetchError(f"{entry.path}: present but {existing.status} ({existing.detail or existing.actual_size}); set refetch to fetch it again")
        _set_aside(final, final, host)

    have = _partial_size(partial)
    if have > entry.size:
        _set_aside(partial, final, host)
        remove_state(partial)
        have = 0
    if _ranged(entry, partial, connections, piece_size):
        return _fetch_ranged(client, manifest, entry, dest, partial, final, connections, piece_size, progress, host)
    digest = new_digest(entry) or hashlib.sha256()
    if have:
        _hash_prefix(partial, have, digest)
    conn, response = client.open_download(manifest.repo_id, manifest.revision, entry.path, start=have, repo_type=manifest.repo_type)
    transferred = 0
    try:
        if response.status == 416:
            # A resume of a file that is already complete.
            response.read()
            if have != entry.size:
                raise FetchError(f"{entry.path}: the server refused range {have}- ({response.getheader('Content-Range')}) for a {entry.size}-byte file")
            actual = digest.hexdigest()
            _finalise(entry, partial, final, actual, dest, host)
            return FetchResult(entry.path, "completed", entry.size, 0, detail="partial was complete (416)", **_digests(entry, actual))
        if response.status == 200 and have:
            # The server ignored the range: start over rather than append a second copy.
            have, digest = 0, new_digest(entry) or hashlib.sha256()
        elif response.status == 206:
            content_range = response.getheader("Content-Range") or ""
            if not content_range.startswith(f"bytes {have}-"):
                raise FetchError(f"{entry.path}: asked for bytes {have}-, got Content-Range {content_range!r}")
        hasher = _Hasher(digest)
        done = have
        try:
            with _open_partial(partial, append=bool(have), host=host) as out:
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
            actual = hasher.finish()
        if done == entry.size and response.read(1):
            raise FetchError(
                f"{entry.path}: the server sends more than the manifest's {entry.size} bytes; stopped there, "
                f"{os.path.basename(partial)} is kept for inspection and never takes the final name (check the manifest's size)"
            )
        if done < entry.size:
            raise FetchError(f"{entry.path}: connection ended at {done} of {entry.size} bytes; the partial file is kept and the next run resumes it")
        _finalise(entry, partial, final, actual, dest, host)
        return FetchResult(entry.path, "resumed" if have else "fetched", entry.size, transferred, **_digests(entry, actual))
    except (OSError, HubError) as exc:
        raise FetchError(f"{entry.path}: {exc} (after {transferred} bytes; the partial file is kept)", transferred) from None
    finally:
        conn.close()


def _fetch_ranged(
    client: HubClient,
    manifest: Manifest,
    entry: ManifestFile,
    dest: str,
    partial: str,
    final: str,
    connections: int,
    piece_size: int,
    progress: ProgressCallback | None,
    host: Host,
) -> FetchResult:
    url = client.resolve_url(manifest.repo_id, manifest.revision, entry.path, manifest.repo_type)
    try:
        job = RangedFetch(client, url, entry, partial, new_digest(entry) or hashlib.sha256(), connections, piece_size, progress, host)
    except RangedError as exc:
        raise FetchError(f"{entry.path}: {exc}") from None
    try:
        actual = job.run()
    except (RangedError, OSError) as exc:
        raise FetchError(
            f"{entry.path}: {exc} (after {job.transferred} bytes; the partial file and its record "
            f"{os.path.basename(state_path(partial))} are kept, the next run resumes them)",
            job.transferred,
        ) from None
    try:
        _finalise(entry, partial, final, actual, dest, host)
    finally:
        remove_state(partial)
    action = "resumed" if job.resumed else "fetched"
    return FetchResult(entry.path, action, entry.size, job.transferred, **_digests(entry, actual))


def _lock_destination(dest: str, host: Host) -> int:
    """One fetch per destination at a time: a second one is refused at once (it does not wait),
    naming the holder, so two runs never write the same partial."""
    path = os.path.join(dest, LOCK_FILE)
    try:
        fd = _open(host, path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FetchError(f"{path}: is a symlink, and the lock is never opened through one; remove it and run again") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FetchError(f"{path}: is not a regular file; remove it and run again")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise FetchError(
                f"{dest}: another fetch (pid {holder}) holds {LOCK_FILE}; this one is refused, not queued: wait for it to end and run again"
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _check_free_space(manifest: Manifest, dest: str) -> None:
    """Refuse before any byte is asked for when the bytes still to come do not fit."""
    todo = 0
    for entry in manifest.files:
        if size_gate(entry, dest).ok:
            continue
        try:
            todo += _to_fetch(entry, destination_path(dest, entry.path))
        except FetchError:  # a planted partial: counted whole here, refused with its own error by fetch_file
            todo += entry.size
    info = os.statvfs(dest)
    free = info.f_bavail * info.f_frsize
    if todo > free:
        raise FetchError(
            f"{dest}: not enough free space: the fetch needs {todo:,} more bytes ({todo / 2**30:.1f} GiB), "
            f"the filesystem has {free:,} bytes ({free / 2**30:.1f} GiB) free for this user (statvfs); free space or choose another dest"
        )


def fetch_payload(
    client: HubClient,
    manifest: Manifest,
    dest: str,
    workers: int = 2,
    refetch: bool = False,
    check_mode: bool = False,
    progress: ProgressCallback | None = None,
    connections: int = DEFAULT_CONNECTIONS,
    piece_size: int = PIECE_SIZE,
    split_count: SplitCount | None = None,
    host: Host | None = None,
) -> list[FetchResult]:
    """Fetch every manifest file (in parallel, bounded). Failures are collected, not raised; a held
    lock or too little free space raise FetchError before anything is fetched. Every change goes
    through `host` (without one, a files-only Host in `check_mode`), whose check mode plans."""
    host = host or Host.files_only(check_mode)
    if host.check_mode:
        results = []
        for entry in manifest.files:
            try:
                action, todo = plan_file(entry, dest)
            except (FetchError, RangedError) as exc:
                results.append(FetchResult(entry.path, "failed", entry.size, detail=str(exc)))
                continue
            results.append(FetchResult(entry.path, action, entry.size, todo))
        return results
    host.makedirs(dest, 0o777)
    lock = _lock_destination(dest, host)
    try:
        _check_free_space(manifest, dest)

        def one(entry: ManifestFile) -> FetchResult:
            try:
                return fetch_file(client, manifest, entry, dest, refetch, progress, connections, piece_size, host)
            except (FetchError, HubError, OSError) as exc:
                return FetchResult(entry.path, "failed", entry.size, getattr(exc, "transferred", 0), detail=client.redact(str(exc)))

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            results = list(pool.map(one, manifest.files))
        if all(r.action != "failed" for r in results):
            problems = structure_problems(manifest, dest, split_count)
            for result in results:
                if result.path in problems:
                    result.action, result.detail = "failed", "; ".join(problems[result.path])
        return results
    finally:
        os.close(lock)


def build_manifest(client: HubClient, repo_id: str, revision: str, paths: list[str] | None = None, repo_type: str = "model") -> Manifest:
    """Pin the revision to the Hub's commit, then describe exactly the wanted files.

    Sizes and digests come from the tree API and are cross-checked with a HEAD on each resolve URL
    (without following the CDN redirect): a 3xx with X-Linked-Size is LFS/Xet and its
    X-Linked-Etag/-Size are the truth; a 3xx without it is a git file. The tree's LFS sha256 is kept
    whatever the resolve answer (a mirror answering 200 has no X-Linked-Etag), and a git file gets
    the tree's `oid`, its git blob sha1."""
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
        tree_size = lfs.get("size", tree[path].get("size"))
        if isinstance(tree_size, int) and tree_size != probe.size:
            raise HubError(f"{path}: tree says {tree_size} bytes, resolve says {probe.size}")
        if probe.kind == "lfs" or tree_sha:
            if tree_sha and probe.sha256 and tree_sha != probe.sha256:
                raise HubError(f"{path}: tree says sha256 {tree_sha}, resolve says {probe.sha256}")
            files.append(ManifestFile(path, probe.size, probe.sha256 or tree_sha, True))
        else:
            oid = tree[path].get("oid")
            blob = oid.lower() if isinstance(oid, str) and len(oid) == 40 and all(c in "0123456789abcdefABCDEF" for c in oid) else None
            files.append(ManifestFile(path, probe.size, None, False, blob))
    return Manifest(repo_id, commit, files, repo_type)
