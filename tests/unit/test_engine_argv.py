"""The exact engine command lines for the production shapes (expected argv written by hand)."""

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.engine_argv import ArgvError, engine_argv, override_tensor_flag

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
    assert argv[argv.index("--draft-max") + 1] == "2"
    assert argv[-1] == "--metrics"


def test_override_tensor_is_one_flag_with_specific_patterns_first():
    flag = override_tensor_flag((("exps", "CPU"), ("blk\\.4[0-7]\\.ffn_.*_exps", "CUDA0")))
    assert flag == "blk\\.4[0-7]\\.ffn_.*_exps=CUDA0,exps=CPU"
    argv = engine_argv({**SECONDARY, "override_tensor": {"exps": "CPU", "blk\\.1\\.ffn_up_exps": "CUDA0"}}, "/srv/models/frank-secondary")
    assert argv.count("--override-tensor") == 1
    assert argv[argv.index("--override-tensor") + 1] == "blk\\.1\\.ffn_up_exps=CUDA0,exps=CPU"


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
    ],
)
def test_bad_shapes_name_the_field(shape, field):
    with pytest.raises(ArgvError, match=f"^{field}"):
        engine_argv(shape, "/models")
