# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The last-known-good record of one endpoint (`last-good.json`, engine + unit arguments, never
secrets) and the K generations kept before it (`generations/gen-*.json`): read, written, pushed
down a generation, listed for the rollback playbook.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import FileTooLarge, read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload import generations as payload_generations

RECORD_FILE = "last-good.json"
# A record is a few KiB; anything near this bound is not one of ours.
MAX_RECORD_BYTES = 1 << 20
GENERATIONS_DIR = "generations"


def read_record(path: str, host: Host, warnings: list[str]) -> Any:
    """A record this module wrote, or None. One that is unreadable (damaged disk, a hand edit) is
    moved aside, named in a warning, and the deploy goes on as a first deploy."""
    try:
        text = read_text(path, MAX_RECORD_BYTES)
        value = json.loads(text) if text is not None else None
        if value is None or isinstance(value, dict):
            return value
        problem = f"holds a JSON {type(value).__name__}, not an object"
    except (FileTooLarge, ValueError) as exc:
        problem = str(exc)
    kept = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
    warnings.append(f"{path} is unreadable ({problem}); kept aside as {kept}, and this deploy runs as a first deploy")
    host.move(path, kept)
    return None


def write_record(host: Host, record_dir: str, record: dict[str, Any], previous_text: str | None, keep: int, diff: bool) -> dict[str, Any]:
    """After a green deploy: the record, written when it changed; the one it replaces becomes
    generation 1. Returns the record step's result (`changed`, `path`, with --diff its `diff`)."""
    record_path = os.path.join(record_dir, RECORD_FILE)
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    record_result: dict[str, Any] = {"changed": text != previous_text, "path": record_path}
    if record_result["changed"]:
        if previous_text is not None:
            push_generation(host, record_dir, previous_text, keep)
        host.write(record_path, text, 0o600, dir_mode=0o700)
        if diff:
            record_result["diff"] = {"before": previous_text or "", "after": text, "before_header": record_path, "after_header": record_path}
    return record_result


def generation_files(record_dir: str) -> list[str]:
    """The kept generations before the last-known-good record, newest first (generation 1 first)."""
    directory = os.path.join(record_dir, GENERATIONS_DIR)
    try:
        names = [n for n in os.listdir(directory) if n.startswith("gen-") and n.endswith(".json")]
    except FileNotFoundError:
        return []
    return [os.path.join(directory, n) for n in sorted(names, reverse=True)]


def push_generation(host: Host, record_dir: str, text: str, keep: int, replacing: str = "") -> None:
    """The record being replaced becomes generation 1; at most keep - 1 older ones stay (keep counts
    the last-known-good record too)."""
    if replacing:
        host.remove(replacing)
    path = os.path.join(record_dir, GENERATIONS_DIR, f"gen-{time.time_ns():020d}.json")
    host.write(path, text, 0o600, dir_mode=0o700)
    kept = [p for p in generation_files(record_dir) if p != replacing]
    if path not in kept:  # check mode wrote nothing
        kept.insert(0, path)
    for stale in kept[max(keep - 1, 0) :]:
        host.remove(stale)


def list_generations(record_dir: str) -> list[dict[str, Any]]:
    """Generation 0 (the last-known-good record) and the kept ones before it: when each was
    replaced and what it served, for the rollback playbook to show."""
    listed = []
    for number, path in enumerate([os.path.join(record_dir, RECORD_FILE), *generation_files(record_dir)]):
        try:
            record = json.loads(read_text(path, MAX_RECORD_BYTES) or "null")
            shape = record.get("shape") or {}
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.stat(path).st_mtime))
        except (OSError, ValueError, AttributeError):
            continue
        entry = {"generation": number, "written": stamp, "runtime": shape.get("runtime"), "served_id": shape.get("served_id"), "port": shape.get("port")}
        payload = record.get("payload") or {}
        if payload.get("generation"):
            # What a rollback to this record would find of its payload: kept, staged or purged.
            entry["payload"] = {"generation": payload["generation"], "on_disk": payload_generations.where(str(payload.get("dir") or ""), payload["generation"])}
        listed.append(entry)
    return listed


def kept_records(state_dir: str, own_record_dir: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, record) of every other endpoint's last-known-good record under the state directory
    (STATE_DIR/*/last-good.json), read only: one that does not parse is skipped (its own
    endpoint's deploy deals with it)."""
    found = []
    try:
        names = sorted(os.listdir(state_dir))
    except OSError:
        return []
    for name in names:
        directory = os.path.join(state_dir, name)
        if name == "archive" or os.path.normpath(directory) == os.path.normpath(own_record_dir):
            continue
        path = os.path.join(directory, RECORD_FILE)
        try:
            record = json.loads(read_text(path, MAX_RECORD_BYTES) or "null")
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("unit"), dict):
            found.append((path, record))
    return found
