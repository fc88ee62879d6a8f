"""The third runtime, end to end through the registry: parse, argv, price, metrics, refusal."""

from __future__ import annotations

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.drain import in_flight
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import window_from_refusal
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import engine_argv, parse_shape, price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

SHAPE = {"runtime": "sketch", "model_file": "m.bin", "port": 7790, "context": 8192, "slots_n": 2, "weight_bytes": "1 GiB", "kv_bytes_per_token": 4096}


def test_parse_names_its_keys_and_refuses_another_runtimes():
    assert parse_shape(SHAPE, "e").slots == 2
    with pytest.raises(ShapeError, match="ctx_size: not a sketch key"):
        parse_shape({**SHAPE, "ctx_size": 4096})


def test_argv_and_price():
    assert engine_argv(SHAPE, "/srv/m", name="e")[:4] == ["/usr/bin/sketch-server", "--model", "/srv/m/m.bin", "--name"]
    result = price_shape(SHAPE, [{"name": "cuda0", "memory": "8 GiB"}])
    terms = {t.name: t.bytes for t in result.devices[0].terms}
    assert terms == {"weights": 1 << 30, "kv": 4096 * 8192 * 2}
    assert result.fits and result.client["ceiling"] == 8192


def test_its_gauges_and_refusal_reach_the_drain_and_the_probe():
    assert in_flight("sketch:requests_active 3\n") == 3
    assert window_from_refusal(ApiError("HTTP 400: the window is 8192 tokens", 400)) == (8192, None)
