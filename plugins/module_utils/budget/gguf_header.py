# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GGUF header reader: metadata and tensor infos, never tensor data.

The file is memory-mapped, so only the pages of the header are ever read (a 50 GiB part costs
the same as a 5 MiB one). Every length and count in the file is checked against the bytes that
remain before anything is allocated from it, and against a sane maximum (the MAX_* bounds below,
named in the error), so a truncated or hostile file fails cleanly with bounded memory and time;
errors name the byte offset. Counts that size later work (block and head counts: budget builds
one entry per block) are bounded here too, so no caller prices four million layers.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# Arrays larger than this are skipped (tokenizer vocabularies): only their length is kept.
KEEP_ARRAY_MAX = 4096
# Sane maxima, each far above any published model, each named in the error that refuses it.
MAX_KV_COUNT = 1 << 16  # metadata entries (a model has tens)
MAX_TENSOR_COUNT = 1 << 20  # tensor infos (a large MoE has about 100,000)
MAX_ARRAY_LENGTH = 1 << 24  # array items (the largest vocabularies have about 260,000)
MAX_STRING_BYTES = 1 << 24  # one metadata string (a chat template is tens of KiB)
MAX_TENSOR_NAME_BYTES = 64  # GGML_MAX_NAME: llama.cpp refuses longer tensor names
MAX_BLOCK_COUNT = KEEP_ARRAY_MAX  # blocks (published models have at most a few hundred)
MAX_HEAD_COUNT = 4096  # attention heads per layer (published models have at most 128)
MAX_HEAD_DIM = 1 << 16  # key/value length per head (published models have at most 512)
MAX_EMBEDDING_LENGTH = 1 << 20  # hidden size (published models have at most about 20,000)
MAX_CONTEXT_LENGTH = 1 << 30  # trained context (published models have at most about 10 million)
MAX_WINDOW = 1 << 24  # sliding window (published models have at most a few thousand)
MAX_EXPERT_COUNT = 1 << 16  # routed experts (published models have at most a few hundred)
MAX_SSM_DIM = 1 << 20  # recurrent state sizes (published models have at most tens of thousands)
MAX_SPLIT_COUNT = 99999  # split parts: the -NNNNN-of-NNNNN name holds five digits
MAX_ALIGNMENT = 1 << 16  # general.alignment (llama.cpp writes 32)
# The fix every metadata refusal names: no published model has such a header.
FIX = "this is no model llama.cpp loads: fetch the model again from its source (the payload gate checks its digest)"

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

