"""The speculative A/B's judgement (plugins/module_utils/qualify/spec_ab.py): identical greedy text
passes, a difference names the configuration, the shape and the first differing character, an
empty answer fails loudly (seed 003: the identity check "compared '' to ''"), and a configuration
that did not boot is not a silent pass. Texts written by hand."""

from __future__ import annotations

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify import spec_ab


def run(name: str, texts: dict[str, str], **extra) -> dict:
    return {"name": name, "booted": True, "answers": [{"shape": shape, "text": text, "completion_tokens": 5, **extra} for shape, text in texts.items()]}


TEXTS = {"prose": "A record per shape.", "echo": "\n".join(spec_ab.PASSAGE), "structured": "id: 1, name: endpoint-1"}


def test_identical_text_passes_with_the_figures_in_the_table():
    failures, table = spec_ab.compare([run("none", TEXTS), run("draft", TEXTS, draft_n=10, draft_accepted=4, decode_tps=31.5)])
    assert failures == []
    lines = table.splitlines()
    assert len(lines) == 7
    assert lines[4].split()[:5] == ["draft", "prose", "5", "31.5", "40%"] and lines[4].split()[-1] == "yes"


def test_a_difference_names_the_configuration_the_shape_and_where():
    failures, _table = spec_ab.compare([run("none", TEXTS), run("sampled", {**TEXTS, "prose": "A record per slot."})])  # "sh" vs "sl": index 14
    assert failures == ["sampled prose: the greedy text differs from none's at character 14"]


def test_empty_answers_and_configurations_that_did_not_boot_fail():
    failures, _table = spec_ab.compare([run("none", {**TEXTS, "echo": ""}), {"name": "ngram", "booted": False, "why": "health gate timed out"}])
    assert failures == [
        "none echo: EMPTY answer (an empty text proves nothing; give the shape more max_tokens or switch thinking off)",
        "ngram: did not boot (health gate timed out)",
    ]


def test_the_copy_ratio_counts_passage_lines():
    assert spec_ab.copy_ratio("\n".join(spec_ab.PASSAGE[:2]) + "\nsomething else\n\n") == 0.667
    assert spec_ab.copy_ratio("") == 0.0
