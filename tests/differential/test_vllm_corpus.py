"""Replay of the vLLM differential corpus (tests/differential/corpus/vllm/, grown by
`make differential-vllm N=...`): every stored boot of the real engine priced by the budget gate.

- the engine booted: the gate passes the pool and predicts its `KV cache size: N tokens` exactly
  and its `Maximum concurrency ...: X.XXx` as printed;
- the engine refused the pool (`To serve at least one request ...`, `No available memory ...`):
  the gate refuses it on the pool law with the engine's own sentence;
- the engine failed for another reason (a KV dtype or block size the CPU build rejects): the
  gate refuses the shape too (a shape error naming the key), or the case is listed as out of the
  gate's scope below with the reason.

The expectations are the engine's printed lines, stored in each case; nothing here computes them.
No lab needed: this runs in seconds.
"""

from __future__ import annotations

import pytest
from vllm_support import engine_outcome, load_cases, replay

CASES = load_cases()


@pytest.mark.skipif(not CASES, reason="the corpus is empty: make differential-vllm N=... grows it")
@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_the_gate_prices_each_stored_vllm_boot_as_the_engine_did(case):
    agrees, detail = replay(case)
    assert agrees, detail


def test_the_corpus_cases_are_complete():
    for case in CASES:
        assert {"id", "engine", "model_geometry", "shape", "lines"} <= set(case), case.get("id")
        assert case["engine"]["version"], case["id"]
        assert engine_outcome(case)["kind"] != "incomplete", f"{case['id']}: no capacity line, refusal or error stored"
