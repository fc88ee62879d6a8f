# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The served ids a host rename leaves behind. An endpoint renamed in the inventory (the host
frank-secondary becomes frank-zealot) is a new endpoint with a record directory of its own, so its
own kept records never name the old id; the old endpoint's unit is retired instead
(`endpoint_retired_units`). What the clients and OpenWebUI still hold is the id the retired
endpoint served last: the `shape.served_id` of its last-known-good record, which the retirement
keeps (STATE_DIR/NAME/last-good.json; only the unit file is archived).

playbooks/retired_served_ids.yml reads those records on the endpoint's machine; these functions
turn the reads into ids on the controller. Controller-only; no Ansible import.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

# A record is a few KiB (host/records.py bounds it at 1 MiB); a read past this is not one of ours.
MAX_RECORD_BYTES = 1 << 20
RECORD_FILE = "last-good.json"


def record_path(state_dir: str, unit: str) -> str:
    """Where the endpoint a unit ran (NAME.service is endpoint NAME) keeps its last-good record."""
    return f"{state_dir.rstrip('/')}/{unit.removesuffix('.service')}/{RECORD_FILE}"


def retired_served_ids(reads: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(the served ids, in order and once each; why a read gave none where it is worth saying) from
    one read per retired unit, as ansible.builtin.slurp returns it under a loop (`item` the unit,
    `content` the record in base64). A unit with no record (retired before any deploy of this
    collection, or its directory removed) gives nothing and no note."""
    ids: list[str] = []
    notes: list[str] = []
    for read in reads or []:
        unit = str(read.get("item") or "?")
        content = read.get("content")
        if not content:
            continue
        try:
            raw = base64.b64decode(str(content), validate=True)
        except (binascii.Error, ValueError):
            notes.append(f"{unit}: its record did not arrive as base64; its served id is not followed")
            continue
        if len(raw) > MAX_RECORD_BYTES:
            notes.append(f"{unit}: its record is {len(raw):,} bytes, over {MAX_RECORD_BYTES:,}: not one of this collection's; its served id is not followed")
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            notes.append(f"{unit}: its record is not JSON ({exc}); its served id is not followed")
            continue
        shape = record.get("shape") if isinstance(record, dict) else None
        served = shape.get("served_id") if isinstance(shape, dict) else None
        if not isinstance(served, str) or not served.strip() or "\n" in served:
            notes.append(f"{unit}: its record names no served id (shape.served_id); its served id is not followed")
            continue
        if served not in ids:
            ids.append(served)
    return ids, notes
