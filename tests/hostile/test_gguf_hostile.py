"""Hostile and broken GGUF headers: each is refused with a GGUFError that names the offset or the
bound it breaks, in bounded time and memory (see README.md for which finding each case proves)."""

import struct
import time

import pytest
from gguf_files import write_gguf

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFError, read_header, read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import geometry_from_header


def test_truncated_file_fails_with_offset(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    data = path.read_bytes()
    header = read_header(path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: header.data_offset - 40])
    with pytest.raises(GGUFError, match=r"offset \d+"):
        read_header(cut)
    tiny = tmp_path / "tiny.gguf"
    tiny.write_bytes(b"GGUF")
    with pytest.raises(GGUFError, match="truncated"):
        read_header(tiny)


def _raw_gguf(kv_blob: bytes, n_kv: int = 1, n_tensors: int = 0, tail: bytes = b"") -> bytes:
    return struct.pack("<4sIQQ", b"GGUF", 3, n_tensors, n_kv) + kv_blob + tail


def test_hostile_string_length_is_refused_without_allocating(tmp_path):
    key = b"general.name"
    blob = struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) + struct.pack("<Q", 1 << 60)
    path = tmp_path / "hostile.gguf"
    path.write_bytes(_raw_gguf(blob) + b"\0" * 64)
    with pytest.raises(GGUFError, match=r"claims 1152921504606846976 bytes.*|offset 2\d") as info:
        read_header(path)
    assert "offset" in str(info.value)


def test_absurd_counts_are_refused(tmp_path):
    path = tmp_path / "counts.gguf"
    path.write_bytes(_raw_gguf(b"", n_kv=0, n_tensors=1 << 50) + b"\0" * 128)
    with pytest.raises(GGUFError, match="tensor infos .* cannot fit"):
        read_header(path)
    path.write_bytes(_raw_gguf(b"", n_kv=1 << 40) + b"\0" * 128)
    with pytest.raises(GGUFError, match="metadata entries .* cannot fit"):
        read_header(path)


def test_absurd_array_length_is_refused(tmp_path):
    key = b"tokenizer.ggml.tokens"
    blob = struct.pack("<Q", len(key)) + key + struct.pack("<I", 9) + struct.pack("<IQ", 8, 1 << 59)
    path = tmp_path / "array.gguf"
    path.write_bytes(_raw_gguf(blob) + b"\0" * 64)
    with pytest.raises(GGUFError, match="claims 576460752303423488 strings"):
        read_header(path)


def test_too_many_dimensions_and_unknown_type_are_refused(tmp_path):
    name = b"t"
    info = struct.pack("<Q", 1) + name + struct.pack("<I", 9)
    path = tmp_path / "dims.gguf"
    path.write_bytes(_raw_gguf(b"", n_kv=0, n_tensors=1, tail=info) + b"\0" * 128)
    with pytest.raises(GGUFError, match="9 dimensions"):
        read_header(path)
    info = struct.pack("<Q", 1) + name + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<IQ", 99, 0)
    path.write_bytes(_raw_gguf(b"", n_kv=0, n_tensors=1, tail=info) + b"\0" * 128)
    with pytest.raises(GGUFError, match="ggml type 99"):
        read_header(path)


def test_not_gguf_and_old_versions_are_refused(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + b"\0" * 60)
    with pytest.raises(GGUFError, match="magic"):
        read_header(path)
    path.write_bytes(struct.pack("<4sIQQ", b"GGUF", 1, 0, 0) + b"\0" * 32)
    with pytest.raises(GGUFError, match="version 1"):
        read_header(path)


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    raw = key.encode()
    return struct.pack("<Q", len(raw)) + raw + struct.pack("<I", vtype) + payload


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _llama(block_count: int, head_count: bytes = struct.pack("<I", 32)) -> bytes:
    """A tiny llama header (no tensors) claiming `block_count` blocks; 295 bytes with padding."""
    entries = [
        _kv("general.architecture", 8, _string("llama")),
        _kv("llama.block_count", 10, struct.pack("<Q", block_count)),
        _kv("llama.embedding_length", 4, struct.pack("<I", 4096)),
        _kv("llama.attention.head_count", 4, head_count) if len(head_count) == 4 else _kv("llama.attention.head_count", 9, head_count),
        _kv("llama.attention.head_count_kv", 4, struct.pack("<I", 8)),
    ]
    blob = _raw_gguf(b"".join(entries), n_kv=len(entries))
    return blob + b"\0" * max(0, 295 - len(blob))


