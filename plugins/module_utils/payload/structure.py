# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Cross-checks between payload files that each pass on their own: the set must be whole.

- A safetensors index (`*.safetensors.index.json`): every weight-map target is a manifest file, and
  every shard the manifest lists beside it (`STEM-NNNNN-of-NNNNN.safetensors`) is named by the
  weight map. A manifest that forgot a shard, or an index naming a shard not fetched, is refused.
- A split GGUF set: the manifest must list exactly the parts llama.cpp will open (STEM-00001-of-N
  ... STEM-N-of-N), no fewer and no other count; N is the first part's name, and, given a
  `split_count` reader (the module passes the GGUF header reader of budget/), also its header's
  `split.count`, which must agree. The reader comes from the caller because payload/ does not
  import budget/ (docs/architecture.md).
Both read only small headers (the index JSON, the GGUF metadata), so they run after a fetch and with
`check_hash`, never in the metadata-only size gate.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Callable

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import Manifest, destination_path

SplitCount = Callable[[str], int]  # a first part's path -> the split.count its GGUF header says

INDEX_SUFFIX = ".safetensors.index.json"
INDEX_MAX_BYTES = 64 << 20
_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.safetensors$")
_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")  # llama.cpp's split names


def _load_index(path: str) -> dict:
    with open(path, "rb") as handle:
        raw = handle.read(INDEX_MAX_BYTES + 1)
    if len(raw) > INDEX_MAX_BYTES:
        raise ValueError(f"larger than {INDEX_MAX_BYTES} bytes")
    data = json.loads(raw)
    if not isinstance(data, dict) or not isinstance(data.get("weight_map"), dict):
        raise ValueError("no weight_map mapping")
    return data


def _index_problems(manifest: Manifest, dest: str, index_path: str) -> list[str]:
    listed = {f.path for f in manifest.files}
    folder = posixpath.dirname(index_path)
    try:
        data = _load_index(destination_path(dest, index_path))
    except (OSError, ValueError) as exc:
        return [f"cannot read the safetensors index: {exc}"]
    targets = set()
    for tensor, shard in data["weight_map"].items():
        if not isinstance(shard, str) or "/" in shard or shard in ("", ".", ".."):
            return [f"weight_map[{tensor!r}] is {shard!r}, not a shard file name beside the index"]
        targets.add(posixpath.join(folder, shard) if folder else shard)
    problems = [f"weight_map names {shard}, which the manifest does not list (add it to the manifest's files)" for shard in sorted(targets - listed)]
    beside = {path for path in listed if posixpath.dirname(path) == folder and _SHARD_RE.match(posixpath.basename(path))}
    problems += [f"the manifest lists shard {shard}, which the weight_map never names (a shard of another model?)" for shard in sorted(beside - targets)]
    counts = {int(m.group("count")) for target in targets if (m := _SHARD_RE.match(posixpath.basename(target)))}
    if len(counts) == 1 and len(targets) != min(counts):
        problems.append(f"weight_map names {len(targets)} shards, their names say -of-{min(counts):05d}")
    return problems


def _split_problems(manifest: Manifest, dest: str, first_path: str, split_count: SplitCount | None) -> list[str]:
    listed = {f.path for f in manifest.files}
    match = _SPLIT_RE.match(posixpath.basename(first_path))
    count = int(match.group("count"))
    if split_count is not None:
        try:
            header_count = int(split_count(destination_path(dest, first_path)) or 0)
        except (OSError, ValueError) as exc:
            return [f"cannot read the GGUF header of the first split part: {exc}"]
        if header_count != count:
            return [f"the header says split.count {header_count}, the name says {count} parts"]
    folder, stem = posixpath.dirname(first_path), match.group("stem")
    wanted = {posixpath.join(folder, f"{stem}-{no:05d}-of-{count:05d}.gguf") for no in range(1, count + 1)}
    problems = [f"split part {part} (of {count}) is not in the manifest" for part in sorted(wanted - listed)]
    others = {p for p in listed if posixpath.dirname(p) == folder and (m := _SPLIT_RE.match(posixpath.basename(p))) and m.group("stem") == stem}
    problems += [f"the manifest lists {part}, which is not one of the {count} parts of its set" for part in sorted(others - wanted)]
    return problems


def structure_problems(manifest: Manifest, dest: str, split_count: SplitCount | None = None) -> dict[str, list[str]]:
    """Problems per manifest file (the index, or the first GGUF split part); empty when whole.
    Only files present on disk are read; a missing one is the size gate's finding."""
    problems: dict[str, list[str]] = {}
    for entry in manifest.files:
        name = posixpath.basename(entry.path)
        if not os.path.isfile(destination_path(dest, entry.path)):
            continue
        found: list[str] = []
        if name.endswith(INDEX_SUFFIX):
            found = _index_problems(manifest, dest, entry.path)
        elif (match := _SPLIT_RE.match(name)) and int(match.group("no")) == 1:
            found = _split_problems(manifest, dest, entry.path, split_count)
        if found:
            problems[entry.path] = found
    return problems
