"""The KV law against the real engine: predict, boot llama-server, read its own accounting."""

import pytest
from lab_engine import MODELS, boot_log, engine_image

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import geometry_from_header, llamacpp_kv
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_boot_log
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB

pytestmark = pytest.mark.lab

IMAGE = engine_image()
if IMAGE is None:
    pytest.skip("the lab engine image is not built here (run `make lab-up`); CI builds it", allow_module_level=True)

A = "tiny-llama-h4kv2d32.gguf"  # 2 layers, 2 KV heads x 32
B = "tiny-llama-h4kv1d64.gguf"  # 3 layers, 1 KV head x 64

CASES = [
    (A, 16_384, 4, "f16", "f16", False),
    (A, 16_384, 4, "f16", "q8_0", False),
    (A, 8_192, 2, "q8_0", "q8_0", False),
    (A, 8_192, 1, "q4_0", "q4_0", False),
    (A, 1_000, 3, "f16", "f16", False),
    (A, 1_000, 3, "f16", "f16", True),
    (B, 12_288, 2, "f16", "f16", False),
    (B, 12_288, 4, "q8_0", "q4_0", False),
    (B, 4_096, 1, "q4_0", "f16", False),
]


@pytest.mark.parametrize(("model", "ctx", "parallel", "type_k", "type_v", "unified"), CASES)
def test_prediction_equals_the_engines_own_kv_line(model, ctx, parallel, type_k, type_v, unified):
    geometry = geometry_from_header(read_model(MODELS / model))
    predicted = llamacpp_kv(geometry, ctx, parallel, type_k, type_v, unified=unified)
    args = ["-c", str(ctx), "--parallel", str(parallel), "-ctk", type_k, "-ctv", type_v]
    if unified:
        args.append("--kv-unified")
    log = boot_log(IMAGE, model, args)
    measured = parse_boot_log(log).kv_caches
    assert measured, f"no llama_kv_cache line in the engine's log:\n{log[-2000:]}"
    line = measured[-1]
    assert line.cells == predicted.cells_per_stream
    assert line.layers == geometry.n_layer
    assert line.seqs_max == predicted.n_streams
    assert (line.type_k, line.type_v) == (type_k, type_v)
    # The engine prints MiB with two decimals (C's correctly rounded %.2f, as Python's format):
    # the prediction must print the same, i.e. agree to 0.01 MiB.
    for predicted_bytes, logged_bytes in ((predicted.k_bytes, line.k_bytes), (predicted.v_bytes, line.v_bytes), (predicted.total_bytes, line.size_bytes)):
        assert f"{predicted_bytes / MIB:.2f}" == f"{logged_bytes / MIB:.2f}"


def test_quantised_cache_boots_when_its_block_divides_the_head_dim():
    # The law refuses a block that does not divide the head dim; the accepted side must boot.
    log = boot_log(IMAGE, A, ["-c", "512", "-ctk", "q8_0", "-ctv", "q8_0"])
    assert parse_boot_log(log).kv_caches
