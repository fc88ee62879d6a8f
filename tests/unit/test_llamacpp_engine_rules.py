"""llama.cpp's own rules the ledger follows, each checked against a figure typed by hand: from the
lab engine's boot lines (llama.cpp b11669, `-lv 4`), or where no boot is possible here, from the
engine-source research (its source file and function named beside the figure)."""

import pytest
from gguf_files import write_gguf

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import graph_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import geometry_from_dict
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_header
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import geometry_from_header, llamacpp_kv
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

MIB = 1 << 20


def mib(value):
    return f"{value / MIB:.2f}"


def header(tmp_path, arch, n_layer, n_head_kv, head_dim, window, extra=None):
    n_head = n_head_kv
    kv = {
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.attention.sliding_window": window,
        **(extra or {}),
    }
    # Small tensors: the head dims are the header's key_length, not n_embd / n_head.
    path = write_gguf(tmp_path / f"{arch}.gguf", arch=arch, n_layer=n_layer, n_embd=32, n_head=n_head, n_head_kv=n_head_kv, extra_kv=kv)
    return geometry_from_header(read_header(path))


def test_gemma2_slides_every_other_layer_by_its_architecture(tmp_path):
    # The lab engine on a gemma2 of 5 layers, 3 KV heads x 80, window 512, `-c 3000 -np 2`:
    #   llama_kv_cache_iswa: creating non-SWA KV cache, size = 1536 cells
    #   llama_kv_cache: size =    5.62 MiB (  1536 cells,   2 layers,  2/2 seqs), K (f16):    2.81 MiB, V (f16):    2.81 MiB
    #   llama_kv_cache_iswa: creating     SWA KV cache, size = 1024 cells
    #   llama_kv_cache: size =    5.62 MiB (  1024 cells,   3 layers,  2/2 seqs), K (f16):    2.81 MiB, V (f16):    2.81 MiB
    geometry = header(tmp_path, "gemma2", 5, 3, 80, 512)
    kv = llamacpp_kv(geometry, 3000, 2, "f16", "f16")
    full, swa = kv.caches
    assert (full["cells"], full["layers"], mib(full["k_bytes"]), mib(full["v_bytes"])) == (1536, 2, "2.81", "2.81")
    assert (swa["cells"], swa["layers"], mib(swa["k_bytes"]), mib(swa["v_bytes"])) == (1024, 3, "2.81", "2.81")
    assert mib(kv.total_bytes) == "11.25"  # 5.62 + 5.62 printed, 11.25 exactly


def test_gpt_oss_slides_every_other_layer_without_a_pattern_key(tmp_path):
    # gpt-oss's converter writes only `sliding_window` (conversion/gpt_oss.py); its loader's
    # default period is 2 (src/models/gpt-oss.cpp, load_swa_pattern). The research's gpt-oss-20b:
    # 24 layers, 8 KV heads x 64, window 128, f16, -c 131072 -np 1:
    # 12 x 131,072 x 2,048 B + 12 x 768 x 2,048 B = 3,090 MiB (the law without it: 36 MiB).
    geometry = header(tmp_path, "gpt-oss", 24, 8, 64, 128)
    kv = llamacpp_kv(geometry, 131_072, 1, "f16", "f16")
    assert [c["layers"] for c in kv.caches] == [12, 12]
    assert kv.total_bytes == 12 * 131_072 * 2_048 + 12 * 768 * 2_048
    assert round(kv.total_bytes / MIB) == 3_090


def test_phi3_ignores_its_window(tmp_path):
    # src/models/phi3.cpp: "Phi SWA is currently disabled" (the lab engine logs it too:
    # `load_arch_hparams: Phi SWA is currently disabled - results might be suboptimal`).
    # The research's Phi-3-mini-4k: 32 layers, 32 KV heads x 96, window 2047, -c 4096: 1,536 MiB.
    geometry = header(tmp_path, "phi3", 32, 32, 96, 2047)
    kv = llamacpp_kv(geometry, 4_096, 1, "f16", "f16")
    assert geometry.sliding_window == 0
    assert kv.total_bytes == 1_536 * MIB


def test_a_header_period_makes_the_last_layer_of_each_period_full(tmp_path):
    # The lab engine on a gemma3 of 1 layer (period 6 by default): the full cache holds 0 layers
    #   llama_kv_cache: size =    0.00 MiB (  1536 cells,   0 layers,  2/2 seqs), ...
    #   llama_kv_cache: size =    0.47 MiB (   768 cells,   1 layers,  2/2 seqs), K (f16):    0.23 MiB, V (f16):    0.23 MiB
    # (1 KV head x 80, window 128, `-c 3000 -np 2`).
    geometry = header(tmp_path, "gemma3", 1, 1, 80, 128)
    kv = llamacpp_kv(geometry, 3000, 2, "f16", "f16")
    assert [(c["cells"], c["layers"]) for c in kv.caches] == [(1536, 0), (768, 1)]
    assert (mib(kv.caches[1]["k_bytes"]), mib(kv.total_bytes)) == ("0.23", "0.47")


def test_nextn_layers_are_not_in_the_main_cache(tmp_path):
    # src/llama-model.cpp `create_memory`: with n_layer_nextn > 0 the main context filters
    # `il < n_layer()`. The research's GLM-4.5-Air: 47 blocks incl. 1 nextn, 8 KV heads x 128, f16,
    # 131,072 cells: 46 cached layers, 23,552 MiB (the law counting the MTP layer: 512 MiB over).
    geometry = header(tmp_path, "glm4moe", 47, 8, 128, 0, {"glm4moe.nextn_predict_layers": 1})
    kv = llamacpp_kv(geometry, 131_072, 1, "f16", "f16")
    assert geometry.nextn_layers == 1 and geometry.layers[-1].kind == "nextn"
    assert kv.caches[0]["layers"] == 46
    assert kv.total_bytes == 23_552 * MIB


