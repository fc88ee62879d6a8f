"""Gemma-4 per-layer head dims against the engine's own llama_kv_cache lines (seeds/004)."""

from gguf_files import write_gguf

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import geometry_from_dict
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_header
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB

N_LAYER = 30
FULL = [(il + 1) % 6 == 0 for il in range(N_LAYER)]  # 5 full layers, 25 sliding-window
HEADS = [2 if full else 8 for full in FULL]  # seeds/004: "full layers have 2 KV heads, not 8"


def gemma4_header(tmp_path):
    path = write_gguf(
        tmp_path / "gemma4.gguf",
        arch="gemma4",
        n_layer=N_LAYER,
        # The KV law reads head counts and key/value lengths, never n_embd: a small n_embd keeps
        # the file small (its zero-filled weights are written whole; 2816 wrote 15.6 GB).
        n_embd=64,
        n_head=16,
        n_head_kv=HEADS,
        extra_kv={
            "gemma4.attention.key_length": 512,
            "gemma4.attention.value_length": 512,
            "gemma4.attention.key_length_swa": 256,
            "gemma4.attention.value_length_swa": 256,
            "gemma4.attention.sliding_window": 1024,
        },
    )
    return read_header(path)


def test_gemma4_header_prices_3001_25_plus_306_25_mib(tmp_path):
    # seeds/004: "(6.125 B/elem at f16 K + q8_0 V), reproducing 3,001.25 MiB (5 full layers at"
    # "n_head_kv 2) + 306.25 MiB (25 SWA rings at n_head_kv 8, window 1024) to the" byte.
    # Shape (seeds/004): "ONE 200,704-token slot (--parallel 1 ...), f16 K + q8_0 V", "batch 4096 / ubatch 1024".
    geometry = kv_law.geometry_from_header(gemma4_header(tmp_path))
    assert [layer.kind for layer in geometry.layers].count("full") == 5
    kv = kv_law.llamacpp_kv(geometry, 200_704, 1, "f16", "q8_0", ubatch=1024)
    full = sum(size for size, layer in zip(kv.per_layer, geometry.layers) if layer.kind == "full")
    swa = sum(size for size, layer in zip(kv.per_layer, geometry.layers) if layer.kind == "swa")
    # The reading that is exact for both terms: each layer at its own head dim (512 full, 256 SWA),
    # K and V each billed once even under attention_k_eq_v.
    assert full == 3001.25 * MIB
    assert swa == 306.25 * MIB
    assert kv.swa_cells_per_stream == 2048  # pad256(window 1024 + ubatch 1024)


def test_one_head_dim_for_every_layer_misses_the_engine():
    # Reading key_length 512 for the SWA rings too doubles them: 612.5 MiB, not the engine's 306.25.
    geometry = geometry_from_dict(
        {"n_layer": N_LAYER, "n_head_kv": HEADS, "head_dim": 512, "layer_kinds": ["full" if f else "swa" for f in FULL], "sliding_window": 1024}
    )
    kv = kv_law.llamacpp_kv(geometry, 200_704, 1, "f16", "q8_0", ubatch=1024)
    swa = sum(size for size, layer in zip(kv.per_layer, geometry.layers) if layer.kind == "swa")
    assert swa == 612.5 * MIB


def test_explicit_geometry_takes_head_dim_swa():
    geometry = geometry_from_dict(
        {
            "n_layer": N_LAYER,
            "n_head_kv": HEADS,
            "head_dim": 512,
            "head_dim_swa": 256,
            "layer_kinds": ["full" if f else "swa" for f in FULL],
            "sliding_window": 1024,
        }
    )
    kv = kv_law.llamacpp_kv(geometry, 200_704, 1, "f16", "q8_0", ubatch=1024)
    assert kv.total_bytes == (3001.25 + 306.25) * MIB
