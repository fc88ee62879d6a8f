# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading and replacing files: a missing file reads as None, and a write goes to a temp file in
the same directory that is renamed over the target, so no reader ever sees half a file."""

from __future__ import annotations

import os
import tempfile


class FileTooLarge(ValueError):
    """A file that is larger than its reader's bound (a record, a manifest): refused, not read."""


def read_text(path: str, max_bytes: int | None = None) -> str | None:
    """The file's text, or None when it does not exist. With max_bytes, a larger file raises
    FileTooLarge instead of being read into memory."""
    try:
        with open(path, encoding="utf-8") as handle:
            if max_bytes is None:
                return handle.read()
            text = handle.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    if len(text) > max_bytes:
        raise FileTooLarge(f"{path} is larger than {max_bytes} bytes")
    return text


def read_bytes(path: str) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def write_atomically(path: str, content: str | bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Write via a temp file in the same directory and rename: never a half-written file.

    durable: fsync the data before the rename (off for files rewritten every second, such as a
    progress snapshot, where a lost write only means an older snapshot)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content.encode("utf-8") if isinstance(content, str) else content)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