# GGUF metadata value types
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = range(13)
_SCALAR_FORMATS = {
    _UINT8: struct.Struct("<B"),
    _INT8: struct.Struct("<b"),
    _UINT16: struct.Struct("<H"),
    _INT16: struct.Struct("<h"),
    _UINT32: struct.Struct("<I"),
    _INT32: struct.Struct("<i"),
    _FLOAT32: struct.Struct("<f"),
    _BOOL: struct.Struct("<?"),
    _UINT64: struct.Struct("<Q"),
    _INT64: struct.Struct("<q"),
    _FLOAT64: struct.Struct("<d"),
}
_ARRAY_CODES = {
    _UINT8: "B",
    _INT8: "b",
    _UINT16: "H",
    _INT16: "h",
    _UINT32: "I",
    _INT32: "i",
    _FLOAT32: "f",
    _BOOL: "?",
    _UINT64: "Q",
    _INT64: "q",
    _FLOAT64: "d",
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")
_TENSOR_TAIL = struct.Struct("<IQ")  # ggml type, data offset
_DIMS = {n: struct.Struct(f"<{n}Q") for n in range(1, MAX_DIMS + 1)}
# Smallest possible encodings, used to refuse counts that cannot fit in the file.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8

SPLIT_NAME_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


class GGUFError(ValueError):
    """Malformed, truncated or unsupported GGUF input; the message names the offset."""


class _PrefixShort(Exception):
    """A read ran past the bytes at hand but not past the file: `needed` bytes from the start
    (at least) would let it go on. Never escapes parse_prefix."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


@dataclass(frozen=True)
class PrefixParse:
    """parse_prefix's answer: the header, or how many more bytes the header needs beyond the
    prefix (a lower bound where a loop ran out: the caller grows the prefix geometrically)."""

    header: GGUFHeader | None
    more_bytes: int


class TensorInfo(NamedTuple):
    # A NamedTuple, not a dataclass: a 100,000-tensor header builds this in its hot loop.
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def n_bytes(self) -> int:
        _name, block, size = GGML_TYPES[self.ggml_type]
        return self.n_elements // block * size


@dataclass
class GGUFHeader:
    path: str
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int
    array_lengths: dict[str, int] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    def layer_bytes(self) -> dict[int, int]:
        """Weight bytes per block (`blk.N.*`); tensors outside blocks are keyed by name class."""
        sizes: dict[int, int] = {}
        for tensor in self.tensors:
            match = _LAYER_RE.match(tensor.name)
            if match:
                layer = int(match.group(1))
                sizes[layer] = sizes.get(layer, 0) + tensor.n_bytes
        return sizes

    def non_layer_bytes(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for tensor in self.tensors:
            if not _LAYER_RE.match(tensor.name):
                sizes[tensor.name] = tensor.n_bytes
        return sizes


class _Cursor:
    """Bounds-checked reads from the header's bytes: `end` is how many are at hand (the whole
    mapped file, or a prefix fetched by range requests), `limit` the file's size. Lengths are
    judged against the file; a read past the prefix only asks for more (_PrefixShort)."""

    __slots__ = ("buf", "end", "limit", "pos")

    def __init__(self, buf: Any, end: int, limit: int | None = None) -> None:
        self.buf = buf
        self.end = end
        self.limit = end if limit is None else limit
        self.pos = 0

    def short(self, upto: int) -> bool:
        """Whether bytes up to offset `upto` are in the file but not at hand (raises to ask for them)."""
        if upto > self.end and upto <= self.limit:
            raise _PrefixShort(upto)
        return False

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.limit:
            raise GGUFError(f"truncated or corrupt GGUF: {what} needs {n} bytes at offset {self.pos}, only {self.limit - self.pos} remain")
        self.short(self.pos + n)

    def u32(self, what: str) -> int:
        self.need(4, what)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self, what: str) -> int:
        self.need(8, what)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def string_length(self, what: str) -> int:
        start = self.pos
        length = self.u64(f"{what} length")
        if length > MAX_STRING_BYTES:
            raise GGUFError(f"corrupt GGUF: {what} at offset {start} claims {length} bytes, above MAX_STRING_BYTES ({MAX_STRING_BYTES})")
        if length > self.limit - self.pos:
            raise GGUFError(f"corrupt GGUF: {what} at offset {start} claims {length} bytes, only {self.limit - self.pos} remain")
        self.short(self.pos + length)
        return length

    def string(self, what: str) -> str:
        start = self.pos
        length = self.string_length(what)
        raw = self.buf[self.pos : self.pos + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"corrupt GGUF: {what} at offset {start} is not UTF-8") from exc

    def skip_string(self, what: str) -> None:
        # Two statements: `self.pos += self.string_length(...)` reads pos before the length field
        # is consumed, so every skipped string (a vocabulary past KEEP_ARRAY_MAX) lost 8 bytes.
        length = self.string_length(what)
        self.pos += length


def _read_value(cur: _Cursor, vtype: int, key: str, lengths: dict[str, int]) -> Any:
    scalar = _SCALAR_FORMATS.get(vtype)
    if scalar is not None:
        cur.need(scalar.size, f"value of {key!r}")
        (value,) = scalar.unpack_from(cur.buf, cur.pos)
        cur.pos += scalar.size
        return value
    if vtype == _STRING:
        return cur.string(f"value of {key!r}")
    if vtype == _ARRAY:
        start = cur.pos
        item_type = cur.u32(f"array type of {key!r}")
        count = cur.u64(f"array length of {key!r}")
        lengths[key] = count
        code = _ARRAY_CODES.get(item_type)
        if code is None and item_type != _STRING:
            raise GGUFError(f"unsupported GGUF: array {key!r} at offset {start} has item type {item_type}")
        # The smallest item: a scalar's size, or a string's length field alone.
        size = struct.calcsize(code) if code else 8
        if count > (cur.limit - cur.pos) // size:
            raise GGUFError(f"corrupt GGUF: array {key!r} at offset {start} claims {count} {'items' if code else 'strings'}, the file is too short")
        if count > MAX_ARRAY_LENGTH:
            raise GGUFError(f"corrupt GGUF: array {key!r} at offset {start} claims {count} items, above MAX_ARRAY_LENGTH ({MAX_ARRAY_LENGTH})")
        if code is not None:
            if count > KEEP_ARRAY_MAX:
                cur.pos += count * size
                return None
            cur.need(count * size, f"items of {key!r}")
            values = struct.unpack_from(f"<{count}{code}", cur.buf, cur.pos)
            cur.pos += count * size
            return list(values)
        if count > KEEP_ARRAY_MAX:
            for _item in range(count):
                cur.skip_string(f"item of {key!r}")
            return None
        return [cur.string(f"item of {key!r}") for _item in range(count)]
    raise GGUFError(f"corrupt GGUF: value of {key!r} at offset {cur.pos - 4} has unknown type {vtype}")


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read one GGUF file's header (metadata and tensor infos)."""
    path = os.fspath(path)
    with open(path, "rb") as handle:
        file_size = os.fstat(handle.fileno()).st_size
        if file_size < _HEADER.size:
            raise GGUFError(f"{path}: truncated GGUF: {file_size} bytes, a header needs {_HEADER.size} (offset 0)")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return _parse(path, buf, file_size)
            except GGUFError as exc:
                raise GGUFError(f"{path}: {exc}") from None


