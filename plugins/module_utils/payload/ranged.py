# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One large file over several ranged connections at once, hashed in the same pass.

A CDN limits each connection, so one stream is the bottleneck on a multi-hundred-GiB payload. The
file is cut into pieces (PIECE_SIZE); C workers take the next piece in order, each on its own
kept-alive connection, and write it in place with os.pwrite into `NAME.partial`. The caller's
thread hashes the pieces strictly in order as the contiguous prefix grows, from the blocks the
workers hand over (one pass over the bytes, never read back); workers stay within a window of
pieces ahead of the hash, which bounds the memory to about 2 x C pieces.

Resumable after a kill -9 at any moment: `NAME.partial.ranges` records, per piece, the bytes
already written, and the identity (device, inode) of the partial it describes, replaced atomically
(temp file with O_EXCL|O_NOFOLLOW, then rename). A piece is recorded complete before its worker
asks for the next one, so a rerun fetches again at most the pieces that were in flight. Those
records cost no fsync: a killed process leaves its writes in the page cache. For a power loss the
record also carries `synced`, the bytes per piece as of the last fdatasync of the partial (every
DURABLE_INTERVAL seconds, then fsync of the record), and the kernel's boot id: a rerun in another
boot trusts only `synced`. A rerun hashes what is already on disk (read, not fetched) and fetches
the rest. The rules of the single stream hold: a range never starts open-ended at 0 (`bytes=0-`
is refused by Xet CDNs), only a 206 with the exact Content-Range is written, nothing past the
manifest size is asked for or written, and the token reaches the Hub's origin only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable

from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient, HubError
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import ManifestFile

PIECE_SIZE = 4 << 20  # measured: 2 and 4 MiB reach the cap, 8 MiB 0.90x, 16 MiB 0.78x (the last pieces run alone)
BLOCK = 1 << 20
REREAD_CHUNK = 16 << 20
RANGES_SUFFIX = ".ranges"
STATE_VERSION = 1
STATE_MAX_BYTES = 16 << 20
PERSIST_INTERVAL = 1.0  # seconds between records of in-flight progress (completions record at once)
DURABLE_INTERVAL = 5.0  # seconds between fdatasyncs of the partial (an fdatasync per piece halved the rate on ext4)
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
ATTEMPTS = 3  # per piece, each resuming where the last one stopped


class RangedError(RuntimeError):
    pass


class _Piece:
    __slots__ = ("blocks", "complete", "end", "have", "index", "on_disk", "start")

    def __init__(self, index: int, start: int, end: int, have: int) -> None:
        self.index, self.start, self.end = index, start, end
        self.have = have  # bytes from start written to the partial (grows while fetching)
        self.on_disk = have  # what an earlier run left: hashed from disk, not fetched
        self.blocks: list[memoryview] = []  # fetched blocks not yet hashed
        self.complete = have == end - start

    @property
    def length(self) -> int:
        return self.end - self.start


def state_path(partial: str) -> str:
    return partial + RANGES_SUFFIX


def _boot_id() -> str:
    """This boot's id: page-cache writes survive a kill within it, not a power loss."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _expected(entry: ManifestFile) -> str | None:
    digest = entry.digest
    return f"{digest[0]}:{digest[1]}" if digest else None


def _open_nofollow(path: str, flags: int, host: Host | None = None) -> int:
    """Open without following a link; with a host, the opening for writing goes through it."""
    try:
        fd = host.open_write(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644) if host else os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if os.path.islink(path):
            raise RangedError(f"{path}: is a symlink, and fetch state is never read or written through one; remove it and run again") from None
        raise exc
    if fd is None:
        raise RangedError(f"{path}: check mode plans a fetch and writes nothing")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RangedError(f"{path}: is not a regular file; remove it and run again")
    return fd


def read_state(partial: str, entry: ManifestFile) -> tuple[int, list[int]] | None:
    """(piece size, bytes written per piece) recorded for this partial, or None when there is no
    record or it describes another file (other size, digest or inode: then nothing is trusted)."""
    path = state_path(partial)
    if not os.path.lexists(path):
        return None
    fd = _open_nofollow(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as handle:
        raw = handle.read(STATE_MAX_BYTES + 1)
    try:
        data = json.loads(raw) if len(raw) <= STATE_MAX_BYTES else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        return None
    same_boot = bool(data.get("boot_id")) and data.get("boot_id") == _boot_id()
    piece_size, have = data.get("piece_size"), data.get("have" if same_boot else "synced")
    if data.get("size") != entry.size or data.get("digest") != _expected(entry):
        return None
    if not isinstance(piece_size, int) or piece_size <= 0 or not isinstance(have, list) or len(have) != -(-entry.size // piece_size):
        return None
    try:
        info = os.lstat(partial)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode) or data.get("partial") != [info.st_dev, info.st_ino] or info.st_size > entry.size:
        return None
    for index, count in enumerate(have):
        length = min(piece_size, entry.size - index * piece_size)
        if not isinstance(count, int) or not 0 <= count <= length or (count and index * piece_size + count > info.st_size):
            return None
    return piece_size, have


def pending_bytes(partial: str, entry: ManifestFile) -> int | None:
    """Bytes a ranged fetch still has to transfer, from its record; None without a usable record."""
    state = read_state(partial, entry)
    return None if state is None else entry.size - sum(state[1])


def remove_state(partial: str) -> None:
    path = state_path(partial)
    if os.path.lexists(path):
        os.unlink(path)
    _remove_stale_temps(path)


def _remove_stale_temps(path: str) -> None:
    """The state file's temporaries (PATH.tmp-PID) that a killed run left behind."""
    directory, name = os.path.split(path)
    for entry in os.listdir(directory or "."):
        if entry.startswith(f"{name}.tmp-"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, entry))


