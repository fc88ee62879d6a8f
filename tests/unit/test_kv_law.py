import pytest
from gguf_files import write_gguf

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_header
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, KIB, MIB

FP8_POINTS = [
    kv_law.VllmCalibration("fp8", 262_144, 8_311_013_376, 1_079_582),
    kv_law.VllmCalibration("fp8", 262_144, 10_388_766_720, 1_350_182),
]
BF16_POINT = kv_law.VllmCalibration("bf16", 262_144, 11_047_010_304, 798_280)


def geometry(n_layer, n_head_kv, head_dim, kinds=None, window=0, state=0):
    kinds = kinds or ["full"] * n_layer
    layers = [kv_law.LayerKV("recurrent", recurrent_state_bytes=state) if k == "recurrent" else kv_law.LayerKV(k, n_head_kv, head_dim, head_dim) for k in kinds]
    return kv_law.ModelGeometry("test", layers, sliding_window=window)


def test_sixteen_full_layers_of_four_heads_by_256_cost_64_kib_per_token():
    kv = kv_law.llamacpp_kv(geometry(16, 4, 256), ctx_size=4096)
    assert kv.bytes_per_token_full == 64 * KIB
    assert kv.total_bytes == 4096 * 64 * KIB


@pytest.mark.parametrize(
    ("type_k", "type_v", "per_token"),
    [
        ("f16", "f16", 2 * 2 * 32 * 2 * 2),  # 2 layers x 2 heads x 32 dim x (K+V) x 2 B
        ("q8_0", "q8_0", 2 * 2 * 34 * 2),  # one 34-byte block per 32-dim head row
        ("q4_0", "q4_0", 2 * 2 * 18 * 2),
        ("f16", "q8_0", 2 * 2 * (64 + 34)),
    ],
)
def test_quantised_types_are_billed_per_block(type_k, type_v, per_token):
    kv = kv_law.llamacpp_kv(geometry(2, 2, 32), ctx_size=16_384, parallel=4, type_k=type_k, type_v=type_v)
    assert kv.bytes_per_token_full == per_token
    assert kv.total_bytes == 16_384 * per_token


def test_parallel_divides_the_context_and_never_multiplies_the_pool():
    one = kv_law.llamacpp_kv(geometry(2, 2, 32), ctx_size=16_384, parallel=1)
    four = kv_law.llamacpp_kv(geometry(2, 2, 32), ctx_size=16_384, parallel=4)
    assert one.total_bytes == four.total_bytes
    assert four.cells_per_stream == 4096
    assert four.per_slot_window == 4096
    assert one.per_slot_window == 16_384


def test_streams_are_padded_to_256_cells():
    kv = kv_law.llamacpp_kv(geometry(2, 2, 32), ctx_size=1000, parallel=3)
    assert kv.cells_per_stream == 512
    assert kv.n_ctx == 1536
    unified = kv_law.llamacpp_kv(geometry(2, 2, 32), ctx_size=1000, parallel=3, unified=True)
    assert (unified.n_streams, unified.cells_per_stream) == (1, 1024)


def test_block_that_does_not_divide_head_dim_is_refused():
    with pytest.raises(kv_law.KvLawError, match=r"type_k.*q8_0.*does not divide head dim 48"):
        kv_law.llamacpp_kv(geometry(2, 2, 48), ctx_size=4096, type_k="q8_0")


def test_unknown_cache_type_is_refused():
    with pytest.raises(kv_law.KvLawError, match=r"type_v \(layer 0\): unknown cache type 'q3_k'"):
        kv_law.llamacpp_kv(geometry(2, 2, 32), ctx_size=4096, type_v="q3_k")