def parse_prefix(path: str, prefix: bytes | memoryview, file_size: int) -> PrefixParse:
    """Parse a header from the first bytes of a file of `file_size` bytes (range requests: the
    file is elsewhere). The same parser and bounds as read_header: a hostile length or count is
    refused against the file's size before more bytes are asked for, so a caller never fetches
    what a lie claims."""
    if file_size < _HEADER.size:
        raise GGUFError(f"{path}: truncated GGUF: {file_size} bytes, a header needs {_HEADER.size} (offset 0)")
    available = min(len(prefix), file_size)
    if available < _HEADER.size:
        return PrefixParse(None, _HEADER.size - available)
    if len(prefix) != available or not isinstance(prefix, bytes):
        prefix = bytes(prefix[:available])  # the parser slices names and strings as bytes
    try:
        return PrefixParse(_parse(path, prefix, file_size, available), 0)
    except _PrefixShort as short:
        return PrefixParse(None, max(short.needed - available, 1))
    except GGUFError as exc:
        raise GGUFError(f"{path}: {exc}") from None


def _parse(path: str, buf: Any, file_size: int, available: int | None = None) -> GGUFHeader:
    magic, version, n_tensors, n_kv = _HEADER.unpack_from(buf, 0)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"not a GGUF file: magic {magic!r} at offset 0")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"unsupported GGUF version {version} at offset 4 (supported: 2, 3)")
    cur = _Cursor(buf, file_size if available is None else available, file_size)
    cur.pos = _HEADER.size
    if n_kv > (file_size - cur.pos) // _MIN_KV_BYTES:
        raise GGUFError(f"corrupt GGUF: {n_kv} metadata entries (offset 16) cannot fit in {file_size} bytes")
    if n_tensors > (file_size - cur.pos) // _MIN_TENSOR_BYTES:
        raise GGUFError(f"corrupt GGUF: {n_tensors} tensor infos (offset 8) cannot fit in {file_size} bytes")
    if n_kv > MAX_KV_COUNT:
        raise GGUFError(f"corrupt GGUF: {n_kv} metadata entries (offset 16), above MAX_KV_COUNT ({MAX_KV_COUNT})")
    if n_tensors > MAX_TENSOR_COUNT:
        raise GGUFError(f"corrupt GGUF: {n_tensors} tensor infos (offset 8), above MAX_TENSOR_COUNT ({MAX_TENSOR_COUNT})")

    metadata: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    for _entry in range(n_kv):
        key = cur.string("metadata key")
        vtype = cur.u32(f"type of {key!r}")
        metadata[key] = _read_value(cur, vtype, key, lengths)
    _check_model_counts(metadata)

    tensors = _read_tensor_infos(cur, n_tensors)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not _is_int(alignment) or not 0 < alignment <= MAX_ALIGNMENT or alignment & (alignment - 1):
        raise _refuse(f"general.alignment {repr(alignment)[:60]} is not a power of two in 1-{MAX_ALIGNMENT} (MAX_ALIGNMENT)")
    data_offset = (cur.pos + alignment - 1) // alignment * alignment
    return GGUFHeader(path, version, metadata, tensors, data_offset, file_size, lengths)


