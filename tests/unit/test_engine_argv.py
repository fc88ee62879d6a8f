"""The exact engine command lines for the production shapes (expected argv written by hand)."""

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.llamacpp import override_tensor_flag
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import ArgvError, engine_argv

PRIMARY = {
    "runtime": "vllm",
    "model_file": ".",
    "served_id": "frank-primary",
    "bind": "0.0.0.0",
    "port": 7770,
    "max_model_len": 200_704,
    "max_num_seqs": 3,
    "kv_cache_dtype": "fp8",
    "kv_cache_memory_bytes": 3.15e9,
    "max_num_batched_tokens": 1024,
    "tensor_parallel": 2,
    "gpu_memory_utilization": 0.98,
    "prefix_caching": True,
    "tool_parser": "qwen3_xml",
    "reasoning_parser": "qwen3",
}

SECONDARY = {
    "runtime": "llamacpp",
    "model_file": "model.gguf",
    "projector": "mmproj.gguf",
    "served_id": "frank-secondary",
    "bind": "0.0.0.0",
    "port": 7771,
    "ctx_size": 401_408,
    "parallel": 2,
    "type_k": "f16",
    "type_v": "f16",
    "ubatch": 1024,
}

LARGE = {
    "runtime": "llamacpp",
    "model_file": "Q2_K/model-00001-of-00003.gguf",
    "spec_type": "draft-mtp",
    "drafter": "mtp.gguf",
    "draft_max": 2,
    "served_id": "frank-large",
    "bind": "0.0.0.0",
    "port": 7770,
    "ctx_size": 200_000,
    "parallel": 1,
}


def test_primary_vllm_argv():
    assert engine_argv(PRIMARY, "/models") == [
        "--model", "/models",
        "--served-model-name", "frank-primary",
        "--host", "0.0.0.0", "--port", "7770",
        "--middleware", "llm_fleet_vllm_key_guard.KeyGuard",
        "--max-model-len", "200704",
        "--max-num-seqs", "3",
        "--kv-cache-dtype", "fp8",
        "--kv-cache-memory-bytes", "3150000000",
        "--max-num-batched-tokens", "1024",
        "--tensor-parallel-size", "2",
        "--gpu-memory-utilization", "0.98",
        "--enable-prefix-caching",
        "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_xml",
        "--reasoning-parser", "qwen3",
    ]  # fmt: skip


@pytest.mark.parametrize(("dtype", "flag"), [("bf16", "bfloat16"), ("fp16", "float16"), ("bfloat16", "bfloat16"), ("fp8_e5m2", "fp8_e5m2"), ("auto", "auto")])
def test_vllm_gets_its_own_spelling_of_the_kv_dtype(dtype, flag):
    # The lab's vLLM 0.32.0, given `--kv-cache-dtype bf16`: "api_server.py: error: argument --kv-cache-dtype:
    # invalid choice: 'bf16' (choose from 'auto', 'bfloat16', 'float16', 'fp8', ..." (vllm/config/cache.py CacheDType).
    argv = engine_argv({**PRIMARY, "kv_cache_dtype": dtype}, "/models")
    assert argv[argv.index("--kv-cache-dtype") + 1] == flag


def test_secondary_llamacpp_argv():
    assert engine_argv(SECONDARY, "/srv/models/frank-secondary") == [
        "/usr/bin/llama-server",
        "--model", "/srv/models/frank-secondary/model.gguf",
        "--alias", "frank-secondary",
        "--host", "0.0.0.0", "--port", "7771",
        "--ctx-size", "401408",
        "--parallel", "2",
        "--cache-type-k", "f16", "--cache-type-v", "f16",
        "--n-gpu-layers", "999",
        "--ubatch-size", "1024",
        "--mmproj", "/srv/models/frank-secondary/mmproj.gguf",
        "--jinja",
        "--metrics",
    ]  # fmt: skip


def test_large_llamacpp_argv_points_at_the_first_split_part_and_the_drafter():
    argv = engine_argv(LARGE, "/srv/models/frank-large")
    assert argv[argv.index("--model") + 1].endswith("-00001-of-00003.gguf")
    assert argv[argv.index("--model-draft") + 1] == "/srv/models/frank-large/mtp.gguf"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "2"
    assert "--draft-max" not in argv  # not a flag of the b11030 builds the fleet ran
    assert argv[-1] == "--metrics"


