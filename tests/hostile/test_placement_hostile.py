"""Hostile --override-tensor input: buffers llama.cpp cannot name, device indexes past the shape's
devices, and a header of a million tensor infos, each refused naming the field or priced in
bounded time (see README.md, "Tensor placement")."""

import re
import time

import gguf
import pytest
from gguf_files import write_gguf, write_gguf_header

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

CARDS = [{"name": "gpu0", "memory": "8 GiB"}, {"name": "gpu1", "memory": "8 GiB"}]


@pytest.mark.parametrize("buffer", ["CPU;touch /tmp/x", "ROCm-1", "$(id)", "cpu0x", "ROCm", " CPU", "ROCm 0"])
def test_a_buffer_that_names_no_buffer_type_is_refused_naming_the_pattern(tmp_path, buffer):
    write_gguf(tmp_path / "m.gguf", n_expert=2)
    shape = {"runtime": "llamacpp", "model_file": "m.gguf", "ctx_size": 4096, "tensor_split": [1, 1], "override_tensor": {"exps": buffer}}
    with pytest.raises(ShapeError, match=r"^override_tensor\.exps: buffer .* is no buffer type llama\.cpp lists; use CPU or a device buffer"):
        price_shape(shape, CARDS, str(tmp_path))


@pytest.mark.parametrize("buffer", ["ROCm2", "CUDA99", "Vulkan18446744073709551616"])
def test_a_device_index_past_the_devices_is_refused(tmp_path, buffer):
    write_gguf(tmp_path / "m.gguf", n_expert=2)
    shape = {"runtime": "llamacpp", "model_file": "m.gguf", "ctx_size": 4096, "tensor_split": [1, 1], "override_tensor": {"exps": buffer}}
    with pytest.raises(ShapeError, match=rf"^override_tensor\.exps: buffer {re.escape(buffer)} names device \d+, but the shape lists 2 device\(s\)$"):
        price_shape(shape, CARDS, str(tmp_path))


def test_a_large_moe_header_is_placed_in_bounded_time(tmp_path):
    # Seed 000: the FP8 payload's "routed experts" are "(114.86 GiB, 150,528 tensors)": a header of
    # that many tensor infos, every one matched against every pattern once (linear in the header).
    q8 = gguf.GGMLQuantizationType.Q8_0
    count = 150_528
    tensors = [(f"blk.{index % 4}.ffn_up_exps.{index}", (32,), q8) for index in range(count)]
    write_gguf_header(tmp_path / "m.gguf", "llama", 4, tensors)
    shape = {"runtime": "llamacpp", "model_file": "m.gguf", "ctx_size": 4096, "tensor_split": [1, 1], "override_tensor": {"exps": "CPU", r"blk\.0\.": "ROCm0"}}
    started = time.monotonic()
    result = price_shape(shape, CARDS, str(tmp_path))
    assert time.monotonic() - started < 20
    # Block 0's quarter stays on card 0 (the longer pattern wins); the other three quarters go to host RAM.
    assert sum(t.bytes for t in result.host_terms if t.name == "override_tensor_weights") == (count - count // 4) * 34