# Metadata numbers that callers read (the KV law, placement, read_model) or turn into per-block
# work, keyed by the end of their key (any architecture, projectors' clip.vision.* too):
# suffix -> (bound name, maximum, per-layer list allowed).
_COUNT_BOUNDS: dict[str, tuple[str, int, bool]] = {
    ".block_count": ("MAX_BLOCK_COUNT", MAX_BLOCK_COUNT, False),
    ".leading_dense_block_count": ("MAX_BLOCK_COUNT", MAX_BLOCK_COUNT, False),
    ".nextn_predict_layers": ("MAX_BLOCK_COUNT", MAX_BLOCK_COUNT, False),
    ".full_attention_interval": ("MAX_BLOCK_COUNT", MAX_BLOCK_COUNT, False),
    ".attention.head_count": ("MAX_HEAD_COUNT", MAX_HEAD_COUNT, True),
    ".attention.head_count_kv": ("MAX_HEAD_COUNT", MAX_HEAD_COUNT, True),
    ".attention.key_length": ("MAX_HEAD_DIM", MAX_HEAD_DIM, False),
    ".attention.value_length": ("MAX_HEAD_DIM", MAX_HEAD_DIM, False),
    ".attention.key_length_swa": ("MAX_HEAD_DIM", MAX_HEAD_DIM, False),
    ".attention.value_length_swa": ("MAX_HEAD_DIM", MAX_HEAD_DIM, False),
    ".attention.sliding_window": ("MAX_WINDOW", MAX_WINDOW, False),
    ".embedding_length": ("MAX_EMBEDDING_LENGTH", MAX_EMBEDDING_LENGTH, False),
    ".feed_forward_length": ("MAX_EMBEDDING_LENGTH x 64", MAX_EMBEDDING_LENGTH * 64, True),
    ".expert_feed_forward_length": ("MAX_EMBEDDING_LENGTH x 64", MAX_EMBEDDING_LENGTH * 64, False),
    ".context_length": ("MAX_CONTEXT_LENGTH", MAX_CONTEXT_LENGTH, False),
    ".vocab_size": ("MAX_ARRAY_LENGTH", MAX_ARRAY_LENGTH, False),
    ".expert_count": ("MAX_EXPERT_COUNT", MAX_EXPERT_COUNT, False),
    ".expert_used_count": ("MAX_EXPERT_COUNT", MAX_EXPERT_COUNT, False),
    ".expert_shared_count": ("MAX_EXPERT_COUNT", MAX_EXPERT_COUNT, False),
    ".ssm.conv_kernel": ("MAX_HEAD_DIM", MAX_HEAD_DIM, False),
    ".ssm.inner_size": ("MAX_SSM_DIM", MAX_SSM_DIM, False),
    ".ssm.state_size": ("MAX_SSM_DIM", MAX_SSM_DIM, False),
    ".ssm.time_step_rank": ("MAX_SSM_DIM", MAX_SSM_DIM, False),
    ".ssm.group_count": ("MAX_HEAD_COUNT", MAX_HEAD_COUNT, False),
}
_PATTERN_SUFFIX = ".attention.sliding_window_pattern"  # a period, or one flag per block


def _bound_for(key: str) -> tuple[str, int, bool] | None:
    dot = key.find(".")
    while dot >= 0:
        bound = _COUNT_BOUNDS.get(key[dot:])
        if bound is not None:
            return bound
        dot = key.find(".", dot + 1)
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(what: str) -> GGUFError:
    return GGUFError(f"corrupt GGUF: {what}; {FIX}")


