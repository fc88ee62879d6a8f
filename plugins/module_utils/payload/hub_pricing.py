# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Price a model on the Hub before its download: read only what the budget reads, by range requests.

A GGUF model (every split part, the projector, the drafter) is priced from its headers: each file's
first bytes are fetched (`initial_prefix`) and handed to the header parser (budget/gguf_header.py
`parse_prefix`), which says how many more bytes it needs; the prefix grows to at least twice its
length until the header is whole. A Hugging Face model is priced from its config.json and its
safetensors headers (8 bytes of length, then JSON), which size the weights. The answer is the
shape's own explicit keys (`model_geometry`, `drafter_geometry`, `projector_bytes`, `weights`),
built by the functions that price a payload on disk, so the ledger is the one the downloaded files
give.

Everything goes through the payload gate's Hub client (hub_client.py): the token reaches the Hub's
origin only (never a CDN), the endpoint is HF_ENDPOINT's or the caller's, redirects are followed by
hand. What a Hub may make us read is bounded: one GGUF header (MAX_GGUF_HEADER_BYTES), one
safetensors header (MAX_SAFETENSORS_HEADER_BYTES, the safetensors format's own limit), one config
(MAX_CONFIG_BYTES) and the whole file set (`max_total_bytes`), each named in the error that refuses it.
"""

from __future__ import annotations

import http.client
import json
import posixpath
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import MAX_CONFIG_BYTES, check_hf_config, geometry_mapping
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFError, GGUFHeader, parse_prefix, read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import MAX_FILE_BYTES, HubClient, HubError
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.identity import closest_name
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

INITIAL_PREFIX = 256 << 10  # a small model's whole header; a 150,000-token vocabulary needs a few MiB
MAX_GGUF_HEADER_BYTES = 256 << 20  # one GGUF header (the largest published, a big MoE's, are tens of MiB)
SMALL_PREFIX = 64 << 10  # a config, an index, a safetensors header of about a thousand tensors
MAX_SAFETENSORS_HEADER_BYTES = 100_000_000  # the safetensors format's own MAX_HEADER_SIZE
MAX_TOTAL_BYTES = 1 << 30  # everything one pricing reads, all files together
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
# safetensors dtype -> bytes per element (a packed sub-byte dtype is checked by its span alone).
_SAFETENSORS_DTYPES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}


class HubPricingError(RuntimeError):
    """A file the pricing cannot read or trust; the message names the file, the repo and the
    revision. `status` is the Hub's HTTP status where one refused the read (0 otherwise)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class FileRead:
    """What pricing read of one file: its size on the Hub, the bytes fetched and the requests made."""

    path: str
    size: int = 0
    bytes_read: int = 0
    requests: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "bytes_read": self.bytes_read, "requests": self.requests}


@dataclass
class HubPricing:
    """The shape keys that price this model as its downloaded files would, and what it cost."""

    repo_id: str
    revision: str
    commit: str
    model_format: str  # gguf | safetensors
    shape_keys: dict[str, Any]
    files: list[FileRead] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes_read(self) -> int:
        return sum(f.bytes_read for f in self.files)

    @property
    def requests(self) -> int:
        return sum(f.requests for f in self.files)

    def as_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "model_format": self.model_format,
            "shape_keys": self.shape_keys,
            "files": [f.as_dict() for f in self.files],
            "bytes_read": self.bytes_read,
            "bytes_total": sum(f.size for f in self.files),
            "requests": self.requests,
            "seconds": round(self.seconds, 4),
        }


