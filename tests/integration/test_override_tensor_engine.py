"""--override-tensor against the real engine: the tensors llama-server reports moving are exactly
the ones the budget's per-tensor placement moves, for the flag the argv builds from the same pairs."""

import re

import pytest
from lab_engine import MODELS, boot_log, engine_image

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.placement import place_overrides
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.llamacpp import override_tensor_flag
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import override_tensor_order

pytestmark = pytest.mark.lab

IMAGE = engine_image()
if IMAGE is None:
    pytest.skip("the lab engine image is not built here (run `make lab-up`); CI builds it", allow_module_level=True)

MODEL = "tiny-llama-h4kv1d64.gguf"  # 3 layers
# llama.cpp's loader, at debug verbosity: "tensor blk.0.ffn_up.weight (0 MiB f32) buffer type overridden to CPU".
OVERRIDDEN = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")


@pytest.mark.parametrize(
    "pairs",
    [
        # unanchored search: `ffn_(up|gate)` is found inside blk.N.ffn_up.weight
        (("ffn_(up|gate)", "CPU"),),
        # an anchored pattern, a character class, and a broad pattern after them (it takes only blk.2.ffn_down)
        ((r"^blk\.2\.attn", "CPU"), (r"blk\.[01]\.ffn_down", "CPU"), ("down", "CPU")),
    ],
)
def test_the_engine_moves_exactly_the_tensors_the_budget_moves(pairs):
    header = read_model(MODELS / MODEL)
    n_layer = int(header.arch_key("block_count"))
    # Every layer and the output on one device, so each tensor a CPU pattern takes leaves it.
    placed = place_overrides(header.tensors, override_tensor_order(pairs), [0] * (n_layer + 1), n_layer, 1)
    # "load_tensors: CPU model buffer size" follows the last placement line of a load.
    log = boot_log(IMAGE, MODEL, ["-c", "512", "-v", "--override-tensor", override_tensor_flag(pairs)], until="model buffer size")
    moved_by_engine = dict(OVERRIDDEN.findall(log))
    assert moved_by_engine, f"no override line in the engine's log:\n{log[-2000:]}"
    assert set(moved_by_engine.values()) == {"CPU"}
    assert set(moved_by_engine) == set(placed.moved)