def _check_integer(key: str, value: Any, name: str, limit: int, shown: Any = None) -> None:
    if not _is_int(value):
        raise _refuse(f"{key} is {repr(value if shown is None else shown)[:60]}, expected an integer in 0-{limit} ({name})")
    if not 0 <= value <= limit:
        raise _refuse(f"{key} is {value}, outside 0-{limit} ({name})")


def _check_per_layer(metadata: dict[str, Any], key: str, length: int, suffix: str) -> None:
    """A per-layer array must have one entry per block of its own architecture."""
    blocks_key = key[: -len(suffix)] + ".block_count"
    blocks = metadata.get(blocks_key)
    if _is_int(blocks) and length != blocks:
        raise _refuse(f"{key} has {length} entries for {blocks} blocks ({blocks_key})")


def _check_model_counts(metadata: dict[str, Any]) -> None:
    """Type-check and bound every number the budget and read_model take from the header: budget
    builds one entry per block, so an unchecked block_count of 4,000,000 in a 295-byte file costs
    hundreds of MiB and seconds, and a string, a list or a short per-layer array ends as a Python
    error naming nothing."""
    architecture = metadata.get("general.architecture")
    if architecture is not None and not isinstance(architecture, str):
        raise _refuse(f"general.architecture is {repr(architecture)[:60]}, expected a string")
    # Block counts first, so per-layer arrays are checked against a valid one whatever the key order.
    ordered = sorted(metadata, key=lambda k: not k.endswith(".block_count"))
    for key in ordered:
        value = metadata[key]
        if key.endswith(_PATTERN_SUFFIX):
            if isinstance(value, list):
                for index, flag in enumerate(value):
                    if not isinstance(flag, bool) and flag not in (0, 1):
                        raise _refuse(f"{key}[{index}] is {repr(flag)[:60]}, expected a boolean (one per block)")
                _check_per_layer(metadata, key, len(value), _PATTERN_SUFFIX)
            else:
                _check_integer(key, value, "MAX_BLOCK_COUNT", MAX_BLOCK_COUNT)
            continue
        bound = _bound_for(key)
        if bound is None:
            continue
        name, limit, per_layer = bound
        if per_layer and isinstance(value, list):
            for count in value:
                _check_integer(key, count, name, limit, shown=value)
            suffix = next(s for s in _COUNT_BOUNDS if key.endswith(s))
            _check_per_layer(metadata, key, len(value), suffix)
        else:
            _check_integer(key, value, name, limit)
    for key in [k for k in metadata if k.endswith(".expert_used_count")]:
        experts_key = key[: -len("_used_count")] + "_count"
        experts = metadata.get(experts_key)
        if _is_int(experts) and metadata[key] > experts:
            raise _refuse(f"{key} is {metadata[key]}, more than {experts_key} ({experts})")
    _check_split_keys(metadata)


def _check_split_keys(metadata: dict[str, Any]) -> None:
    """split.count, split.no and split.tensors.count: read_model and the payload gate's whole-set
    check build part names and compare counts from them."""
    count = metadata.get("split.count")
    if count is not None:
        _check_integer("split.count", count, "MAX_SPLIT_COUNT", MAX_SPLIT_COUNT)
    number = metadata.get("split.no")
    if number is not None:
        _check_integer("split.no", number, "MAX_SPLIT_COUNT", MAX_SPLIT_COUNT)
        if count and number >= count:
            raise _refuse(f"split.no is {number}, outside 0-{count - 1} (split.count {count})")
    tensors = metadata.get("split.tensors.count")
    if tensors is not None:
        _check_integer("split.tensors.count", tensors, "MAX_TENSOR_COUNT", MAX_TENSOR_COUNT)