class HubRanges:
    """Byte ranges of one repo's files at one commit, through the payload gate's client, within
    `max_total_bytes` all files together. Each file's next range goes to the URL that answered the
    last (the CDN's), on connections kept alive per origin."""

    def __init__(self, client: HubClient, repo_id: str, commit: str, revision: str, repo_type: str = "model", max_total_bytes: int = MAX_TOTAL_BYTES) -> None:
        self.client = client
        self.repo_id = repo_id
        self.commit = commit
        self.revision = revision
        self.repo_type = repo_type
        self.max_total_bytes = max_total_bytes
        self.reads: dict[str, FileRead] = {}
        self._answered: dict[str, str] = {}
        self._conns: dict[Any, http.client.HTTPConnection] = {}

    @property
    def where(self) -> str:
        shown = self.revision if self.revision == self.commit else f"{self.revision} ({self.commit})"
        return f"{self.repo_id}@{shown}"

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def total_read(self) -> int:
        return sum(r.bytes_read for r in self.reads.values())

    def read(self, path: str, start: int, length: int) -> tuple[bytes, int]:
        """Bytes start..start+length-1 of `path` (fewer at the file's end) and the file's size."""
        record = self.reads.setdefault(path, FileRead(path))
        if self.total_read() + length > self.max_total_bytes:
            raise HubPricingError(
                f"{self.where}: {path}: reading {length} more bytes would pass max_total_bytes ({self.max_total_bytes}) for this pricing; "
                "the headers the budget needs are far smaller: check the endpoint (HF_ENDPOINT), or raise max_total_bytes"
            )
        url = self._answered.get(path) or self.client.resolve_url(self.repo_id, self.commit, path, self.repo_type)
        end = start + length - 1
        record.requests += 1
        try:
            response, answered = self.client.open_range(self._conns, url, start, end)
        except HubError as exc:
            raise self._refusal(path, exc) from None
        self._answered[path] = answered
        try:
            return self._body(path, response, start, end, record)
        finally:
            if not response.isclosed():
                # Not read to its end: the connection cannot carry another request.
                self.close()

    def _body(self, path: str, response: http.client.HTTPResponse, start: int, end: int, record: FileRead) -> tuple[bytes, int]:
        def untrusted(what: str) -> HubPricingError:
            return HubPricingError(f"{self.where}: {path}: {what}; check the endpoint (HF_ENDPOINT)")

        content_range = (response.getheader("Content-Range") or "").strip()
        match = _CONTENT_RANGE_RE.match(content_range)
        if not match:
            raise untrusted(f"asked for bytes {start}-{end}, the answer's Content-Range is {content_range[:80]!r}")
        first, last, size = (int(value) for value in match.groups())
        if size > MAX_FILE_BYTES:
            raise untrusted(f"Content-Range says the file is {size} bytes, above MAX_FILE_BYTES ({MAX_FILE_BYTES})")
        if first != start or last < first or last > min(end, size - 1) or (last != end and last != size - 1):
            raise untrusted(f"asked for bytes {start}-{end}, got Content-Range {content_range!r}")
        if record.size and record.size != size:
            raise untrusted(f"its size changed from {record.size} to {size} bytes between two ranges of one pinned revision")
        record.size = size
        want = last - first + 1
        try:
            data = response.read(want)
        except (OSError, http.client.HTTPException) as exc:
            raise untrusted(f"bytes {start}-{last}: {exc}") from None
        if len(data) != want:
            raise untrusted(f"bytes {start}-{last}: the answer ended after {len(data)} of {want} bytes")
        record.bytes_read += want
        return data, size

    def _refusal(self, path: str, exc: HubError) -> HubPricingError:
        if exc.status == 404:
            return HubPricingError(
                f"{self.where}: {path} is not in the repo at this revision (HTTP 404); check the file name (model_file, projector, drafter) "
                "against the repo's files at that revision",
                404,
            )
        if exc.status in (401, 403):
            return HubPricingError(
                f"{self.where}: {path}: HTTP {exc.status}: the repo is gated or private: give a token with access via HF_TOKEN (or the module's token)",
                exc.status,
            )
        if exc.status == 200:
            return HubPricingError(
                f"{self.where}: {path}: the endpoint ignores Range requests (it answered the whole file); pricing from the Hub reads headers by "
                "range: use an endpoint that honours Range, or price after the download (payload_dir)"
            )
        if exc.status == 416:
            return HubPricingError(f"{self.where}: {path}: the file is empty (HTTP 416 to its first bytes); no model file is empty")
        return HubPricingError(f"{self.where}: {path}: {exc}", exc.status)


# --- GGUF ----------------------------------------------------------------------------------


