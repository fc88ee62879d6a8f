"""Payloads for the payload-generation tests (tests/unit and tests/hostile): a manifest of given
bytes written beside the payload directory, and a generation made ready and filled as the payload
gate would fill it."""

import hashlib
import json
import os
from pathlib import Path

from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.generations import prepare


def quiet_host(check_mode: bool = False) -> Host:
    """The generation steps run no commands: a runner that is never called."""
    return Host(lambda argv: (0, "", ""), check_mode)


def write_manifest(path: Path, files: dict[str, bytes]) -> str:
    entries = [{"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "lfs": True} for name, data in sorted(files.items())]
    path.write_text(json.dumps({"repo_id": "lab/tiny", "revision": "a" * 40, "files": entries}, indent=1) + "\n")
    return str(path)


def ready(payload_dir: Path, label: str, files: dict[str, bytes]) -> dict:
    """Generation `label` made ready and filled: returns prepare's result plus the manifest path."""
    payload_dir.parent.mkdir(parents=True, exist_ok=True)
    manifest = write_manifest(payload_dir.parent / f"{label}.manifest.json", files)
    result = prepare(str(payload_dir), manifest, quiet_host())
    for name, data in files.items():
        target = Path(result["dir"]) / name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return {**result, "manifest": manifest}


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root with what it is: a check-mode run must leave this as it was."""
    seen = {}
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(parent, name)
            info = os.lstat(path)
            seen[os.path.relpath(path, root)] = (info.st_mode, info.st_ino, info.st_size, info.st_mtime_ns, os.readlink(path) if os.path.islink(path) else None)
    return seen