@pytest.mark.parametrize("blocks", [4_000_000, 1 << 40])
def test_absurd_block_count_is_refused_before_any_layer_is_built(tmp_path, blocks):
    # Before the bound: 4,000,000 blocks in a 295-byte file cost 687 MiB and 28 s in budget's
    # geometry_from_header, and 2**40 ran out of memory.
    path = tmp_path / "blocks.gguf"
    path.write_bytes(_llama(blocks))
    started = time.monotonic()
    with pytest.raises(GGUFError, match=rf"llama\.block_count is {blocks}, outside 0-4096 \(MAX_BLOCK_COUNT\)"):
        geometry_from_header(read_model(path))
    assert time.monotonic() - started < 1.0


def test_a_real_block_count_still_prices(tmp_path):
    path = tmp_path / "ok.gguf"
    path.write_bytes(_llama(4096))
    assert len(geometry_from_header(read_model(path)).layers) == 4096


@pytest.mark.parametrize(
    "head_count",
    [struct.pack("<I", 1 << 31), struct.pack("<IQ", 5, 2) + struct.pack("<2i", 8, -1)],
    ids=["scalar-2**31", "per-layer-negative"],
)
def test_absurd_head_counts_are_refused(tmp_path, head_count):
    path = tmp_path / "heads.gguf"
    path.write_bytes(_llama(2, head_count))
    with pytest.raises(GGUFError, match=r"llama\.attention\.head_count is -?\d+, outside 0-4096 \(MAX_HEAD_COUNT\)"):
        read_header(path)


def _sparse(path, blob: bytes, size: int):
    """A file of `size` bytes (sparse: costs no disk) starting with blob, so a count can fit the
    file size and only the sane maximum refuses it."""
    with open(path, "wb") as handle:
        handle.write(blob)
        handle.truncate(size)
    return path


def test_array_longer_than_the_maximum_is_refused_even_when_it_fits_the_file(tmp_path):
    blob = _raw_gguf(_kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 0, (1 << 24) + 1)))
    path = _sparse(tmp_path / "array.gguf", blob, 1 << 25)
    with pytest.raises(GGUFError, match=r"16777217 items, above MAX_ARRAY_LENGTH \(16777216\)"):
        read_header(path)


def test_counts_above_the_maximum_are_refused_even_when_they_fit_the_file(tmp_path):
    path = _sparse(tmp_path / "tensors.gguf", _raw_gguf(b"", n_kv=0, n_tensors=(1 << 20) + 1), 1 << 26)
    with pytest.raises(GGUFError, match=r"1048577 tensor infos .*MAX_TENSOR_COUNT \(1048576\)"):
        read_header(path)
    path = _sparse(tmp_path / "kv.gguf", _raw_gguf(b"", n_kv=(1 << 16) + 1), 1 << 22)
    with pytest.raises(GGUFError, match=r"65537 metadata entries .*MAX_KV_COUNT \(65536\)"):
        read_header(path)


def test_strings_longer_than_the_maximum_are_refused_even_when_they_fit_the_file(tmp_path):
    blob = _raw_gguf(_kv("general.name", 8, struct.pack("<Q", (1 << 24) + 1)))
    path = _sparse(tmp_path / "string.gguf", blob, 1 << 25)
    with pytest.raises(GGUFError, match=r"16777217 bytes, above MAX_STRING_BYTES \(16777216\)"):
        read_header(path)
    info = struct.pack("<Q", 65) + b"t" * 65 + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<IQ", 0, 0)
    path.write_bytes(_raw_gguf(b"", n_kv=0, n_tensors=1, tail=info) + b"\0" * 128)
    with pytest.raises(GGUFError, match=r"65 bytes, above MAX_TENSOR_NAME_BYTES \(64\)"):
        read_header(path)


def _model_with(tmp_path, extra_kv: dict, n_layer: int = 4):
    return write_gguf(tmp_path / "m.gguf", n_layer=n_layer, extra_kv=extra_kv)


