"""The drafter's cache: its own types (--cache-type-k-draft / --cache-type-v-draft, f16 unless
rendered), for a --model-draft drafter and for the in-file MTP context (seeds/001)."""

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import engine_argv, parse_shape, price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB

# seeds/001, qwen3.8-flash-next Q8 on llama.cpp: "main KV drops 24,576 -> 18,816 B/token (-23.4%)"
# (f16/f16 -> f16/q8_0) is 12 full-attention layers x 2 KV heads x 256 dim; the in-file MTP head is
# one more such layer ("2,048 MiB draft pool = the f16 law at 1,048,576 cells" = 2,048 B per cell).
# The DeltaNet layers hold no cells; their state size is not in the seeds (0 here: not what is tested).
FLASH_NEXT = {
    "n_layer": 49,
    "n_head_kv": 2,
    "head_dim": 256,
    "layer_kinds": ["full" if (il + 1) % 4 == 0 else "recurrent" for il in range(48)] + ["nextn"],
    "nextn_layers": 1,
}
CARDS = [{"name": "r9700-0", "memory": "31.86 GiB"}, {"name": "r9700-1", "memory": "31.86 GiB"}]


def flash_next(**over):
    # seeds/001: "CONTEXT_SIZE=1048576 / PARALLEL_SLOTS=4", "CACHE_TYPE_V=q8_0 / CACHE_TYPE_K=f16"
    return {
        "runtime": "llamacpp",
        "model_geometry": FLASH_NEXT,
        "model_file": "model.gguf",
        "served_id": "frank-primary",
        "port": 7770,
        "ctx_size": 1_048_576,
        "parallel": 4,
        "type_k": "f16",
        "type_v": "q8_0",
        "flash_attn": True,
        "tensor_split": [1, 1],
        "spec_type": "draft-mtp",
        **over,
    }


def drafter_kv(result):
    return sum(term.bytes for device in result.devices for term in device.terms if term.name == "drafter_kv")


def test_the_in_file_mtp_drafter_ignores_the_targets_v_type():
    # seeds/001: "the shared MTP drafter's KV ignores the V type (measured: 2,048 MiB draft pool =
    # the f16 law at 1,048,576 cells)"; the target's own KV is the q8_0-V law.
    result = price_shape(flash_next(), CARDS)
    assert result.kv["bytes_per_token_full"] == 18_816
    assert drafter_kv(result) == 2_048 * MIB
    assert result.kv["drafter_kv_bytes"] == 2_048 * MIB
    # The MTP layer is the last block: it and its draft cache sit on the second card.
    (term,) = [term for term in result.devices[1].terms if term.name == "drafter_kv"]
    assert "MTP layer 48" in term.note
    assert not [term for term in result.devices[0].terms if term.name == "drafter_kv"]


def test_without_draft_mtp_the_mtp_layer_has_no_cache():
    assert drafter_kv(price_shape(flash_next(spec_type=None), CARDS)) == 0


def test_a_rendered_draft_v_type_is_what_the_budget_prices():
    shape = flash_next(drafter_type_v="q8_0")
    argv = engine_argv(parse_shape(shape))
    assert argv[argv.index("--cache-type-v-draft") + 1] == "q8_0"
    assert "--cache-type-k-draft" not in argv  # unset: the engine's f16
    # 2 heads x (256 x 2 B + 256 / 32 x 34 B) = 1,568 B per cell, x 1,048,576 cells
    assert drafter_kv(price_shape(shape, CARDS)) == 1_568 * MIB


def test_no_draft_flag_is_rendered_unless_the_shape_sets_one():
    argv = engine_argv(parse_shape(flash_next()))
    assert "--cache-type-k-draft" not in argv
    assert "--cache-type-v-draft" not in argv


def test_a_model_draft_drafter_takes_the_rendered_types():
    drafter = {"n_layer": 5, "n_head_kv": 8, "head_dim": 128, "layer_kinds": ["swa"] * 5, "sliding_window": 2048}
    shape = flash_next(spec_type="draft-dflash", drafter_geometry=drafter, drafter_type_k="q8_0", drafter_type_v="q8_0")
    argv = engine_argv(parse_shape(shape))
    assert argv[argv.index("--cache-type-k-draft") + 1] == "q8_0"
    assert argv[argv.index("--cache-type-v-draft") + 1] == "q8_0"
    f16 = drafter_kv(price_shape(flash_next(spec_type="draft-dflash", drafter_geometry=drafter), CARDS))
    q8 = drafter_kv(price_shape(shape, CARDS))
    assert q8 * 128 == f16 * 68  # q8_0: 34 B per 32 elements against f16's 64 B


@pytest.mark.parametrize("field", ["drafter_type_k", "drafter_type_v"])
def test_a_draft_cache_type_without_a_drafter_is_refused_naming_the_field(field):
    with pytest.raises(ShapeError, match=f"{field}: sets the draft context's cache type"):
        parse_shape(flash_next(spec_type="ngram-mod", **{field: "q8_0"}))


def test_an_unknown_draft_cache_type_is_refused_naming_the_field():
    with pytest.raises(ShapeError, match="drafter_type_v: unknown cache type 'q9'"):
        price_shape(flash_next(drafter_type_v="q9"), CARDS)


def test_the_saved_prompt_state_carries_the_mtp_context_at_the_draft_types():
    # The target's q8_0 V does not shrink the MTP context's part of a saved state: 18,816 + 2,048 B.
    result = price_shape(flash_next(cache_ram="8192 MiB", host_ram="246 GiB"), CARDS)
    assert result.kv["prompt_state_per_token"] == 18_816 + 2_048


@pytest.mark.parametrize("arg", ["--cache-type-v-draft", "-ctvd", "--spec-draft-type-v", "--cache_type_v_draft=q8_0"])
def test_a_draft_cache_type_in_extra_args_is_refused_naming_the_key(arg):
    # The budget would price f16 while the engine ran the extra flag's type.
    with pytest.raises(ShapeError, match="set drafter_type_v instead"):
        parse_shape(flash_next(extra_args=[arg, "q8_0"] if "=" not in arg else [arg]))
