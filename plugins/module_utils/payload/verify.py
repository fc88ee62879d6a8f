# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verify a payload against its manifest: exactly the manifest's files, nothing else.

The size gate is metadata only (lstat/stat): it reads no file data, so 144 files and 190 GB cost
milliseconds. The optional sha256 hashes files in parallel (hashlib releases the GIL), straight
from a memory map of the page cache (no read() copy), with a bounded number of workers.

Git (non-LFS) files are proven by their git blob sha1 (the Hub tree's `oid`), LFS files by sha256.

A verified file can be stamped in `<dest>/.llm-fleet-verified.json` with its size, mtime, ctime,
device, inode and digest; a later run trusts the stamp while those are unchanged. The ctime is the
part nobody can set: restoring the mtime with `touch -d`/`os.utime` after an edit changes it.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import write_atomically
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import Manifest, ManifestFile, destination_path, digest_fields
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.structure import SplitCount, structure_problems

STAMP_FILE = ".llm-fleet-verified.json"
HASH_CHUNK = 64 << 20  # bytes handed to one sha256 update (the GIL is released for it)
_stamp_lock = threading.Lock()

ProgressCallback = Callable[[str, int, int], None]  # path, bytes done, bytes total


@dataclass
class FileVerdict:
    path: str
    status: str  # ok | missing | wrong_size | not_regular | symlink | hash_mismatch | inconsistent
    expected_size: int
    actual_size: int | None = None
    sha256: str | None = None
    detail: str = ""
    git_blob_sha1: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"path": self.path, "status": self.status, "expected_size": self.expected_size}
        if self.actual_size is not None:
            out["actual_size"] = self.actual_size
        out.update(digest_fields(self.sha256, self.git_blob_sha1))
        if self.detail:
            out["detail"] = self.detail
        return out


def new_digest(entry: ManifestFile) -> hashlib._Hash | None:
    """A fresh hash object for the entry's proof (see ManifestFile.digest); None when it has none.
    A git blob sha1 covers a header (`blob SIZE\0`) and then the content, so the header goes in first."""
    if entry.sha256:
        return hashlib.sha256()
    if entry.git_blob_sha1:
        return hashlib.sha1(b"blob %d\0" % entry.size, usedforsecurity=False)
    return None


def sha256_path(path: str, progress: Callable[[int], None] | None = None) -> str:
    """sha256 of a file, hashed from a memory map in large slices."""
    return hash_path(path, hashlib.sha256(), progress)


