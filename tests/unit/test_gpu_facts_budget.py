"""Devices discovered from a host's own tools price a shape: the budget reads their memory and
architecture, and refuses what the architecture cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import reconcile_devices
from ansible_collections.frank.llm_fleet.plugins.module_utils.devices.gpu_facts import budget_devices, parse_nvidia_smi
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

FIXTURES = Path(__file__).parent / "fixtures" / "gpu_facts"
MIB = 1 << 20

VLLM = {
    "runtime": "vllm",
    "model_file": ".",
    "port": 7770,
    "max_model_len": 32768,
    "kv_cache_memory_bytes": "4 GiB",
    "weights_per_rank": "12 GiB",
    "calibration": [{"kv_dtype": "fp8", "max_model_len": 32768, "pool_bytes": "4 GiB", "tokens": 65536}],
}


def discovered(name: str) -> list[dict]:
    return budget_devices(parse_nvidia_smi((FIXTURES / name).read_text()))


def test_the_3090_as_its_driver_reports_it():
    (device,) = discovered("rtx3090_sm86.csv")
    # 24,576 MiB total as nvidia-smi prints it; sm_86 from compute_cap 8.6.
    assert device["arch"] == "sm_86"
    assert device["memory"] == 24576 * MIB


def test_fp8_kv_is_refused_on_the_discovered_sm86_card():
    result = price_shape({**VLLM, "kv_cache_dtype": "fp8"}, discovered("rtx3090_sm86.csv"))
    refused = [v for v in result.verdicts if not v.ok]
    assert [v.rule for v in refused] == ["kv_dtype_illegal"], result.verdicts
    assert "sm_86" in refused[0].message and "kv_cache_dtype: fp8" in refused[0].message


def test_the_same_shape_at_bf16_fits_the_discovered_card():
    shape = {**VLLM, "kv_cache_dtype": "bf16", "calibration": [{**VLLM["calibration"][0], "kv_dtype": "bf16", "tokens": 32768}]}
    result = price_shape(shape, discovered("rtx3090_sm86.csv"))
    assert result.fits, [v.message for v in result.verdicts if not v.ok]


def test_discover_takes_what_the_host_reports():
    host = discovered("rtx3090_sm86.csv")
    assert reconcile_devices("discover", host) == host


def test_a_typed_list_that_agrees_with_the_host_is_kept():
    typed = [{"name": "cuda0", "memory": "24 GiB", "arch": "sm_86"}]
    assert reconcile_devices(typed, discovered("rtx3090_sm86.csv")) == typed


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ([{"name": "cuda0", "memory": "32 GiB"}], r"endpoint_devices\[0\]\.memory: 32,768 MiB typed for cuda0, but the host reports 24,576 MiB"),
        ([{"name": "cuda0", "memory": "24 GiB", "arch": "sm_89"}], r"endpoint_devices\[0\]\.arch: sm_89 typed .* the host reports sm_86"),
        ([{"name": "a", "memory": "24 GiB"}, {"name": "b", "memory": "24 GiB"}], r"2 device\(s\) typed, but the host reports 1"),
    ],
)
def test_a_typed_list_that_disagrees_with_the_host_is_refused(typed, message):
    with pytest.raises(ShapeError, match=message):
        reconcile_devices(typed, discovered("rtx3090_sm86.csv"))
