"""halogen's and radiance's laws, each against the seed figure it comes from (seed 004)."""

import os

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import window_from_refusal
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes import halogen, radiance
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import (
    DRIVERS,
    compare_boot,
    engine_argv,
    engine_environment,
    parse_boot_log,
    parse_shape,
    price_shape,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, MIB

UNIFIED = [{"name": "dankclaw-unified", "memory": "128 GiB", "arch": "gfx1151"}]
R9700 = [{"name": "r9700-0", "memory": "32,624 MiB", "arch": "gfx1201"}, {"name": "r9700-1", "memory": "32,624 MiB", "arch": "gfx1201"}]


def dragoon(**changes):
    shape = {
        "runtime": "halogen",
        "launch": "podman",
        "port": 7770,
        "ctx": 200704,
        "kv_pool_positions": 200704,
        "pool_slots": 2,
        "spec_adapt": False,
        "mtp_depth": 2,
        "prompt_cache_entries": 12,
        "weights_locked": "62.9 GiB",
        "vision_bytes": "0.8 GiB",
        "working_bytes": "5.7 GiB",
        "kv_pool_bytes_per_position": "26 KiB",
        "kv_reservation_calibration": {"positions": 262144, "reserved": "7.2 GiB"},
    }
    shape.update(changes)
    return parse_shape(shape, "frank-dragoon")


def archon(**changes):
    shape = {
        "runtime": "radiance",
        "launch": "podman",
        "port": 7770,
        "model_file": "qwen38-iq4r.rad",
        "max_model_len": 200000,
        "max_num_seqs": 3,
        "kv_cache_dtype": "fp8",
        "tensor_parallel": 2,
        "expert_slab": "25,600 MiB",
        "kv_cache_memory_bytes": "5,120 MiB",
        "claim_calibration": {"card": "32,624 MiB", "pair": "29,120 MiB", "free": "2,058 MiB", "floor": "209.19 MiB"},
    }
    shape.update(changes)
    return parse_shape(shape, "frank-archon")


# --- halogen ---------------------------------------------------------------------------------------


def test_halogen_ledger_at_262144_is_the_fcd7630_boot():
    # "62.9 GiB weights locked (0.8 vision) + 7.2 GiB KV in ONE 262,144-position pool (6,656 MiB,
    # two slots) + 5.7 GiB working = 75.8 GiB in all"
    result = price_shape(dragoon(ctx=262144, kv_pool_positions=262144), UNIFIED)
    assert result.fits
    assert result.kv["reserved_gib"] == 7.2
    assert result.kv["pool_mib"] == 6656
    assert result.kv["slots"] == 2
    assert result.kv["total_gib"] == 75.8


def test_halogen_ledger_at_200704_is_the_second_production_boot():
    # "The 200,704 boot printed 5.5 GiB reserved and 74.1 GiB in all"
    result = price_shape(dragoon(), UNIFIED)
    assert result.kv["reserved_gib"] == 5.5
    assert result.kv["total_gib"] == 74.1
    assert "ledger: 5.5 GiB reserved and 74.1 GiB in all" in result.notes
    # "with pool == ctx, ONE maximum-length request fills the pool, so two long conversations never coexist"
    assert result.kv["full_requests_at_once"] == 1
    assert any("never coexist" in note for note in result.notes)


def test_halogen_client_window_is_ceiling_minus_45056():
    # "models.yml contextWindow 217088 -> 155648 = ceiling - 45056", "maxTokens 45056"
    client = price_shape(dragoon(), UNIFIED).client
    assert client["context_window"] == 155648 and client["max_tokens"] == 45056


@pytest.mark.parametrize(("ctx", "pool", "slots"), [(200704, 200704, 2), (262144, 524288, 2), (262144, 262144, 2)])
def test_halogen_pool_law_holds_at_the_fleet_shapes(ctx, pool, slots):
    # "the pool law (ctx <= pool <= slots * ctx) still holds with pool == ctx"; "HALOGEN_CTX=262144
    # (native) + KV pool 524288"
    assert dragoon(ctx=ctx, kv_pool_positions=pool, pool_slots=slots).kv_pool_positions == pool


@pytest.mark.parametrize(("pool", "words"), [(200703, "below ctx"), (401409, "above pool_slots x ctx")])
def test_halogen_pool_outside_the_law_is_refused_naming_the_key(pool, words):
    with pytest.raises(ShapeError, match=rf"kv_pool_positions: .*{words}.*ctx <= pool <= slots \* ctx"):
        dragoon(kv_pool_positions=pool)


def test_halogen_environment_is_what_the_fleet_ran():
    # "HALOGEN_CTX and HALOGEN_KV_POOL_POSITIONS both 262144 -> 200704", "SPEC_ADAPT=0", the
    # tokenizer "mounted whole at /tokenizer (... the engine's HALOGEN_TOKENIZER default is the directory)"
    assert engine_environment(dragoon(), "/models") == {
        "HALOGEN_CTX": "200704",
        "HALOGEN_KV_POOL_POSITIONS": "200704",
        "HALOGEN_TOKENIZER": "/models/tokenizer",
        "SPEC_ADAPT": "0",
        # The collection's placeholder names (the seeds name none): the port and address the
        # health gate judges, and the served id and model when the shape gives them.
        "HALOGEN_HOST": "127.0.0.1",
        "HALOGEN_PORT": "7770",
        "HALOGEN_SERVED_ID": "frank-dragoon",
    }
    env = engine_environment(dragoon(served_id="frank-dragoon-b", model_file="halogen.standin.json"), "/models")
    assert (env["HALOGEN_SERVED_ID"], env["HALOGEN_MODEL"]) == ("frank-dragoon-b", "/models/halogen.standin.json")
    # Configured by environment: the image starts flash-server, the container gets no command.
    assert engine_argv(dragoon(), "/models", container=True) == []
    for name in ("HALOGEN_CTX", "HALOGEN_PORT"):
        with pytest.raises(ShapeError, match=f"extra_environment: {name} is rendered from its own shape key"):
            dragoon(extra_environment={name: "1"})


def test_halogen_boot_lines_feed_calibration():
    log = (
        "62.9 GiB weights locked (0.8 vision) + 7.2 GiB KV in ONE 262,144-position pool (6,656 MiB, two slots) + 5.7 GiB working = 75.8 GiB in all\n"
        "n-gram 47.68 GiB read from disk, prompt cache ON (12 entries), MTP depth-2\n"
    )
    ledger = parse_boot_log(log)
    assert ledger.engine == "halogen"
    facts = ledger.facts
    assert facts["halogen_weights_locked_gib"] == 62.9 and facts["halogen_vision_gib"] == 0.8
    assert facts["halogen_kv_reserved_gib"] == 7.2 and facts["halogen_pool_positions"] == 262144
    assert facts["halogen_pool_mib"] == 6656 and facts["halogen_slots"] == 2
    assert facts["halogen_working_gib"] == 5.7 and facts["halogen_total_gib"] == 75.8
    assert facts["halogen_ngram_gib"] == 47.68 and facts["halogen_prompt_cache_entries"] == 12 and facts["halogen_mtp_depth"] == 2
    shape = dragoon(ctx=262144, kv_pool_positions=262144)
    row = compare_boot({"shape": shape.as_dict(), "ledger": ledger.as_dict()}, [])
    assert row["agree"] is True, row
    # The 200,704 boot: "5.5 GiB reserved and 74.1 GiB in all".
    second = parse_boot_log("5.5 GiB reserved and 74.1 GiB in all")
    assert compare_boot({"shape": dragoon().as_dict(), "ledger": second.as_dict()}, [])["agree"] is True
    # Against the other pool the same line disagrees.
    assert compare_boot({"shape": dragoon(ctx=262144, kv_pool_positions=262144).as_dict(), "ledger": second.as_dict()}, [])["agree"] is False


def test_halogen_refusal_names_the_window_and_the_overage():
    # "400 in 0.86 s naming 200704 and the 96,405-token overage, before any prefill"
    contract = DRIVERS["halogen"].refusal
    assert contract.before_prefill
    error = ApiError("HTTP 400: request exceeds ctx 200704: 96,405-token overage", 400)
    assert window_from_refusal(error) == (200704, 200704 + 96405)


def test_a_tokenizer_directory_holding_a_symlink_is_refused(tmp_path):
    # "tokenizer dir must be a real directory and every named file a regular file, no symlinks
    # (HF snapshot links dangle in the mount)"
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        (tokenizer / name).write_text("{}")
    (tmp_path / "blob").write_text("{}")
    os.symlink(tmp_path / "blob", tokenizer / "chat_template.jinja")
    shape = dragoon(tokenizer_files=["tokenizer.json", "chat_template.jinja"])
    with pytest.raises(ShapeError, match=r"tokenizer_dir: .*chat_template.jinja is a symlink .*no symlinks"):
        price_shape(shape, UNIFIED, payload_dir=str(tmp_path))
    os.unlink(tokenizer / "chat_template.jinja")
    (tokenizer / "chat_template.jinja").write_text("{}")
    assert price_shape(shape, UNIFIED, payload_dir=str(tmp_path)).fits
    # The directory itself a link (an HF snapshot) is refused too.
    (tmp_path / "linked").mkdir()
    os.symlink(tokenizer, tmp_path / "linked" / "tokenizer")
    with pytest.raises(ShapeError, match="is a symlink, not a real directory"):
        price_shape(shape, UNIFIED, payload_dir=str(tmp_path / "linked"))


def test_halogen_tokenizer_files_are_flat():
    with pytest.raises(ShapeError, match="tokenizer_files: 'sub/vocab.json' is not a file name"):
        dragoon(tokenizer_files=["sub/vocab.json"])


# --- radiance --------------------------------------------------------------------------------------


def test_radiance_claimable_is_the_engine_budget_table():
    # "card 32,624 MiB, pair at 29,120 settling 2,058 MiB free against its 209.19 MiB floor => 30,969 claimable"
    law = radiance.claim_law({"card": "32,624 MiB", "pair": "29,120 MiB", "free": "2,058 MiB", "floor": "209.19 MiB"})
    assert round(law.claimable / MIB) == 30969
    result = price_shape(archon(), R9700)
    assert result.fits, [v.message for v in result.failures]
    assert result.kv["claimable_mib"] == 30969
    # "the shipped pair 25600/5120"
    assert result.kv["pair_mib"] == 30720


def test_radiance_a_pair_past_claimable_is_refused_naming_the_term():
    # The 26,071 slab arm beside the 5,120 pool would claim 31,191 MiB.
    result = price_shape(archon(expert_slab="26,071 MiB"), R9700)
    failure = next(v for v in result.failures if v.rule == "claimable")
    assert failure.term == "kv_pool" and failure.overage_mib == pytest.approx(31191 - 30968.81, abs=0.1)


def test_radiance_token_contract_is_four_windows():
    # "843,276 tokens = 4 x 200,000, 12 all-reduce rows, 5.87 GiB of KV lent to the slab"
    assert radiance.holds_windows(843276, 4, 200000)
    assert not radiance.holds_windows(843276, 5, 200000)
    result = price_shape(archon(max_num_seqs=4, pool_tokens=843276), R9700)
    assert next(v for v in result.verdicts if v.rule == "pool_law").ok
    ledger = parse_boot_log("the boot ledger that confirms it: 843,276 tokens = 4 x 200,000, 12 all-reduce rows, 5.87 GiB of KV lent to the slab")
    assert ledger.engine == "radiance"
    assert ledger.facts["radiance_pool_tokens"] == 843276 and ledger.facts["radiance_seqs"] == 4 and ledger.facts["radiance_window"] == 200000
    assert ledger.facts["radiance_all_reduce_rows"] == 12 and ledger.facts["radiance_kv_lent_gib"] == 5.87
    row = compare_boot({"shape": archon(max_num_seqs=4).as_dict(), "ledger": ledger.as_dict()}, [])
    assert row["agree"] is True


def test_radiance_budget_table_line_feeds_calibration():
    line = "card 32,624 MiB, pair at 29,120 settling 2,058 MiB free against its 209.19 MiB floor => 30,969 claimable"
    ledger = parse_boot_log(line)
    assert ledger.engine == "radiance"
    facts = ledger.facts
    assert (facts["radiance_card_mib"], facts["radiance_pair_mib"], facts["radiance_free_mib"]) == (32624, 29120, 2058)
    assert facts["radiance_floor_mib"] == 209.19 and facts["radiance_claimable_mib"] == 30969
    assert compare_boot({"shape": archon().as_dict(), "ledger": ledger.as_dict()}, [])["agree"] is True


def test_radiance_dtype_law_bf16_costs_1_89x_not_2x():
    # "only bf16|fp8, no K/V split; the QSA block key is dtype-fixed, which is why bf16 costs 1.89x
    # and not 2x"; "the cheap fp8 2 x 200k fit (pool 3,648)"
    fp8 = 3648 * MIB
    assert radiance.pool_cost(fp8, "bf16") == round(3648 * 1.89 * MIB)
    assert radiance.pool_cost(fp8, "bf16") < 2 * fp8
    assert radiance.pool_cost(fp8, "fp8") == fp8


@pytest.mark.parametrize("dtype", ["fp8,bf16", "fp8/bf16", "k:fp8 v:bf16", "fp8_k"])
def test_radiance_kv_split_is_refused_naming_the_key(dtype):
    with pytest.raises(ShapeError, match=r"kv_cache_dtype: .* splits K and V.*only bf16\|fp8, no K/V split"):
        archon(kv_cache_dtype=dtype)


@pytest.mark.parametrize("dtype", ["auto", "int8", "fp16"])
def test_radiance_other_kv_dtypes_are_refused(dtype):
    with pytest.raises(ShapeError, match=r"kv_cache_dtype: .*only as bf16 or fp8"):
        archon(kv_cache_dtype=dtype)


def test_radiance_llamacpp_kv_keys_are_not_its_own():
    with pytest.raises(ShapeError, match="type_k: not a radiance key"):
        archon(type_k="f16")


def test_radiance_payload_is_a_rad_file():
    # "The Swift1.5 w4dn8 .rad"
    with pytest.raises(ShapeError, match=r"model_file: .* is not a .rad payload"):
        archon(model_file="model.gguf")


def test_radiance_client_quirks_are_the_driver_fields():
    # "radiance answers in reasoning_content", "verify a rename on /v1/models, never on a chat
    # response -- radiance echoes the requested name"
    assert DRIVERS["radiance"].reasoning_field == "reasoning_content"
    assert DRIVERS["radiance"].echoes_requested_name is True
    assert isinstance(DRIVERS["radiance"], type(DRIVERS["vllm"]))  # a vLLM fork: builds on the vLLM driver


def test_radiance_argv_is_vllm_s_flags_for_the_fork():
    argv = engine_argv(archon(), "/models", container=True)  # the image runs its entrypoint: the argv is the flags
    assert argv[:2] == ["--model", "/models/qwen38-iq4r.rad"]
    assert argv[argv.index("--max-model-len") : argv.index("--max-model-len") + 2] == ["--max-model-len", "200000"]
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(5120 * MIB)
    assert halogen.NAME not in argv and GIB


def test_the_probe_reads_an_answer_in_the_driver_s_reasoning_field(monkeypatch):
    # seed 004: "radiance answers in reasoning_content, so a chat probe with a small budget reads
    # as empty content + finish_reason stop on a healthy server"
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host import probe

    answer = {
        "model": "whatever-was-asked",  # radiance echoes the requested name: never judged here
        "choices": [{"message": {"content": "", "reasoning_content": "Hello there, five words now."}, "finish_reason": "stop"}],
        "usage": {"completion_tokens": 8},
    }
    monkeypatch.setattr(probe, "request_json", lambda *args, **kwargs: answer)
    assert probe.chat_probe("127.0.0.1", 7770, "frank-archon", "hi", 8, runtime="radiance") == "Hello there, five words now."
    assert probe.run_probe({"port": 7770, "served_id": "frank-archon", "runtime": "radiance"}) == "Hello there, five words now."