class GGUFHeaders:
    """GGUF headers read by growing prefixes, each file once per pricing."""

    def __init__(self, ranges: HubRanges, initial_prefix: int = INITIAL_PREFIX, max_header_bytes: int = MAX_GGUF_HEADER_BYTES) -> None:
        self.ranges = ranges
        self.initial_prefix = max(initial_prefix, 24)
        self.max_header_bytes = max_header_bytes
        self._headers: dict[str, GGUFHeader] = {}

    def header(self, path: str) -> GGUFHeader:
        if path not in self._headers:
            self._headers[path] = self._read(path)
        return self._headers[path]

    def _read(self, path: str) -> GGUFHeader:
        where = self.ranges.where
        prefix, size = self.ranges.read(path, 0, min(self.initial_prefix, self.max_header_bytes))
        buffer = bytearray(prefix)
        while True:
            try:
                parsed = parse_prefix(path, buffer, size)
            except GGUFError as exc:
                raise HubPricingError(f"{where}: {exc}") from None
            if parsed.header is not None:
                return parsed.header
            # At least what the parser asks for, and at least double: a header is read in a few requests.
            target = min(size, max(len(buffer) + parsed.more_bytes, 2 * len(buffer)))
            if target <= len(buffer):  # the parser wants more than the file holds: it said so already
                raise HubPricingError(f"{where}: {path}: the GGUF header runs past the end of the file ({size} bytes)")
            if target > self.max_header_bytes:
                raise HubPricingError(
                    f"{where}: {path}: its GGUF header needs more than {self.max_header_bytes} bytes (MAX_GGUF_HEADER_BYTES); no published model's "
                    "header is that long: check the file, or price after the download (payload_dir)"
                )
            more, _size = self.ranges.read(path, len(buffer), target - len(buffer))
            buffer += more


def _gguf_shape_keys(headers: GGUFHeaders, model_file: str, projector: str | None, drafter: str | None) -> dict[str, Any]:
    """What the budget builds from the files on disk (pricing.PayloadReader with read_model), from
    the Hub: the model's and the drafter's geometry (load_geometry: geometry_from_header) and the
    projector's tensor bytes (the llama.cpp driver's _projector_bytes)."""
    where = headers.ranges.where

    def model(path: str, field_name: str) -> GGUFHeader:
        try:
            return read_model(path, headers.header)
        except GGUFError as exc:
            raise HubPricingError(f"{where}: {field_name}: {exc}") from None

    def geometry(path: str, field_name: str) -> dict[str, Any]:
        try:
            return geometry_mapping(kv_law.geometry_from_header(model(path, field_name)))
        except kv_law.KvLawError as exc:
            raise HubPricingError(f"{where}: {field_name}: {exc}") from None

    keys: dict[str, Any] = {"model_geometry": geometry(model_file, "model_file")}
    if projector:
        keys["projector_bytes"] = model(projector, "projector").tensor_bytes()
    if drafter:
        keys["drafter_geometry"] = geometry(drafter, "drafter")
    return keys


# --- Hugging Face (config.json, safetensors) -----------------------------------------------


def _read_small(ranges: HubRanges, path: str, limit: int, what: str) -> bytes:
    """A whole small file (a config, an index), refused unread past `limit` bytes."""
    data, size = ranges.read(path, 0, min(limit, SMALL_PREFIX))
    if size > limit:
        raise HubPricingError(f"{ranges.where}: {path} is {size} bytes, above {what}; a model's is a few KiB: check the file")
    if size > len(data):
        more, _size = ranges.read(path, len(data), size - len(data))
        data += more
    return data


