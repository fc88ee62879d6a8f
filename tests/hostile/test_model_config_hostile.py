"""Hostile Hugging Face model configs (config.json, vLLM's geometry): every count, dimension and
list the budget reads is type-checked and bounded before a layer is built, and the refusal names
the key and the file (see README.md for the finding each case proves)."""

import json
import time

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import MAX_CONFIG_BYTES, load_geometry
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

# The lab's tiny vLLM model (lab/make_tiny_hf.py), trimmed to what the geometry reads.
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "vocab_size": 512,
}


def _model(tmp_path, config=None, text=None):
    (tmp_path / "config.json").write_text(text if text is not None else json.dumps(config))
    return str(tmp_path)


def _geometry(path):
    return load_geometry(None, path, read_model, "model_file")


def test_a_real_config_still_prices(tmp_path):
    geometry = _geometry(_model(tmp_path, TINY))
    assert geometry.n_layer == 2 and geometry.layers[0].head_dim_k == 16 and geometry.layers[0].n_head_kv == 2


def test_a_million_layers_are_refused_before_any_layer_is_built(tmp_path):
    # Before: 1,000,000 layers were built (4.9 s, 224 MiB) and priced.
    path = _model(tmp_path, {**TINY, "num_hidden_layers": 1_000_000})
    started = time.monotonic()
    with pytest.raises(ShapeError, match=r"model_file: .*config\.json: num_hidden_layers is 1000000, outside 1-4096 \(MAX_BLOCK_COUNT\)") as info:
        _geometry(path)
    assert time.monotonic() - started < 1.0
    assert "model_file_geometry" in str(info.value), "the fix is named"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"num_attention_heads": 0}, r"num_attention_heads is 0, outside 1-4096 \(MAX_HEAD_COUNT\)", id="heads-0"),
        pytest.param({"hidden_size": None}, r"hidden_size is missing; it is needed for the head dim when head_dim is absent", id="hidden_size-missing"),
        pytest.param({"num_hidden_layers": "32"}, r"num_hidden_layers is '32', expected a whole number in 1-4096", id="layers-string"),
        pytest.param({"num_hidden_layers": True}, r"num_hidden_layers is True, expected a whole number in 1-4096", id="layers-bool"),
        pytest.param({"num_hidden_layers": 2.5}, r"num_hidden_layers is 2\.5, expected a whole number in 1-4096", id="layers-float"),
        pytest.param({"num_hidden_layers": -1}, r"num_hidden_layers is -1, outside 1-4096", id="layers-negative"),
        pytest.param({"num_key_value_heads": 1 << 40}, r"num_key_value_heads is 1099511627776, outside 0-4096", id="kv_heads-2**40"),
        pytest.param({"num_key_value_heads": [2, 2]}, r"num_key_value_heads is \[2, 2\], expected a whole number", id="kv_heads-list"),
        pytest.param({"head_dim": 0}, r"head_dim is 0, outside 1-65536", id="head_dim-0"),
        pytest.param({"hidden_size": 3}, r"hidden_size 3 over num_attention_heads 4 is a head dim of 0", id="hidden_size-below-heads"),
        pytest.param({"vocab_size": 1 << 30}, r"vocab_size is 1073741824, outside 0-16777216", id="vocab-2**30"),
        pytest.param({"num_local_experts": -8}, r"num_local_experts is -8, outside 0-65536", id="experts-negative"),
        pytest.param({"n_routed_experts": "many"}, r"n_routed_experts is 'many', expected a whole number", id="experts-string"),
        pytest.param({"sliding_window": "4096"}, r"sliding_window is '4096', expected a whole number", id="window-string"),
        pytest.param({"max_position_embeddings": 1 << 40}, r"max_position_embeddings is 1099511627776, outside 0-", id="positions-2**40"),
        pytest.param(
            {"layer_types": ["full_attention"] * 200_000}, r"layer_types has 200000 entries for 2 layers \(num_hidden_layers\)", id="layer_types-million"
        ),
        pytest.param({"layer_types": "full_attention"}, r"layer_types is a str, expected a list of 2 layer kinds", id="layer_types-string"),
        pytest.param({"layer_types": ["full_attention", 7]}, r"layer_types\[1\] is 7, expected a layer kind string", id="layer_types-item"),
        pytest.param({"architectures": [{"x": 1}]}, r"architectures\[0\] is \{'x': 1\}, expected a string", id="architectures-item"),
        pytest.param({"text_config": [1, 2]}, r"text_config is a list, expected a mapping", id="text_config-list"),
    ],
)
def test_bad_counts_and_types_are_refused_naming_the_key_and_the_file(tmp_path, change, message):
    config = {**TINY, **change}
    config = {key: value for key, value in config.items() if value is not None}
    path = _model(tmp_path, config)
    with pytest.raises(ShapeError, match=message) as info:
        _geometry(path)
    assert str(tmp_path / "config.json") in str(info.value), "the file is named"


def test_a_nested_text_config_is_checked_too(tmp_path):
    path = _model(tmp_path, {"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {**TINY, "num_attention_heads": 0}})
    with pytest.raises(ShapeError, match=r"text_config\.num_attention_heads is 0, outside 1-4096"):
        _geometry(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", r"config\.json: expected a JSON object, got a list"),
        ("[" * 100_000 + "]" * 100_000, r"config\.json: not JSON a budget can read \(nested too deep\)"),
        ('{"num_hidden_layers": 2,', r"config\.json: not JSON"),
    ],
    ids=["list", "nested-too-deep", "truncated"],
)
def test_a_config_that_is_no_json_object_is_refused_naming_the_file(tmp_path, text, message):
    with pytest.raises(ShapeError, match=message):
        _geometry(_model(tmp_path, text=text))


def test_a_config_over_the_byte_bound_is_refused_unread(tmp_path):
    path = tmp_path / "config.json"
    with open(path, "wb") as handle:  # sparse: costs no disk
        handle.write(json.dumps(TINY).encode())
        handle.truncate(MAX_CONFIG_BYTES + 1)
    with pytest.raises(ShapeError, match=rf"config\.json is {MAX_CONFIG_BYTES + 1} bytes, above MAX_CONFIG_BYTES \({MAX_CONFIG_BYTES}\)"):
        _geometry(str(tmp_path))


def test_the_attention_rule_reads_the_config_through_the_same_checks(tmp_path):
    """With model_geometry given, the KV-dtype rule is the only reader of config.json (for MLA):
    a hostile one is refused naming the file, never an AttributeError."""
    model = _model(tmp_path, text="[1, 2, 3]")
    shape = {
        "runtime": "vllm",
        "model_file": ".",
        "port": 7770,
        "max_model_len": 4096,
        "kv_cache_dtype": "fp8",
        "kv_cache_memory_bytes": "1 GiB",
        "model_geometry": {"architecture": "x", "n_layer": 2, "n_head_kv": 2, "head_dim_k": 64, "head_dim_v": 64},
    }
    with pytest.raises(ShapeError, match=r"config\.json"):
        price_shape(shape, [{"name": "gpu0", "memory": "8 GiB", "arch": "gfx1201"}], payload_dir=str(model))