def _read_tensor_infos(cur: _Cursor, n_tensors: int) -> list[TensorInfo]:
    # The hot loop of the reader (100,000 infos in a large MoE): local names, precompiled structs,
    # and struct's own bounds check (struct.error) instead of one comparison per field.
    buf, end, file_size = cur.buf, cur.end, cur.limit
    pos = start = cur.pos
    u64, u32, tail, dims_structs = _U64.unpack_from, _U32.unpack_from, _TENSOR_TAIL.unpack_from, _DIMS
    types = GGML_TYPES
    make = TensorInfo
    tensors = []
    append = tensors.append
    index = 0
    try:
        for index in range(n_tensors):
            start = pos
            (name_len,) = u64(buf, pos)
            pos += 8
            if name_len > MAX_TENSOR_NAME_BYTES:
                limit = f"above MAX_TENSOR_NAME_BYTES ({MAX_TENSOR_NAME_BYTES})"
                raise GGUFError(f"corrupt GGUF: tensor {index} name at offset {start} claims {name_len} bytes, {limit}")
            if name_len > end - pos and not cur.short(pos + name_len):
                raise GGUFError(f"corrupt GGUF: tensor {index} name at offset {start} claims {name_len} bytes, only {file_size - pos} remain")
            name = buf[pos : pos + name_len].decode("utf-8")
            pos += name_len
            (n_dims,) = u32(buf, pos)
            dims_struct = dims_structs.get(n_dims)
            if dims_struct is None:
                raise GGUFError(f"corrupt GGUF: tensor {index} at offset {start} has {n_dims} dimensions (1-{MAX_DIMS})")
            shape = dims_struct.unpack_from(buf, pos + 4)
            pos += 4 + dims_struct.size
            ggml_type, offset = tail(buf, pos)
            pos += 12
            if ggml_type not in types:
                raise GGUFError(f"unsupported GGUF: tensor {index} at offset {start} has ggml type {ggml_type}")
            append(make(name, shape, ggml_type, offset))
    except struct.error:
        cur.short(end + 1)  # a prefix ran out: ask for more before calling the file truncated
        raise GGUFError(f"truncated GGUF: tensor info {index} at offset {start} runs past the end of the file") from None
    except UnicodeDecodeError:
        raise GGUFError(f"corrupt GGUF: tensor {index} name at offset {start} is not UTF-8") from None
    cur.pos = pos
    return tensors


def split_part_paths(first: str | os.PathLike[str], count: int) -> list[str]:
    """The names llama.cpp demands for a split set: STEM-00001-of-0000N.gguf ... (never concatenated)."""
    first = os.fspath(first)
    match = SPLIT_NAME_RE.match(os.path.basename(first))
    if not match:
        raise GGUFError(f"{first}: split.count is {count} but the name does not end in -NNNNN-of-NNNNN.gguf")
    if int(match.group("count")) != count:
        raise GGUFError(f"{first}: name says {int(match.group('count'))} parts, header split.count says {count}")
    directory = os.path.dirname(first)
    stem = match.group("stem")
    return [os.path.join(directory, f"{stem}-{no:05d}-of-{count:05d}.gguf") for no in range(1, count + 1)]


def read_model(path: str | os.PathLike[str], read_part: Callable[[str], GGUFHeader] | None = None) -> GGUFHeader:
    """Read a model: a single file, or the first part of a split set (all parts' tensors merged).

    Metadata comes from the first part (only it carries the architecture keys); tensor infos are
    gathered from every part, each of which is header-only read. `read_part` reads one part's
    header from elsewhere (the Hub, by range requests; it names a missing part itself); by default
    the parts are local files.
    """
    read = read_part or read_header
    first = read(os.fspath(path))
    count = first.get("split.count", 0) or 0
    if count <= 1:
        return first
    if first.get("split.no", 0) != 0:
        raise GGUFError(f"{first.path}: this is part {first.get('split.no') + 1} of a split set; give the first part")
    tensors = list(first.tensors)
    for part_path in split_part_paths(first.path, count)[1:]:
        if read_part is None and not os.path.exists(part_path):
            raise GGUFError(f"{first.path}: split part {part_path} is missing")
        tensors.extend(read(part_path).tensors)
    expected = first.get("split.tensors.count")
    if expected is not None and expected != len(tensors):
        raise GGUFError(f"{first.path}: split.tensors.count says {expected}, the parts hold {len(tensors)}")
    first.tensors = tensors
    return first