def test_large_renders_the_b11030_spec_flags_template_file_and_kwargs():
    # Seed 001: "serve-frank-large.sh: unsloth binary, -m/-md, --spec-type draft-mtp
    # --spec-draft-n-max 2, --jinja, preserve_thinking", and "Wiring in --chat-template-file
    # drops the prompt to 62 tokens" (the built-in template had made it 73,600).
    shape = {**LARGE, "chat_template_file": "chat_template.jinja", "chat_template_kwargs": {"preserve_thinking": True}, "cache_ram": "2048 MiB"}
    assert engine_argv(shape, "/srv/models/frank-large") == [
        "/usr/bin/llama-server",
        "--model", "/srv/models/frank-large/Q2_K/model-00001-of-00003.gguf",
        "--alias", "frank-large",
        "--host", "0.0.0.0", "--port", "7770",
        "--ctx-size", "200000",
        "--parallel", "1",
        "--cache-type-k", "f16", "--cache-type-v", "f16",
        "--n-gpu-layers", "999",
        "--ubatch-size", "512",
        "--spec-type", "draft-mtp",
        "--model-draft", "/srv/models/frank-large/mtp.gguf",
        "--spec-draft-n-max", "2",
        "--cache-ram", "2048",
        "--jinja",
        "--chat-template-file", "/srv/models/frank-large/chat_template.jinja",
        "--chat-template-kwargs", '{"preserve_thinking":true}',
        "--metrics",
    ]  # fmt: skip


def test_llamacpp_reasoning_format_flash_attn_verbosity_and_the_ngram_chain():
    # Seed 001 (the b11030 Flash-Next cutover): "Spec chain draft-mtp,ngram-mod", "--reasoning-format
    # deepseek"; seed 003: "FLASH_ATTN=on"; seed 004: "--log-verbosity 4 ... the engine's own
    # llama_kv_cache lines give the exact accounting".
    shape = {
        **SECONDARY,
        "projector": None,
        "flash_attn": True,
        "log_verbosity": 4,
        "reasoning_format": "deepseek",
        "spec_type": "draft-mtp,ngram-mod",
        "draft_max": 2,
    }
    assert engine_argv(shape, "/srv/models/frank-secondary") == [
        "/usr/bin/llama-server",
        "--model", "/srv/models/frank-secondary/model.gguf",
        "--alias", "frank-secondary",
        "--host", "0.0.0.0", "--port", "7771",
        "--ctx-size", "401408",
        "--parallel", "2",
        "--cache-type-k", "f16", "--cache-type-v", "f16",
        "--flash-attn", "on",
        "--n-gpu-layers", "999",
        "--ubatch-size", "1024",
        "--spec-type", "draft-mtp,ngram-mod",
        "--spec-draft-n-max", "2",
        "--jinja",
        "--reasoning-format", "deepseek",
        "--log-verbosity", "4",
        "--metrics",
    ]  # fmt: skip
    off = engine_argv({**shape, "flash_attn": False}, "/m")
    assert off[off.index("--flash-attn") + 1] == "off"


def test_vllm_template_kwargs_expert_offload_and_attention_backend():
    # Seed 000: "--default-chat-template-kwargs enables enable_thinking + preserve_thinking" and
    # "--enable-expert-offload --expert-precise-memory" (the tcclaviger fork's flags); seed 001:
    # "Pass --attention-backend TURBOQUANT as a CLI flag instead".
    shape = {
        **PRIMARY,
        "chat_template_kwargs": {"preserve_thinking": True, "enable_thinking": True},
        "expert_offload": True,
        "expert_precise_memory": True,
        "attention_backend": "TURBOQUANT",
    }
    assert engine_argv(shape, "/models")[-8:] == [
        "--reasoning-parser", "qwen3",
        "--default-chat-template-kwargs", '{"enable_thinking":true,"preserve_thinking":true}',
        "--attention-backend", "TURBOQUANT",
        "--enable-expert-offload",
        "--expert-precise-memory",
    ]  # fmt: skip
    plain = engine_argv(PRIMARY, "/models")
    assert not {"--enable-expert-offload", "--expert-precise-memory", "--attention-backend", "--default-chat-template-kwargs"} & set(plain)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # Seed 003: "'spec-type draft-mtp,draft-dflash' dies at load ... a chain has ONE draft context".
        ({"spec_type": "draft-mtp,draft-dflash", "draft_max": 7}, "^spec_type: draft-mtp,draft-dflash chains 2 model-backed drafters.*ONE draft context"),
        # Seed 003: "block_size 7, so the draft depth drops 7 -> 6 (llama.cpp asserts n_max <= block_size - 1)".
        ({"spec_type": "draft-dflash", "draft_max": 7, "drafter_block_size": 7}, r"^draft_max: 7 exceeds drafter_block_size 7 - 1.*use at most 6"),
        # Seed 003: DFlash2 "at depth 7 (its block is 8, so 7 is the ceiling llama.cpp allows)".
        ({"spec_type": "draft-dflash", "draft_max": 8, "drafter_block_size": 8}, "^draft_max: 8 exceeds drafter_block_size 8 - 1.*use at most 7"),
        ({"draft_max": 2}, "^draft_max: sets the draft depth.*add spec_type"),
        ({"spec_type": "mtp"}, "^spec_type: 'mtp' is not a speculative type; use draft-"),
    ],
)
def test_speculation_the_fleet_paid_for_is_refused_with_the_field_and_the_fix(changes, message):
    with pytest.raises(ArgvError, match=message):
        engine_argv({**SECONDARY, **changes}, "/models")


