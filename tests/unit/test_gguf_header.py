import gguf
import numpy as np
import pytest
from gguf_files import write_gguf

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGML_TYPES, GGUFError, read_header, read_model, split_part_paths


def test_type_table_matches_the_reference_implementation():
    for type_id, (name, block, size) in GGML_TYPES.items():
        quant = gguf.GGMLQuantizationType(type_id)
        assert quant.name == name
        assert gguf.GGML_QUANT_SIZES[quant] == (block, size)


def test_header_agrees_with_gguf_reader(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", n_layer=3, n_head_kv=[1, 2, 1], extra_kv={"llama.attention.sliding_window": 128})
    ours = read_header(path)
    reference = gguf.GGUFReader(str(path))
    assert ours.architecture == "llama"
    assert ours.arch_key("block_count") == 3
    assert ours.arch_key("attention.head_count_kv") == [1, 2, 1]
    assert ours.arch_key("attention.sliding_window") == 128
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    for mine, theirs in zip(ours.tensors, reference.tensors):
        assert mine.n_bytes == int(theirs.n_bytes)
        assert list(mine.shape) == [int(d) for d in theirs.shape]
        assert mine.ggml_type == int(theirs.tensor_type)
    assert ours.data_offset == reference.data_offset


def test_layer_bytes_group_tensors_by_block(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", n_layer=2, n_embd=64, n_head=2, n_head_kv=1)
    header = read_header(path)
    head_dim = 32
    f16 = 2
    layer0 = (64 * 64 + 2 * head_dim * 64 + 64 * 128) * f16
    layer1 = (64 * 64 + 2 * head_dim * 64 + 64 * 256) * f16
    assert header.layer_bytes() == {0: layer0, 1: layer1}
    assert header.non_layer_bytes() == {"token_embd.weight": 32 * 64 * f16, "output.weight": 32 * 64 * f16}


def _split_set(tmp_path, count=3):
    paths = []
    per_part = 2
    for part in range(count):
        path = tmp_path / f"big-{part + 1:05d}-of-{count:05d}.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        if part == 0:
            writer.add_block_count(count * per_part)
            writer.add_embedding_length(32)
            writer.add_head_count(1)
        writer.add_uint16("split.no", part)
        writer.add_uint16("split.count", count)
        writer.add_int32("split.tensors.count", count * per_part)
        for index in range(per_part):
            il = part * per_part + index
            writer.add_tensor(f"blk.{il}.attn_q.weight", np.zeros((32, 32), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        paths.append(path)
    return paths


def test_split_set_is_read_part_by_part_never_concatenated(tmp_path):
    paths = _split_set(tmp_path)
    model = read_model(paths[0])
    assert model.get("split.count") == 3
    assert len(model.tensors) == 6
    assert sorted(model.layer_bytes()) == list(range(6))
    assert split_part_paths(paths[0], 3) == [str(p) for p in paths]


def test_split_set_refuses_a_missing_part_and_a_non_first_part(tmp_path):
    paths = _split_set(tmp_path)
    with pytest.raises(GGUFError, match="part 2 of a split set"):
        read_model(paths[1])
    paths[2].unlink()
    with pytest.raises(GGUFError, match="00003-of-00003.gguf is missing"):
        read_model(paths[0])


def test_sparse_file_header_is_read_without_touching_data(tmp_path):
    path = write_gguf(tmp_path / "sparse.gguf")
    with open(path, "r+b") as handle:
        handle.truncate(8 * (1 << 30))  # 8 GiB, sparse: reading data would take seconds
    header = read_header(path)
    assert header.file_size == 8 * (1 << 30)
    assert header.architecture == "llama"


def test_a_vocabulary_past_keep_array_max_is_skipped_string_by_string(tmp_path):
    # Found by the differential harness: skipping a string lost its 8-byte length field, so any
    # vocabulary longer than KEEP_ARRAY_MAX (every published model's) misread the next string.
    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_token_list([f"tok{i}" for i in range(5000)])
    writer.add_string("general.after", "still read")
    writer.add_tensor("blk.0.attn_k.weight", np.zeros((2, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_header(path)
    assert header.get("tokenizer.ggml.tokens") is None
    assert header.array_lengths["tokenizer.ggml.tokens"] == 5000
    assert header.get("general.after") == "still read"
    assert [t.name for t in header.tensors] == ["blk.0.attn_k.weight"]
