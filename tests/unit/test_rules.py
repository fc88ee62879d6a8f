"""Shapes the fleet paid for, refused by the gate: each with the seed line that proves it."""

import dataclasses
import json

import pytest
from gguf_files import write_gguf

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape, price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

R9700 = {"name": "r9700-0", "memory": "31.86 GiB", "arch": "gfx1201"}
RTX3090 = {"name": "rtx3090", "memory": "24,576 MiB", "arch": "sm_86"}

# frank-primary's qwen3.8-flash-next shape D (seed 004: "Shape: MAXLEN 200704, SEQS 3 (unchanged -
# the only slot count that compiles)"), one rank so one device prices it.
PRIMARY = {
    "runtime": "vllm",
    "model_file": ".",
    "max_model_len": 200_704,
    "max_num_seqs": 3,
    "kv_cache_dtype": "fp8",
    "kv_cache_memory_bytes": 3.15e9,
    "tensor_parallel": 1,
    "weights_per_rank": "6.28 GiB",
    "calibration": [{"kv_dtype": "fp8", "max_model_len": 262_144, "pool_bytes": 8_311_013_376, "tokens": 1_079_582}],
    "known_bad": [
        {
            "max_num_seqs": 2,
            "reason": "seed 004: '--max-num-seqs 2' cannot compile on this model (torch.compile specializes query_start_loc to SEQS + 1)",
        }
    ],
}


def failures(result, rule):
    return [v for v in result.verdicts if v.rule == rule and not v.ok]


def test_max_num_seqs_2_is_refused_on_the_model_that_cannot_compile_it():
    # Seed 000: "Constraints violated (L['query_start_loc'].size()[0])! ... specialized it to be a
    # constant (3)"; seed 004: "SEQS 2 failed at MNBT 1024 AND 2048; SEQS 3 passed at both".
    bad = failures(price_shape({**PRIMARY, "max_num_seqs": 2}, [R9700]), "known_bad")
    assert len(bad) == 1
    assert bad[0].message.startswith("max_num_seqs 2: known bad for this model: seed 004:")
    assert bad[0].message.endswith("; change max_num_seqs")
    assert not failures(price_shape(PRIMARY, [R9700]), "known_bad")


def test_a_known_bad_entry_must_name_keys_of_the_shape_and_say_why():
    with pytest.raises(ShapeError, match=r"^known_bad\[0\]\.max_num_sequences: not a vllm shape key"):
        parse_shape({**PRIMARY, "known_bad": [{"max_num_sequences": 2, "reason": "x"}]})
    with pytest.raises(ShapeError, match=r"^known_bad\[0\]: expected \{<shape key>: <value>, \.\.\., reason"):
        parse_shape({**PRIMARY, "known_bad": [{"max_num_seqs": 2}]})


def test_fp8_kv_on_sm_86_is_refused():
    # Seed 001: "fp8 KV is hardware-dead on the 3090 (sm_86, no cvt.e4m3x2)".
    shape = {**PRIMARY, "known_bad": [], "weights_per_rank": "7 GiB"}
    bad = failures(price_shape(shape, [RTX3090]), "kv_dtype_illegal")
    assert [v.message for v in bad] == ["kv_cache_dtype: fp8 on rtx3090 (sm_86): fp8 KV is hardware-dead on sm_86 (no cvt.e4m3x2); use bf16/auto"]
    bf16 = [{"kv_dtype": "bf16", "max_model_len": 262_144, "pool_bytes": 11_047_010_304, "tokens": 798_280}]
    assert not failures(price_shape({**shape, "kv_cache_dtype": "auto", "calibration": bf16}, [RTX3090]), "kv_dtype_illegal")
    # Without the arch the gate cannot know: nothing is refused on a guess.
    assert not failures(price_shape(shape, [{k: v for k, v in RTX3090.items() if k != "arch"}]), "kv_dtype_illegal")


def test_fp8_kv_on_sparse_mla_is_refused_on_gfx12_only(tmp_path):
    # Seed 000: "bf16 KV (fp8 is ILLEGAL here — it disables the sparse MLA backend's rope-free
    # Triton path, the only MLA decode gfx12 has)". The model's config says it is sparse MLA.
    model = tmp_path / "glm"
    model.mkdir()
    config = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512, "kv_lora_rank": 512, "index_topk": 2048}
    (model / "config.json").write_text(json.dumps(config))
    shape = {**PRIMARY, "known_bad": [], "model_file": "glm", "max_model_len": 131_072, "max_num_seqs": 2}
    bad = failures(price_shape(shape, [R9700], str(tmp_path)), "kv_dtype_illegal")
    assert len(bad) == 1 and "sparse MLA backend's rope-free Triton path" in bad[0].message
    # The same model on a non-gfx12 card, or a dense-attention model on gfx12, is not refused by this rule.
    assert not failures(price_shape(shape, [{**R9700, "arch": "gfx1151"}], str(tmp_path)), "kv_dtype_illegal")
    (model / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in ("kv_lora_rank", "index_topk")}))
    assert not failures(price_shape(shape, [R9700], str(tmp_path)), "kv_dtype_illegal")
    # Where the config is not on the controller, model_geometry says it.
    explicit = {**PRIMARY, "known_bad": [], "model_geometry": {"attention": "sparse_mla", "n_layer": 4, "n_head_kv": 1, "head_dim": 576}}
    assert failures(price_shape(explicit, [R9700]), "kv_dtype_illegal")


