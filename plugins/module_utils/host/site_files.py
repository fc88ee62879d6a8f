# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A generated static site written in one step: each file whose bytes differ is replaced
atomically (a reader never sees half a page), the rest are left alone, and a second run with the
same files changes nothing. One module call instead of one copy task per page keeps a no-op
deploy quick."""

from __future__ import annotations

import os
import re
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import FileTooLarge, read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

MAX_FILES = 64
MAX_FILE_BYTES = 4 * 1024 * 1024
# Flat names only: the site generator writes no directories, and a name cannot climb out of dest.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _check(params: dict[str, Any]) -> tuple[str, dict[str, str]]:
    dest = str(params["dest"])
    if not os.path.isabs(dest) or ".." in dest.split("/"):
        raise StepError(f"dest: {dest!r} must be an absolute path without '..'", {"changed": False})
    files = params.get("files") or {}
    if len(files) > MAX_FILES:
        raise StepError(f"files: {len(files)} files; at most {MAX_FILES}", {"changed": False})
    for name, content in files.items():
        if not _NAME.match(name) or ".." in name:
            raise StepError(f"files: {name!r} is not a plain file name (letters, digits, '.', '_', '-'; no '/' or '..')", {"changed": False})
        if len(str(content).encode()) > MAX_FILE_BYTES:
            raise StepError(f"files.{name}: larger than {MAX_FILE_BYTES} bytes", {"changed": False})
    return dest, {name: str(content) for name, content in files.items()}


def ensure_site(params: dict[str, Any], host: Host, want_diff: bool) -> dict[str, Any]:
    dest, files = _check(params)
    if os.path.islink(dest) or (os.path.exists(dest) and not os.path.isdir(dest)):
        raise StepError(f"dest: {dest} exists and is not a directory (or is a symlink); remove it or choose another site root", {"changed": False})
    mode = int(str(params.get("mode") or "0644"), 8)
    written, diffs = [], []
    for name in sorted(files):
        path = os.path.join(dest, name)
        if os.path.islink(path):
            raise StepError(f"{path} is a symlink; the site's files are plain files: remove it", {"changed": False})
        try:
            before = read_text(path, MAX_FILE_BYTES)
        except (FileTooLarge, UnicodeDecodeError):
            before = ""  # not one of ours as it stands: replaced
        same_mode = before is not None and (os.stat(path).st_mode & 0o7777) == mode
        if before == files[name] and same_mode:
            continue
        written.append(name)
        if want_diff:
            diffs.append({"before_header": path, "after_header": path, "before": before or "", "after": files[name]})
        host.write(path, files[name], mode)
    result: dict[str, Any] = {"changed": bool(written), "dest": dest, "written": written}
    if want_diff:
        result["diff"] = diffs
    return result
