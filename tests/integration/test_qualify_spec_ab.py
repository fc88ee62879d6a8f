"""playbooks/spec_ab.yml on the lab's frank-secondary (llama-server), through the real
ansible-playbook: no speculation, a small draft model (the lab's other tiny model, same
vocabulary) and the n-gram matcher, each booted as the service, the prose, echo and structured
prompts at temperature 0 with one salt; the greedy text must be identical across them, and the
last-known-good shape serves afterwards. A configuration sampled at temperature 1 with its own
seed must fail the identity check (the check can fail)."""

import json

import pytest
from lab_host import combined_manifest, failures, on_host, playbook, require_lab_host, served
from lab_qualify import PORT, slot_ctx
from test_qualify_playbook import UNIT_PATH, deployed, exists

pytestmark = pytest.mark.lab

require_lab_host()

ENDPOINT = "frank-secondary"
NONE = {"name": "none"}
DRAFT = {"name": "draft-simple", "shape": {"spec_type": "draft-simple", "drafter": "tiny-llama-h4kv1d64.gguf", "draft_max": 4}}
NGRAM = {"name": "ngram-mod", "shape": {"spec_type": "ngram-mod"}}


def run(tmp_path, configs, grid=None):
    results = tmp_path / "results"
    rc, _stats, out = playbook(
        tmp_path,
        "spec_ab.yml",
        limit=ENDPOINT,
        extra_vars={
            "qualify_spec_configs": configs,
            "qualify_spec_grid": grid or {},
            "endpoint_payload_manifest": combined_manifest("tiny-llama-h4kv2d32", "tiny-llama-h4kv1d64"),
            "qualify_results_dir": str(results),
            "qualify_deadman_seconds": 300,
            "qualify_spec_max_tokens": 48,
        },
    )
    return rc, out, results


# The same configurations as a grid (filter spec_ab_grid), which adds the drafter chained with the matcher.
GRID = {"drafters": [{"name": "draft-simple", "shape": {k: v for k, v in DRAFT["shape"].items() if k != "draft_max"}}, NGRAM], "depths": [4], "chains": True}


def test_greedy_text_is_identical_with_a_drafter_the_ngram_matcher_and_their_chain(tmp_path):
    deployed()
    good_ctx, good_unit = slot_ctx(), on_host("cat", UNIT_PATH)
    rc, out, results = run(tmp_path, [], GRID)
    table = (results / f"{ENDPOINT}.spec_ab.txt").read_text() if (results / f"{ENDPOINT}.spec_ab.txt").exists() else ""
    print(f"\n{table}")
    assert rc == 0, failures(out)
    runs = json.loads((results / f"{ENDPOINT}.spec_ab.json").read_text())["runs"]
    assert [r["name"] for r in runs] == ["none", "draft-simple-d4", "ngram-mod", "draft-simple+ngram-mod-d4"] and all(r["booted"] for r in runs)
    by_shape = {}
    for r in runs:
        for answer in r["answers"]:
            by_shape.setdefault(answer["shape"], set()).add(answer["text"])
    assert sorted(by_shape) == ["echo", "prose", "structured"]
    assert all(len(texts) == 1 and "" not in texts for texts in by_shape.values()), by_shape
    # The drafter really drafted: the engine counted its proposals.
    assert any(answer.get("draft_n") for answer in runs[1]["answers"]), runs[1]["answers"]
    assert slot_ctx() == good_ctx and served(PORT) == ENDPOINT
    assert on_host("cat", UNIT_PATH) == good_unit and not exists(f"{UNIT_PATH}.qualify-last-good")


def test_a_sampled_configuration_fails_the_identity_check_and_the_endpoint_still_comes_back(tmp_path):
    deployed()
    good_ctx = slot_ctx()
    sampled = {"name": "sampled", "sampling": {"temperature": 1.0, "seed": 12345}}
    rc, out, _results = run(tmp_path, [NONE, sampled])
    assert rc != 0
    message = " ".join(failures(out))
    assert "sampled" in message and "differs from none's" in message, message
    assert slot_ctx() == good_ctx and served(PORT) == ENDPOINT