@pytest.mark.parametrize(
    ("extra_kv", "message"),
    [
        pytest.param(
            {"llama.attention.sliding_window": 128, "llama.attention.sliding_window_pattern": [True, False]},
            r"llama\.attention\.sliding_window_pattern has 2 entries for 4 blocks \(llama\.block_count\)",
            id="swa-pattern-shorter-than-blocks",
        ),
        pytest.param(
            {"llama.attention.sliding_window": 128, "llama.attention.sliding_window_pattern": ["a", "b", "c", "d"]},
            r"llama\.attention\.sliding_window_pattern\[0\] is 'a', expected a boolean",
            id="swa-pattern-of-strings",
        ),
        pytest.param(
            {"llama.full_attention_interval": "every"}, r"llama\.full_attention_interval is 'every', expected an integer in 0-4096", id="interval-string"
        ),
        pytest.param({"llama.ssm.conv_kernel": "4"}, r"llama\.ssm\.conv_kernel is '4', expected an integer in 0-", id="conv-kernel-string"),
        pytest.param({"llama.ssm.inner_size": [1, 2]}, r"llama\.ssm\.inner_size is \[1, 2\], expected an integer", id="ssm-inner-list"),
        pytest.param({"llama.attention.key_length": "128"}, r"llama\.attention\.key_length is '128', expected an integer in 0-65536", id="key-length-string"),
        pytest.param(
            {"llama.attention.sliding_window": 1 << 30}, r"llama\.attention\.sliding_window is 1073741824, outside 0-16777216 \(MAX_WINDOW\)", id="window-2**30"
        ),
        pytest.param({"llama.expert_count": 1 << 20}, r"llama\.expert_count is 1048576, outside 0-65536 \(MAX_EXPERT_COUNT\)", id="experts-2**20"),
        pytest.param(
            {"llama.expert_count": 8, "llama.expert_used_count": 9},
            r"llama\.expert_used_count is 9, more than llama\.expert_count \(8\)",
            id="used-above-experts",
        ),
        pytest.param({"llama.vocab_size": "lots"}, r"llama\.vocab_size is 'lots', expected an integer", id="vocab-string"),
        pytest.param({"split.count": "2"}, r"split\.count is '2', expected an integer in 0-99999", id="split-count-string"),
        pytest.param({"split.count": [2, 3]}, r"split\.count is \[2, 3\], expected an integer in 0-99999", id="split-count-list"),
        pytest.param({"split.count": 2, "split.no": 5}, r"split\.no is 5, outside 0-1 \(split\.count 2\)", id="split-no-past-count"),
        pytest.param({"split.count": 2, "split.tensors.count": "x"}, r"split\.tensors\.count is 'x', expected an integer", id="split-tensors-string"),
    ],
)
def test_bad_model_keys_are_refused_naming_the_key_and_the_file(tmp_path, extra_kv, message):
    # Before: an IndexError, TypeError or bare ValueError from the KV law or read_model, no key named.
    path = _model_with(tmp_path, extra_kv)
    with pytest.raises(GGUFError, match=message) as info:
        geometry_from_header(read_model(path))
    assert str(path) in str(info.value), "the file is named"
    assert "fetch the model again" in str(info.value), "the fix is named"


def test_a_per_layer_head_count_of_the_wrong_length_names_the_file(tmp_path):
    # Before: the KV law's "2 per-layer values for 3 layers" named neither the file nor the block count.
    path = tmp_path / "heads.gguf"
    path.write_bytes(_llama(3, struct.pack("<IQ", 5, 2) + struct.pack("<2i", 8, 8)))
    with pytest.raises(GGUFError, match=rf"{path}: .*llama\.attention\.head_count has 2 entries for 3 blocks \(llama\.block_count\)"):
        read_header(path)


def test_the_split_count_reader_of_the_payload_gate_names_the_key(tmp_path):
    # Before: int() of a list raised TypeError out of the structure check.
    from ansible_collections.frank.llm_fleet.plugins.modules.hf_payload_gate import gguf_split_count

    path = _model_with(tmp_path, {"split.count": [2]})
    with pytest.raises(GGUFError, match=r"split\.count is \[2\], expected an integer"):
        gguf_split_count(str(path))


def test_a_real_sliding_window_pattern_and_split_keys_still_read(tmp_path):
    pattern = [True, True, True, False]
    path = _model_with(tmp_path, {"llama.attention.sliding_window": 128, "llama.attention.sliding_window_pattern": pattern, "split.no": 0})
    geometry = geometry_from_header(read_model(path))
    assert [layer.kind for layer in geometry.layers] == ["swa", "swa", "swa", "full"]
