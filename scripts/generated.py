"""Writing generated files, shared by the generator scripts: write what changed, or (--check)
list what is out of date; either way the caller reports drift the same way."""

from __future__ import annotations

import sys
from pathlib import Path


def sync(root: Path, files: dict[str, str], check: bool, stale: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Write `files` (relative path -> text) under root, removing `stale` ones; with check, write
    nothing and return the paths that differ from what would be written."""
    drift = []
    for relative, text in sorted(files.items()):
        path = root / relative
        if check:
            if not path.exists() or path.read_text() != text:
                drift.append(relative)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for relative in stale:
        if check:
            drift.append(relative)
        else:
            (root / relative).unlink()
    return drift


def report(drift: list[str], script: str) -> int:
    if drift:
        print(f"out of date (run {script}): " + ", ".join(drift), file=sys.stderr)
        return 1
    return 0
