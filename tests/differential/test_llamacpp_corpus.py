"""The differential corpus replayed: every stored boot of the real llama-server (scripts/differential.py)
priced by the gate (runtimes.registry.price_shape) on the stored geometry, term by term against the
engine's own lines. No lab needed: the corpus holds the GGUF headers and the engine's lines.

Exact laws, every case: each `llama_kv_cache: size` line (cells, layers, K, V, size) and the
recurrent `RS buffer` to the engine's two decimals of MiB, the output buffer to two decimals, the
weights within 1%, and the refusals (an engine that refuses a shape is a gate that refuses it, for
the same reason). The compute buffer's law is calibrated (budget/graph_law.py): the corpus is held
to the match rates it reached when it was calibrated, so a change that loses cases fails here.
`scripts/differential.py --report` prints the rates and the worst case of every term.
"""

from __future__ import annotations

import re

import pytest
from corpus_replay import CASES, COMPUTE_BYTES, MODELS, case_graphs, compare, engine_flash_attn, engine_refusal, matches, mib

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import graph_law

# The fallback compute law (architectures without a replay), measured on every boot of the corpus:
# the share within 5% and 10% and the worst a boot may be off. Every architecture the corpus holds
# is priced by replay, to the byte; the total of every buffer is within 3% on every boot.
COMPUTE_WITHIN_5 = 0.80
COMPUTE_WITHIN_10 = 0.90
COMPUTE_WORST = 0.65
TOTAL_WITHIN_3 = 1.0
ENGINE = "build 11669 (Debian) with GNU 16.2.0 for Linux x86_64"


def _id(case):
    return case["id"]


def test_the_corpus_is_there():
    assert len(CASES) >= 300, f"{len(CASES)} cases: grow it on the lab with `make differential N=...`"
    assert all(case["model"] in MODELS for case in CASES)
    assert {case["engine"] for case in CASES} == {ENGINE}


@pytest.mark.parametrize("case", [c for c in CASES if not c["served"]], ids=_id)
def test_an_engine_refusal_is_a_gate_refusal_for_the_same_reason(case):
    reason = engine_refusal(case["lines"])
    assert not reason.startswith("unknown"), reason
    assert reason in compare(case).refused_by_gate


@pytest.mark.parametrize("case", [c for c in CASES if c["served"]], ids=_id)
def test_kv_output_and_weights_are_the_engines_own(case):
    row = compare(case)
    if row.refused_by_gate:
        # The gate is stricter than the engine in one place: with flash attention off llama.cpp
        # does not check that a quantised cache's block divides the head dim; it boots, reads
        # blocks cut across heads, and sometimes aborts (GGML_ASSERT(view_src ...)).
        assert "does not divide head dim" in row.refused_by_gate and case["shape"].get("flash_attn") is False, row.refused_by_gate
        return
    for engine, ours in row.kv_lines:
        assert engine == ours
    for term in ("rs", "output", "weights"):
        engine, ours = row.pairs[term]
        assert matches(term, engine, ours), f"{term}: engine {mib(engine)} MiB, ledger {mib(ours)} MiB"


def _replayed(case):
    return case["served"] and graph_law.COMPUTE_RULE.get(MODELS[case["model"]]["generator"]["arch"]) == "replay"


def test_the_fallback_law_holds_its_calibrated_match_rates(monkeypatch):
    """An architecture without a replay is priced by the calibrated law: held here on every boot of
    the corpus, as if no architecture had a replay."""
    for arch in list(graph_law.COMPUTE_RULE):
        monkeypatch.setitem(graph_law.COMPUTE_RULE, arch, "law")
    rows = [row for row in map(compare, (c for c in CASES if c["served"])) if not row.refused_by_gate]
    compute = [abs(ours / engine - 1) for engine, ours in (row.pairs["compute"] for row in rows)]
    within_5 = sum(e <= 0.05 for e in compute) / len(compute)
    within_10 = sum(e <= 0.10 for e in compute) / len(compute)
    assert within_5 >= COMPUTE_WITHIN_5, f"compute within 5%: {within_5:.0%}"
    assert within_10 >= COMPUTE_WITHIN_10, f"compute within 10%: {within_10:.0%}"
    assert max(compute) <= COMPUTE_WORST, f"worst compute case off by {max(compute):.0%}"


def test_the_total_holds_its_match_rate():
    rows = [row for row in map(compare, (c for c in CASES if c["served"])) if not row.refused_by_gate]
    totals = [matches("total", *row.pairs["total"]) for row in rows]
    assert sum(totals) / len(totals) >= TOTAL_WITHIN_3


@pytest.mark.parametrize("case", [c for c in CASES if _replayed(c)], ids=_id)
def test_the_compute_buffer_is_the_engines_to_the_byte(case):
    row = compare(case)
    if row.refused_by_gate:
        assert "does not divide head dim" in row.refused_by_gate, row.refused_by_gate  # the one stricter case, above
        return
    assert case["id"] in COMPUTE_BYTES, "no exact byte count stored: scripts/engine_graph.py exact"
    engine, ours = row.pairs["compute"]
    assert ours == engine, f"engine {engine:,} B, replay {ours:,} B ({ours - engine:+,} B): scripts/engine_graph.py diff {case['id']}"


# The engine's `sched_reserve: graph: nodes = N` line (or "pp / tg" counts when they differ): the
# replay's graphs hold exactly the engine's nodes, in every served boot of an architecture it builds.
_GRAPH_LINE = re.compile(r"sched_reserve: graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = (\d+)(?: / (\d+))?,")


@pytest.mark.parametrize("case", [c for c in CASES if _replayed(c)], ids=_id)
def test_the_replay_builds_the_engines_graphs_node_for_node(case):
    if compare(case).refused_by_gate:
        return  # the one stricter case (test_kv_output_and_weights_are_the_engines_own)
    match = _GRAPH_LINE.search("\n".join(case["lines"]))
    assert match, "the boot kept no sched_reserve graph line"
    pp_nodes, tg_nodes = int(match.group(1)), int(match.group(2) or match.group(1))
    graphs = [graph for _key, graph in case_graphs(case, engine_flash_attn(case))]
    assert (len(graphs[0].nodes), len(graphs[1].nodes)) == (pp_nodes, tg_nodes)
