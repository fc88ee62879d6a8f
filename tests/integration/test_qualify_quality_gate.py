"""playbooks/quality_gate.yml on the lab's frank-secondary through the real ansible-playbook: the
baseline and a candidate each booted as the service and asked the battery (short prompts, a needle
at depth); a candidate with the same weights and an 8-bit cache is judged, and a candidate running
other weights (the lab's other tiny model) must be refused for diverging; the last-known-good
shape serves afterwards either way. The lab's random weights find no needle: the needle verdict
needs a real model (docs/qualify.md)."""

import json

import pytest
from lab_host import combined_manifest, failures, playbook, require_lab_host, served
from lab_qualify import PORT, deployed, slot_ctx

pytestmark = pytest.mark.lab

require_lab_host()

ENDPOINT = "frank-secondary"


def gate(tmp_path, candidate):
    results = tmp_path / "results"
    rc, _stats, out = playbook(
        tmp_path,
        "quality_gate.yml",
        limit=ENDPOINT,
        extra_vars={
            "qualify_quality_candidate": candidate,
            "endpoint_payload_manifest": combined_manifest("tiny-llama-h4kv2d32", "tiny-llama-h4kv1d64"),
            "qualify_results_dir": str(results),
            "qualify_deadman_seconds": 300,
            "qualify_spec_max_tokens": 32,
        },
    )
    return rc, out, results


def test_other_weights_are_refused_and_the_endpoint_serves_its_last_good_shape(tmp_path):
    deployed()
    good_ctx = slot_ctx()
    rc, out, results = gate(tmp_path, {"model_file": "tiny-llama-h4kv1d64.gguf"})
    print(f"\n{(results / f'{ENDPOINT}.quality.txt').read_text()}")
    assert rc != 0
    refusals = json.loads((results / f"{ENDPOINT}.quality.json").read_text())["refusals"]
    assert any("diverges from baseline by" in line for line in refusals), (refusals, failures(out))
    assert slot_ctx() == good_ctx and served(PORT) == ENDPOINT


def test_an_8_bit_cache_is_judged_against_the_f16_baseline(tmp_path):
    deployed()
    good_ctx = slot_ctx()
    rc, out, results = gate(tmp_path, {"type_k": "q8_0", "type_v": "q8_0"})
    document = json.loads((results / f"{ENDPOINT}.quality.json").read_text())
    print(f"\n{(results / f'{ENDPOINT}.quality.txt').read_text()}\nrefusals: {document['refusals']}")
    assert [run["name"] for run in document["runs"]] == ["baseline", "candidate"] and all(run["booted"] for run in document["runs"])
    assert (rc == 0) == (document["refusals"] == []), failures(out)
    assert 0.0 <= document["figures"]["mean_divergence"] <= 1.0
    assert slot_ctx() == good_ctx and served(PORT) == ENDPOINT