def lab_shape(**over):
    geometry = {"n_layer": 2, "n_head_kv": 2, "head_dim": 32, "n_embd": 128, "n_head": 4, "n_ff": 256, "n_vocab": 512, "layer_bytes": 1 << 20}
    shape = {"runtime": "llamacpp", "ctx_size": 4096, "parallel": 2, "model_geometry": geometry, "n_gpu_layers": 0, **over}
    return shape


def test_the_drafter_caches_f16_whatever_the_targets_types():
    # The lab engine, tiny-llama-h4kv2d32 with the drafter tiny-llama-h4kv1d64 (3 layers, 1 KV head
    # x 64), `-c 4096 -np 2 -ctk q8_0 -ctv q8_0 -fa on --spec-type draft-simple`:
    #   llama_kv_cache: size =    1.06 MiB (  2048 cells,   2 layers,  2/2 seqs), K (q8_0):    0.53 MiB, V (q8_0):    0.53 MiB
    #   llama_kv_cache: size =    3.00 MiB (  2048 cells,   3 layers,  2/2 seqs), K (f16):    1.50 MiB, V (f16):    1.50 MiB
    # (common/speculative.cpp: the draft context takes --cache-type-k-draft, default f16).
    drafter = {"n_layer": 3, "n_head_kv": 1, "head_dim": 64, "n_vocab": 512}
    result = price_shape(lab_shape(type_k="q8_0", flash_attn=True, drafter_geometry=drafter, spec_type="draft-simple"), [{"name": "gpu", "memory": "8 GiB"}])
    assert mib(result.kv["total_bytes"]) == "1.06"
    assert mib(result.kv["drafter_kv_bytes"]) == "3.00"


def test_the_output_buffer_is_a_logit_row_per_slot():
    # The lab engine on a 12,345-token vocabulary, `-np 2`:
    #   llama_context:        CPU  output buffer size =     0.09 MiB       (12,345 x 2 x 4 B)
    geometry = geometry_from_dict({"n_layer": 1, "n_head_kv": 1, "head_dim": 32, "n_vocab": 12_345})
    batch = graph_law.llamacpp_batch(3000, 2, None, 512)
    assert (batch.n_batch, batch.n_ubatch, batch.n_outputs_max) == (2048, 512, 2)
    assert mib(graph_law.output_buffer_bytes(geometry, batch.n_outputs_max)) == "0.09"


def test_the_batch_is_capped_by_the_context_asked_for():
    # The lab engine, `-c 1000 -np 3` (no -b): `llama_context: n_batch = 1000`, `n_ubatch = 512`,
    # `n_outputs_max = 3`; `-c 15 -ub 15`: n_batch 15, n_ubatch 15.
    assert graph_law.llamacpp_batch(1000, 3, None, 512) == graph_law.LlamaCppBatch(1000, 512, 3)
    assert graph_law.llamacpp_batch(15, 3, None, 15) == graph_law.LlamaCppBatch(15, 15, 3)


def test_the_sliding_window_takes_the_capped_ubatch():
    # A window holds window + n_ubatch cells, n_ubatch after the context's cap (-b 64 -ub 384:
    # n_ubatch 64): 100 + 64 = 164 -> pad 256, where the flag as given (384) would make 512.
    geometry = {"n_layer": 2, "n_head_kv": 1, "head_dim": 32, "layer_kinds": ["swa", "full"], "sliding_window": 100}
    result = price_shape(
        {"runtime": "llamacpp", "ctx_size": 8192, "batch": 64, "ubatch": 384, "model_geometry": geometry}, [{"name": "gpu", "memory": "8 GiB"}]
    )
    assert result.kv["swa_cells_per_stream"] == 256


def test_a_quantised_v_without_flash_attention_is_refused():
    # The lab engine, `-ctv q4_0 -fa off`:
    #   llama_init_from_model: quantized V cache requires flash_attn to be enabled
    with pytest.raises(ShapeError, match="quantized V cache requires flash_attn"):
        price_shape(lab_shape(type_v="q4_0", flash_attn=False), [{"name": "gpu", "memory": "8 GiB"}])
    price_shape(lab_shape(type_v="q4_0"), [{"name": "gpu", "memory": "8 GiB"}])  # auto: flash attention on


def test_the_compute_buffer_without_flash_attention_is_the_kq_matrix_and_its_mask():
    # The lab engine, tiny-llama-h4kv2d32 (2 layers, 4 heads, 2 KV heads x 32, n_ff 256, vocab 512),
    # `-c 1000 -np 3 --kv-unified -fa off`: `sched_reserve: CPU compute buffer size = 11.79 MiB`.
    # KQ 1024 x 512 x 4 heads x 4 B = 8 MiB and its f32 mask 2 MiB dominate; the law within 5%.
    shape = lab_shape(ctx_size=1000, parallel=3, kv_unified=True, flash_attn=False)
    result = price_shape(shape, [{"name": "gpu", "memory": "8 GiB"}])
    compute = sum(t.bytes for t in result.host_terms if t.name == "host_compute")
    assert abs(compute / (11.79 * MIB) - 1) < 0.05