def test_a_device_arch_that_is_not_one_is_refused_with_the_fix():
    with pytest.raises(ShapeError, match=r"^devices\[0\]\.arch: 'rtx3090' is not a GPU architecture; use e\.g\. sm_86, gfx1201 or gfx1151"):
        price_shape(PRIMARY, [{**RTX3090, "arch": "rtx3090"}])


def test_a_window_past_the_trained_one_is_a_warning_not_a_refusal(tmp_path):
    # Seed 003: "the GGUF carries no scaling; positions past the trained 262144 extrapolate on
    # the base rope" - and that shape served. The test GGUF's trained window is 4,096.
    write_gguf(tmp_path / "m.gguf")
    shape = {"runtime": "llamacpp", "model_file": "m.gguf", "ctx_size": 16_384, "parallel": 2}
    result = price_shape(shape, [{"name": "gpu", "memory": "8 GiB"}], str(tmp_path))
    assert result.fits
    assert "WARNING: a 8,192-token window is past the trained 4,096: positions beyond it extrapolate on the base rope" in result.notes
    inside = price_shape({**shape, "ctx_size": 8192}, [{"name": "gpu", "memory": "8 GiB"}], str(tmp_path))
    assert not any(note.startswith("WARNING") for note in inside.notes)


def test_an_override_pattern_that_matches_no_tensor_is_an_error(tmp_path):
    # Seed 001: "The placeholder pattern ngram_embeddings matched nothing — dropped from
    # OT_OVERRIDES ... before it could masquerade as a working override at load time."
    write_gguf(tmp_path / "m.gguf", n_layer=2)
    shape = {"runtime": "llamacpp", "model_file": "m.gguf", "ctx_size": 4096, "override_tensor": {"ffn_down": "CPU", "ngram_embeddings": "CPU"}}
    result = price_shape(shape, [{"name": "gpu", "memory": "8 GiB"}], str(tmp_path))
    bad = failures(result, "override_tensor")
    assert [v.message for v in bad] == ["override_tensor: ngram_embeddings=CPU matches none of the 10 tensors of m.gguf; fix the pattern or drop it"]
    fixed = price_shape({**shape, "override_tensor": {"ffn_down": "CPU", r"blk\.1\.attn_k": "CPU"}}, [{"name": "gpu", "memory": "8 GiB"}], str(tmp_path))
    assert not failures(fixed, "override_tensor")
    with pytest.raises(ShapeError, match=r"^override_tensor\.blk\[: not a regular expression"):
        price_shape({**shape, "override_tensor": {"blk[": "CPU"}}, [{"name": "gpu", "memory": "8 GiB"}], str(tmp_path))


def test_a_header_without_tensor_infos_is_refused_with_the_fix(tmp_path):
    # Seed 001: "Part 1 is metadata-only (ntensors=0)": the override rule needs the tensor infos.
    write_gguf(tmp_path / "m.gguf", n_layer=2)

    def metadata_only(path):
        return dataclasses.replace(read_model(path), tensors=[])

    shape = {"runtime": "llamacpp", "model_file": "m.gguf", "ctx_size": 4096, "override_tensor": {"exps": "CPU"}}
    with pytest.raises(ShapeError, match=r"^model_file: .*m\.gguf lists no tensors; give the first part of the split set"):
        price_shape(shape, [{"name": "gpu", "memory": "8 GiB"}], str(tmp_path), loader=metadata_only)


def test_a_dflash_depth_without_the_block_size_is_flagged_not_refused(tmp_path):
    # Seed 003: DFlash2 "at depth 7 (its block is 8, so 7 is the ceiling llama.cpp allows)" served;
    # without the block size the gate cannot check the depth, and says so.
    write_gguf(tmp_path / "m.gguf")
    shape = {"runtime": "llamacpp", "model_file": "m.gguf", "ctx_size": 4096, "spec_type": "draft-dflash", "draft_max": 7}
    result = price_shape(shape, [{"name": "gpu", "memory": "8 GiB"}], str(tmp_path))
    assert result.fits
    assert any(note.startswith("WARNING: draft_max 7 is unchecked against the drafter's block size") for note in result.notes)
    checked = price_shape({**shape, "drafter_block_size": 8}, [{"name": "gpu", "memory": "8 GiB"}], str(tmp_path))
    assert not any("unchecked" in note for note in checked.notes)