def hash_path(path: str, digest: hashlib._Hash, progress: Callable[[int], None] | None = None) -> str:
    """Feed a file to `digest` from a memory map in large slices; return the hex digest."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return digest.hexdigest()
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
                mapped.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mapped)
            try:
                for offset in range(0, size, HASH_CHUNK):
                    digest.update(view[offset : offset + HASH_CHUNK])
                    if progress:
                        progress(min(offset + HASH_CHUNK, size))
            finally:
                view.release()
    return digest.hexdigest()


def size_gate(entry: ManifestFile, dest: str, allow_symlinks: bool = False) -> FileVerdict:
    """Metadata only: the file is where the manifest says, a regular file, of exactly its size."""
    path = destination_path(dest, entry.path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        partial = os.path.exists(path + ".partial")
        return FileVerdict(entry.path, "missing", entry.size, detail="a partial download exists" if partial else "")
    if stat.S_ISLNK(info.st_mode):
        if not allow_symlinks:
            return FileVerdict(entry.path, "symlink", entry.size, detail=f"is a symlink to {os.readlink(path)!r} (allow_symlinks is off)")
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return FileVerdict(entry.path, "missing", entry.size, detail=f"dangling symlink to {os.readlink(path)!r}")
    if not stat.S_ISREG(info.st_mode):
        return FileVerdict(entry.path, "not_regular", entry.size, detail="not a regular file")
    if info.st_size != entry.size:
        return FileVerdict(entry.path, "wrong_size", entry.size, info.st_size)
    return FileVerdict(entry.path, "ok", entry.size, info.st_size)


def not_whole(manifest: Manifest, dest: str, shown: int = 5) -> str:
    """The first `shown` files of the manifest missing or of the wrong size in dest, as
    'path (status)' joined by commas; empty when every file is there at its size (metadata only)."""
    wrong = [v for v in (size_gate(entry, dest) for entry in manifest.files) if v.status != "ok"]
    return ", ".join(f"{v.path} ({v.status})" for v in wrong[:shown])


# --- stamps -----------------------------------------------------------------------------------


def _stamp_key(info: os.stat_result) -> list[int]:
    # ctime_ns: any write or utime() moves it and nothing can set it back; dev and ino: the same
    # file, not another one renamed into its place.
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_dev, info.st_ino]


def read_stamps(dest: str) -> dict[str, dict[str, object]]:
    try:
        with open(os.path.join(dest, STAMP_FILE), encoding="utf-8") as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_stamp(dest: str, relative: str, algorithm: str, value: str) -> None:
    """Record a verified file (atomically: temp file + rename). A read-only payload directory
    gets no stamps: they only save a rehash, so verification goes on without them."""
    if not os.access(dest, os.W_OK):
        return
    info = os.stat(destination_path(dest, relative))
    with _stamp_lock:
        stamps = read_stamps(dest)
        stamps[relative] = {algorithm: value, "stat": _stamp_key(info)}
        write_atomically(os.path.join(dest, STAMP_FILE), json.dumps(stamps, indent=1, sort_keys=True))


def stamped_digest(dest: str, relative: str, algorithm: str, stamps: dict[str, dict[str, object]] | None = None) -> str | None:
    """The digest (sha256 or git_blob_sha1) recorded for this file, if the file is unchanged since."""
    stamps = read_stamps(dest) if stamps is None else stamps
    record = stamps.get(relative)
    if not isinstance(record, dict):
        return None
    try:
        info = os.stat(destination_path(dest, relative))
    except OSError:
        return None
    value = record.get(algorithm)
    return str(value) if value and record.get("stat") == _stamp_key(info) else None


# --- the whole manifest -----------------------------------------------------------------------


def verify_payload(
    manifest: Manifest,
    dest: str,
    check_hash: bool = False,
    workers: int = 2,
    allow_symlinks: bool = False,
    progress: ProgressCallback | None = None,
    trust_stamps: bool = False,
    split_count: SplitCount | None = None,
) -> list[FileVerdict]:
    """Size-gate every manifest file; with check_hash, hash the ones that passed (in parallel) and
    cross-check the set (safetensors index, split GGUF count: structure.py)."""
    verdicts = [size_gate(entry, dest, allow_symlinks) for entry in manifest.files]
    if not check_hash:
        return verdicts
    stamps = read_stamps(dest) if trust_stamps else {}
    entries = {entry.path: entry for entry in manifest.files}
    todo = [v for v in verdicts if v.ok and entries[v.path].digest]

    def check(verdict: FileVerdict) -> None:
        entry = entries[verdict.path]
        algorithm, expected = entry.digest
        stamped = stamped_digest(dest, entry.path, algorithm, stamps) if trust_stamps else None
        if stamped is not None:
            actual = stamped
        else:
            callback = (lambda done: progress(entry.path, done, entry.size)) if progress else None
            actual = hash_path(destination_path(dest, entry.path), new_digest(entry), callback)
        setattr(verdict, algorithm, actual)
        if actual != expected:
            verdict.status = "hash_mismatch"
            verdict.detail = f"{algorithm} {actual} != manifest {expected}"
        elif stamped is None:
            write_stamp(dest, entry.path, algorithm, actual)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(check, todo))
    problems = structure_problems(manifest, dest, split_count)
    for verdict in verdicts:
        if verdict.ok and verdict.path in problems:
            verdict.status, verdict.detail = "inconsistent", "; ".join(problems[verdict.path])
    return verdicts