def test_legal_speculation_passes_at_the_seed_depths():
    for block, depth in ((7, 6), (8, 7)):  # DSpark, DFlash2
        argv = engine_argv({**SECONDARY, "spec_type": "draft-dflash,ngram-mod", "drafter": "d.gguf", "draft_max": depth, "drafter_block_size": block}, "/m")
        assert argv[argv.index("--spec-draft-n-max") + 1] == str(depth)
        assert "--drafter-block-size" not in " ".join(argv)  # a header fact, not a flag


def test_override_tensor_is_one_flag_with_specific_patterns_first():
    flag = override_tensor_flag((("exps", "CPU"), ("blk\\.4[0-7]\\.ffn_.*_exps", "CUDA0")))
    assert flag == "blk\\.4[0-7]\\.ffn_.*_exps=CUDA0,exps=CPU"
    argv = engine_argv({**SECONDARY, "override_tensor": {"exps": "CPU", "blk\\.1\\.ffn_up_exps": "CUDA0"}}, "/srv/models/frank-secondary")
    assert argv.count("--override-tensor") == 1
    assert argv[argv.index("--override-tensor") + 1] == "blk\\.1\\.ffn_up_exps=CUDA0,exps=CPU"


def test_the_draft_device_is_rendered_and_the_borrow_fact_is_not_a_flag():
    # Seed 001: the shared MTP head's draft context "on ROCm0" aborted, "ROCm1 loads and serves".
    argv = engine_argv({**SECONDARY, "spec_type": "draft-mtp", "draft_device": "ROCm1", "drafter_borrows_output": True}, "/m")
    assert argv[argv.index("--device-draft") + 1] == "ROCm1"
    assert "borrow" not in " ".join(argv)


def test_the_served_id_defaults_to_the_endpoint_name_and_paths_stay_in_the_payload():
    argv = engine_argv({**SECONDARY, "served_id": None}, "/srv/models/frank-secondary", name="frank-secondary")
    assert argv[argv.index("--alias") + 1] == "frank-secondary"
    with pytest.raises(ArgvError, match="^model_file"):
        engine_argv({**SECONDARY, "model_file": None}, "/models")
    with pytest.raises(ArgvError, match="must stay inside the payload directory"):
        engine_argv({**SECONDARY, "model_file": "../../etc/passwd"}, "/models")


@pytest.mark.parametrize(
    ("shape", "field"),
    [
        ({**PRIMARY, "gpu_memory_utilization": 1.0}, "gpu_memory_utilization"),
        ({k: v for k, v in PRIMARY.items() if k != "max_model_len"}, "max_model_len"),
        ({**SECONDARY, "served_id": ""}, "served_id"),
        ({**SECONDARY, "port": None}, "port"),
        ({**SECONDARY, "ctx_size": "lots"}, "ctx_size"),
        ({**SECONDARY, "runtime": "tgi"}, "runtime"),
        ({**SECONDARY, "override_tensor": {"a,b": "CPU"}}, "override_tensor"),
        # A key of the other runtime is named with the runtime that takes it.
        ({**PRIMARY, "spec_type": "draft-mtp"}, "spec_type: not a vllm key \\(it belongs to llamacpp\\)"),
        ({**SECONDARY, "expert_precise_memory": True}, "expert_precise_memory: not a llamacpp key \\(it belongs to radiance, vllm\\)"),
        ({**SECONDARY, "log_verbosity": -1}, "log_verbosity: must be at least 0"),
        ({**PRIMARY, "expert_precise_memory": True}, "expert_precise_memory: sizes the expert offload arena; set expert_offload: true"),
    ],
)
def test_bad_shapes_name_the_field(shape, field):
    with pytest.raises(ArgvError, match=f"^{field}"):
        engine_argv(shape, "/models")