def _json(ranges: HubRanges, path: str, raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise HubPricingError(f"{ranges.where}: {path}: not JSON a budget can read (nested too deep)") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        raise HubPricingError(f"{ranges.where}: {path}: not JSON ({exc})") from None


def safetensors_weight_bytes(ranges: HubRanges, path: str) -> tuple[int, list[str]]:
    """The bytes of every tensor one safetensors file holds, from its header alone, and their names."""
    where = f"{ranges.where}: {path}"
    head, size = ranges.read(path, 0, SMALL_PREFIX)
    if size < 8:
        raise HubPricingError(f"{where}: {size} bytes, a safetensors file starts with an 8-byte header length")
    length = int.from_bytes(head[:8], "little")
    if length > MAX_SAFETENSORS_HEADER_BYTES:
        raise HubPricingError(
            f"{where}: its header claims {length} bytes, above MAX_SAFETENSORS_HEADER_BYTES ({MAX_SAFETENSORS_HEADER_BYTES}, the format's own limit); "
            "this is no safetensors file: check the file"
        )
    if 8 + length > size:
        raise HubPricingError(f"{where}: its header claims {length} bytes, the file holds {size}; the file is truncated or no safetensors file")
    if 8 + length > len(head):
        more, _size = ranges.read(path, len(head), 8 + length - len(head))
        head += more
    header = _json(ranges, path, head[8 : 8 + length])
    if not isinstance(header, dict):
        raise HubPricingError(f"{where}: its header is a JSON {type(header).__name__}, expected an object of tensors")
    data_bytes = size - 8 - length
    total = 0
    names = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        total += _tensor_span(where, name, info, data_bytes)
        names.append(name)
    return total, names


def _tensor_span(where: str, name: str, info: Any, data_bytes: int) -> int:
    """One tensor's bytes: its data_offsets span, within the data section, matching its dtype and shape."""
    shown = repr(name)[:80]
    if not isinstance(info, dict):
        raise HubPricingError(f"{where}: tensor {shown} is {repr(info)[:60]}, expected dtype, shape and data_offsets")
    offsets, shape, dtype = info.get("data_offsets"), info.get("shape"), info.get("dtype")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in offsets)):
        raise HubPricingError(f"{where}: tensor {shown} data_offsets is {repr(offsets)[:60]}, expected [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes:
        raise HubPricingError(f"{where}: tensor {shown} data_offsets [{begin}, {end}] lie outside the data section's {data_bytes} bytes")
    if not (isinstance(shape, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape)):
        raise HubPricingError(f"{where}: tensor {shown} shape is {repr(shape)[:60]}, expected a list of whole numbers")
    element = _SAFETENSORS_DTYPES.get(dtype) if isinstance(dtype, str) else None
    if element is not None:
        count = 1
        for dim in shape:
            count *= dim
        if count * element != end - begin:
            raise HubPricingError(f"{where}: tensor {shown} is {dtype} {shape} ({count * element} bytes) but spans {end - begin} bytes")
    return end - begin


def _hf_shape_keys(ranges: HubRanges, model_file: str, weights_files: list[str] | None) -> dict[str, Any]:
    """What the budget builds from a Hugging Face directory on disk (load_geometry: config.json,
    geometry_from_hf_config), and the weights the safetensors headers size (the shape's `weights`)."""
    where = ranges.where
    root = "" if model_file in ("", ".") else model_file  # "." is the repo's root
    config_path = model_file if model_file.endswith(".json") else posixpath.join(root, "config.json")
    directory = posixpath.dirname(config_path)
    config = _json(ranges, config_path, _read_small(ranges, config_path, MAX_CONFIG_BYTES, f"MAX_CONFIG_BYTES ({MAX_CONFIG_BYTES})"))
    try:
        check_hf_config(config, f"{where}: {config_path}", "model_file")
        geometry = geometry_mapping(kv_law.geometry_from_hf_config(config, config_path))
    except (ShapeError, kv_law.KvLawError) as exc:
        raise HubPricingError(str(exc)) from None
    shards, weight_map = _safetensors_files(ranges, directory, weights_files)
    total = 0
    for shard in shards:
        size, names = safetensors_weight_bytes(ranges, shard)
        expected = {name for name, file in weight_map.items() if posixpath.join(directory, file) == shard}
        missing = sorted(expected - set(names))
        if missing:
            raise HubPricingError(f"{where}: {SAFETENSORS_INDEX} places {len(missing)} tensor(s) in {shard} that its header lacks: {', '.join(missing[:5])}")
        total += size
    return {"model_geometry": geometry, "weights": total}


def _safetensors_files(ranges: HubRanges, directory: str, given: list[str] | None) -> tuple[list[str], dict[str, str]]:
    """The shards to read: those given, else the index's weight map, else the single model.safetensors."""
    if given:
        return [posixpath.join(directory, name) for name in given], {}
    index_path = posixpath.join(directory, SAFETENSORS_INDEX)
    try:
        raw = _read_small(ranges, index_path, 64 << 20, "64 MiB")
    except HubPricingError as exc:
        if exc.status != 404:
            raise
        # Its absence is the answer (a single-file model); the request stays counted.
        return [posixpath.join(directory, SAFETENSORS_SINGLE)], {}
    index = _json(ranges, index_path, raw)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise HubPricingError(f"{ranges.where}: {index_path}: expected an object with a weight_map of tensor -> file")
    files = sorted(set(weight_map.values()))
    for name in files:
        if "/" in name or name in ("", ".", ".."):
            raise HubPricingError(f"{ranges.where}: {index_path}: weight_map names {name[:80]!r}, expected a file beside the index")
    return [posixpath.join(directory, name) for name in files], weight_map


# --- the entry point -----------------------------------------------------------------------


def price_from_hub(
    client: HubClient,
    repo_id: str,
    model_file: str,
    revision: str = "main",
    projector: str | None = None,
    drafter: str | None = None,
    weights_files: list[str] | None = None,
    repo_type: str = "model",
    initial_prefix: int = INITIAL_PREFIX,
    max_total_bytes: int = MAX_TOTAL_BYTES,
) -> HubPricing:
    """The shape keys that price `model_file` (a GGUF, the first part of a split set; or a
    Hugging Face directory or its config.json) as its downloaded files would, read by range requests.

    The revision is pinned to its commit first (a 40-hex revision is used as given), so every file
    is read at the same commit."""
    started = time.monotonic()
    if not model_file:
        raise HubPricingError(f"{repo_id}@{revision}: model_file is empty; name the GGUF (first part of a split set) or the model's directory")
    try:
        commit = revision if _COMMIT_RE.match(revision) else client.resolve_commit(repo_id, revision, repo_type)
    except HubError as exc:
        raise HubPricingError(f"{repo_id}@{revision}: cannot resolve the revision: {exc}", exc.status) from None
    ranges = HubRanges(client, repo_id, commit, revision, repo_type, max_total_bytes)
    try:
        keys, model_format = _read_shape_keys(ranges, model_file, projector, drafter, weights_files, initial_prefix)
    except HubPricingError as exc:
        if exc.status != 404:
            raise
        raise _misnamed(client, ranges, {"model_file": model_file, "projector": projector, "drafter": drafter}) or exc from None
    finally:
        ranges.close()
    return HubPricing(repo_id, revision, commit, model_format, keys, list(ranges.reads.values()), time.monotonic() - started)


def _read_shape_keys(
    ranges: HubRanges, model_file: str, projector: str | None, drafter: str | None, weights_files: list[str] | None, initial_prefix: int
) -> tuple[dict[str, Any], str]:
    """The shape keys and the model's format: a GGUF's headers, or a Hugging Face model's config and
    safetensors headers."""
    if model_file.endswith(".gguf"):
        return _gguf_shape_keys(GGUFHeaders(ranges, initial_prefix), model_file, projector, drafter), "gguf"
    if projector or drafter:
        where = f"{ranges.repo_id}@{ranges.revision}"
        raise HubPricingError(f"{where}: projector and drafter are GGUF files of a llama.cpp shape; {model_file} is a Hugging Face model")
    return _hf_shape_keys(ranges, model_file.rstrip("/") or ".", weights_files), "safetensors"


def _misnamed(client: HubClient, ranges: HubRanges, names: dict[str, str | None]) -> HubPricingError | None:
    """After a 404: the shape key whose file the repo lacks, with the closest name its tree holds
    (one listing of the tree at the pinned commit), or None where the listing cannot say more."""
    try:
        files = {entry["path"] for entry in client.list_tree(ranges.repo_id, ranges.commit, ranges.repo_type)}
    except HubError:
        return None
    directories = {posixpath.dirname(path) or "." for path in files if posixpath.basename(path) == "config.json"}
    for key, path in names.items():
        if not path:
            continue
        if path.endswith(".gguf"):
            if path in files:
                continue
            closest = closest_name(path, files)
        else:  # a Hugging Face model: a directory holding config.json, or that file
            directory = posixpath.dirname(path) if posixpath.basename(path) == "config.json" else path.rstrip("/") or "."
            if posixpath.normpath(directory) in directories:
                continue
            closest = closest_name(path, files | directories)
        hint = f"; did you mean {closest!r}?" if closest else f"; it holds {len(files)} files, none close to it"
        return HubPricingError(f"{key}: {path} is not in the repo at this revision (HTTP 404){hint} (repo {ranges.where})", 404)
    return None


def fill_shape(shape: dict[str, Any], shape_keys: dict[str, Any]) -> dict[str, Any]:
    """The shape with the Hub's keys where it gives none: a geometry or size the inventory states
    stays the one priced."""
    filled = dict(shape)
    for key, value in shape_keys.items():
        if filled.get(key) is None:
            filled[key] = value
    return filled