class RangedFetch:
    """Fetch `entry` into `partial` from `url` over `connections` connections (see module doc)."""

    def __init__(
        self,
        client: HubClient,
        url: str,
        entry: ManifestFile,
        partial: str,
        digest: hashlib._Hash,
        connections: int,
        piece_size: int = PIECE_SIZE,
        progress: Callable[[str, int, int], None] | None = None,
        host: Host | None = None,
    ) -> None:
        # The partial (the payload's bytes) is opened through the Host; the record beside it is
        # bookkeeping rewritten every PERSIST_INTERVAL, kept out of the actions.
        self.host = host or Host.files_only()
        self.client, self.url, self.entry, self.partial, self.digest = client, url, entry, partial, digest
        self.connections = max(1, connections)
        self.window = 2 * self.connections
        self.progress = progress
        self.transferred = 0
        self._cond = threading.Condition()
        self._persist_lock = threading.Lock()
        self._swept = False  # stale state temporaries removed once per fetch
        self._last_persist = 0.0
        self._last_sync = time.monotonic()
        self._synced: list[int] = []
        self._error: BaseException | None = None
        self._abort = False
        self._head = 0  # first piece not yet fully hashed
        self._next = 0  # next piece a worker may take
        self.fd = -1
        state = read_state(partial, entry)
        if state is None:
            # No usable record: what is there is a single-stream prefix (or nothing). Record it before
            # any byte is written, so the record always names this very partial.
            self._fresh_state(piece_size)
        else:
            self.piece_size, have = state
            self.fd = _open_nofollow(partial, os.O_RDWR, self.host)
            self.pieces = self._cut(have)
            self.persist(force=True, durable=True)  # what is trusted now is what survives a power loss too
        self.resumed = any(p.on_disk for p in self.pieces)
        self.done = sum(p.have for p in self.pieces)

    def _fresh_state(self, piece_size: int) -> None:
        self.piece_size = piece_size
        remove_state(self.partial)
        try:
            prefix = os.lstat(self.partial).st_size
            self.fd = _open_nofollow(self.partial, os.O_RDWR, self.host)
        except FileNotFoundError:
            prefix = 0
            self.fd = _open_nofollow(self.partial, os.O_RDWR | os.O_CREAT | os.O_EXCL, self.host)
        prefix = min(prefix, os.fstat(self.fd).st_size, self.entry.size)
        count = -(-self.entry.size // piece_size)
        have = [max(0, min(piece_size, self.entry.size - i * piece_size, prefix - i * piece_size)) for i in range(count)]
        self.pieces = self._cut(have)
        self.persist(force=True, durable=True)

    def _cut(self, have: list[int]) -> list[_Piece]:
        size, step = self.entry.size, self.piece_size
        return [_Piece(i, i * step, min(size, (i + 1) * step), count) for i, count in enumerate(have)]

    # --- the record ---------------------------------------------------------------------------

    def persist(self, force: bool = False, durable: bool = False) -> None:
        """Record the bytes written per piece, atomically. Durable (also every DURABLE_INTERVAL):
        fdatasync the partial first and fsync the record, so `synced` survives a power loss."""
        now = time.monotonic()
        if not force and now - self._last_persist < PERSIST_INTERVAL:
            return
        with self._persist_lock:
            with self._cond:
                have = [p.have for p in self.pieces]
            durable = durable or now - self._last_sync >= DURABLE_INTERVAL
            if durable:
                os.fdatasync(self.fd)
                self._synced, self._last_sync = have, now
            info = os.fstat(self.fd)
            record = {
                "version": STATE_VERSION,
                "size": self.entry.size,
                "digest": _expected(self.entry),
                "piece_size": self.piece_size,
                "partial": [info.st_dev, info.st_ino],
                "boot_id": _boot_id(),
                "have": have,
                "synced": self._synced or [0] * len(have),
            }
            final = state_path(self.partial)
            temp = f"{final}.tmp-{os.getpid()}"
            if not self._swept:
                _remove_stale_temps(final)  # left by a run killed mid-write (another pid); the lock is ours
                self._swept = True
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                os.unlink(temp)  # left by a killed run with our pid; the lock says no one else writes here
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(record, handle, separators=(",", ":"))
                if durable:
                    handle.flush()
                    os.fsync(handle.fileno())
            os.replace(temp, final)
            self._last_persist = now

    # --- workers ------------------------------------------------------------------------------

    def _take(self) -> _Piece | None:
        with self._cond:
            while True:
                if self._abort:
                    return None
                while self._next < len(self.pieces) and self.pieces[self._next].complete:
                    self._next += 1
                if self._next >= len(self.pieces):
                    return None
                if self._next < self._head + self.window:
                    piece = self.pieces[self._next]
                    self._next += 1
                    return piece
                self._cond.wait(1.0)

    def _worker(self) -> None:
        conns: dict = {}
        url = self.url
        try:
            while (piece := self._take()) is not None:
                for attempt in range(ATTEMPTS):
                    try:
                        url = self._fetch_piece(conns, url, piece)
                        break
                    except (RangedError, HubError, OSError):
                        # A reset or a cut connection: ask again from the byte it stopped at, on a new
                        # connection (and from the Hub again, in case a signed CDN URL expired).
                        for conn in conns.values():
                            conn.close()
                        conns.clear()
                        url = self.url
                        if attempt == ATTEMPTS - 1 or self._abort:
                            raise
                if self._abort:  # another worker failed: this piece stops where it is, as recorded
                    return
                with self._cond:
                    piece.complete = True
                    self._cond.notify_all()
                # Recorded before the next request: a kill never costs a completed piece.
                self.persist(force=True)
        except BaseException as exc:  # handed to the caller's thread, which raises it
            with self._cond:
                if self._error is None:
                    self._error = exc
                self._abort = True
                self._cond.notify_all()
        finally:
            for conn in conns.values():
                conn.close()

    def _fetch_piece(self, conns: dict, url: str, piece: _Piece) -> str:
        """Fetch the rest of one piece; return the URL that answered (the CDN's, after a redirect)."""
        first, last = piece.start + piece.have, piece.end - 1
        response, url = self.client.open_range(conns, url, first, last)
        content_range = response.getheader("Content-Range") or ""
        if content_range != f"bytes {first}-{last}/{self.entry.size}":
            raise RangedError(f"asked for bytes {first}-{last} of {self.entry.size}, got Content-Range {content_range!r}")
        while piece.have < piece.length:
            if self._abort:
                return url
            # readinto keeps the bytes of a cut connection (read() would drop them with IncompleteRead).
            buffer = bytearray(min(BLOCK, piece.length - piece.have))
            count = response.readinto(buffer)
            if not count:
                raise RangedError(f"connection ended at byte {piece.start + piece.have} inside bytes {first}-{last}")
            block = memoryview(buffer)[:count]
            offset, view = piece.start + piece.have, block
            while view:
                written = os.pwrite(self.fd, view, offset)
                view, offset = view[written:], offset + written
            with self._cond:
                piece.have += count
                piece.blocks.append(block)
                self.transferred += count
                self.done += count
                done = self.done
                self._cond.notify_all()
            if self.progress:
                self.progress(self.entry.path, done, self.entry.size)
            self.persist()
        return url

    # --- the hash, in order -------------------------------------------------------------------

    def _hash_piece(self, piece: _Piece) -> bool:
        position, end = piece.start, piece.start + piece.on_disk
        while position < end:
            block = os.pread(self.fd, min(REREAD_CHUNK, end - position), position)
            if not block:
                raise RangedError(f"{self.partial}: shorter than its record says (byte {position})")
            self.digest.update(block)
            position += len(block)
        while True:
            with self._cond:
                while not piece.blocks and not piece.complete and not self._abort:
                    self._cond.wait(1.0)
                if self._abort:
                    return False
                blocks, piece.blocks = piece.blocks, []
                finished = piece.complete and not blocks
            if finished:
                return True
            for block in blocks:
                self.digest.update(block)

    def run(self) -> str:
        """Fetch what is missing and return the hex digest of the whole file."""
        workers = [threading.Thread(target=self._worker, name=f"ranged-{n}", daemon=True) for n in range(self.connections)]
        for worker in workers:
            worker.start()
        try:
            for piece in self.pieces:
                if not self._hash_piece(piece):
                    break
                with self._cond:
                    self._head = piece.index + 1
                    self._cond.notify_all()
        except BaseException:
            with self._cond:
                self._abort = True
                self._cond.notify_all()
            raise
        finally:
            for worker in workers:
                worker.join()
            try:
                if self._abort:  # what this run wrote, kept for the next one; a whole file needs no record
                    self.persist(force=True, durable=True)
            finally:
                os.close(self.fd)
        if self._error is not None:
            error = self._error
            if isinstance(error, (RangedError, HubError, OSError)):
                raise RangedError(self.client.redact(str(error)))
            raise error
        return self.digest.hexdigest()