def test_sliding_window_layers_hold_their_window_not_the_context():
    # A drafter of 20 KiB/token: with no window it caches the whole 262,144 target window (5.0 GiB);
    # with a 2,048 window it holds window + one ubatch of cells (tens of MiB).
    full = kv_law.llamacpp_kv(geometry(5, 8, 128), ctx_size=262_144)
    assert full.total_bytes == 5 * GIB
    windowed = kv_law.llamacpp_kv(geometry(5, 8, 128, kinds=["swa"] * 5, window=2048), ctx_size=262_144)
    assert windowed.swa_cells_per_stream == 2048 + 512
    assert windowed.total_bytes == (2048 + 512) * 20 * KIB
    assert windowed.total_bytes < 64 * MIB


def test_recurrent_layers_hold_a_fixed_state_per_sequence():
    kinds = ["recurrent", "recurrent", "recurrent", "full"]
    small = kv_law.llamacpp_kv(geometry(4, 2, 64, kinds=kinds, state=1_000_000), ctx_size=4096, parallel=2)
    large = kv_law.llamacpp_kv(geometry(4, 2, 64, kinds=kinds, state=1_000_000), ctx_size=65_536, parallel=2)
    assert small.recurrent_bytes == large.recurrent_bytes == 3 * 1_000_000 * 2
    assert large.attention_bytes == 16 * small.attention_bytes


def test_geometry_from_header_reads_per_layer_heads_and_window(tmp_path):
    path = write_gguf(
        tmp_path / "g.gguf",
        arch="gemma3",
        n_layer=6,
        n_embd=128,
        n_head=4,
        n_head_kv=[2, 2, 2, 2, 2, 1],
        extra_kv={"gemma3.attention.sliding_window": 512, "gemma3.attention.key_length": 64, "gemma3.attention.value_length": 64},
    )
    geo = kv_law.geometry_from_header(read_header(path))
    assert [layer.kind for layer in geo.layers] == ["swa"] * 5 + ["full"]
    assert [layer.n_head_kv for layer in geo.layers] == [2, 2, 2, 2, 2, 1]
    assert geo.layers[0].head_dim_k == 64
    assert geo.sliding_window == 512
    assert geo.output_weight_bytes > 0 and geo.input_weight_bytes > 0


def test_vllm_tokens_and_concurrency_from_pool_bytes_reproduce_the_measured_boots():
    for point in FP8_POINTS:
        kv = kv_law.vllm_kv(point.pool_bytes, 262_144, "fp8", FP8_POINTS)
        assert kv.tokens == point.tokens
        assert kv.basis == "measured"
    assert round(kv_law.vllm_kv(10_388_766_720, 262_144, "fp8", FP8_POINTS).concurrency, 2) == 5.15
    bf16 = kv_law.vllm_kv(11_047_010_304, 262_144, "bf16", [BF16_POINT, *FP8_POINTS])
    assert bf16.tokens == 798_280
    assert round(bf16.bytes_per_token) == 13_839


def test_single_point_calibration_is_proportional():
    kv = kv_law.vllm_kv(10_388_766_720, 262_144, "fp8", FP8_POINTS[:1])
    assert abs(kv.tokens - 1_350_182) / 1_350_182 < 0.001  # ~7,698 B/token either way


def test_other_max_model_len_is_extrapolated_and_says_so():
    kv = kv_law.vllm_kv(3_150_000_000, 200_704, "fp8", FP8_POINTS)
    assert kv.basis == "extrapolated"
    assert "extrapolated from 262144" in kv.note


def test_formula_is_a_labelled_fallback():
    kv = kv_law.vllm_kv(512 * 1000, 2048, "bf16", [], geometry(2, 2, 32))
    assert kv.basis == "formula"
    assert kv.bytes_per_token == 512  # the lab's tiny vLLM model: 2 layers x 2 heads x 32 x K,V x 2 B
    assert kv.tokens == 1000


def test_unknown_vllm_dtype_is_refused():
    with pytest.raises(kv_law.KvLawError, match="kv_cache_dtype: unknown vLLM KV dtype 'fp4'"):
        kv_law.vllm_kv(1, 1, "fp4", FP8_POINTS)
