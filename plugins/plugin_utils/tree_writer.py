# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write a generated tree idempotently: only files whose bytes change are replaced (atomically),
a unified diff shows each text change, check mode writes nothing, and files a previous run
generated under the managed directories but this run did not are removed. Every write and
removal goes through the Host runner (host_runner.py)."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_bytes
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host


@dataclass
class TreeReport:
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    diffs: list[str] = field(default_factory=list)


def _diff(relative: str, old: bytes | None, new: bytes) -> str:
    try:
        old_text = (old or b"").decode("utf-8").splitlines(keepends=True)
        new_text = new.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return f"Binary file {relative} {'created' if old is None else 'changed'}\n"
    before = "/dev/null" if old is None else f"a/{relative}"
    return "".join(difflib.unified_diff(old_text, new_text, before, f"b/{relative}"))


def write_tree(dest: str, files: dict[str, bytes], managed: tuple[str, ...] = (), check: bool = False, host: Host | None = None) -> TreeReport:
    """Without a host, a files-only Host in check mode when `check`."""
    host = host or Host.files_only(check)
    report = TreeReport()
    for relative in sorted(files):
        path = os.path.join(dest, relative)
        old = read_bytes(path)
        if old == files[relative]:
            report.unchanged.append(relative)
            continue
        report.changed.append(relative)
        report.diffs.append(_diff(relative, old, files[relative]))
        host.write(path, files[relative], 0o644, dir_mode=0o777)
    for prefix in managed:
        root = os.path.join(dest, prefix)
        for directory, _dirs, names in os.walk(root):
            for name in names:
                relative = os.path.relpath(os.path.join(directory, name), dest)
                if relative not in files:
                    report.removed.append(relative)
                    host.remove(os.path.join(dest, relative), missing_ok=False)
    return report
