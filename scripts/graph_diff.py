"""The budget's graph replay held against the engine's own listing of one case's reserved graphs
(scripts/engine_graph.py diff CASE): node by node, the first place they part, and the replay's
buffer against the engine's exact bytes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT / "tests" / "differential"))

from corpus_replay import case_graphs, engine_flash_attn  # noqa: E402

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ggml_graph import graph_peak  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.graph_law import CPU_ALIGNMENT  # noqa: E402


def fmt_size(size: int) -> str:
    """ggml-backend.cpp `fmt_size`."""
    return f"{size // (1 << 20)}M" if size >= 1 << 20 else f"{size // 1024}K"


def diff_case(case: dict[str, Any], model: dict[str, Any], exact: int | None, engine_graphs: list[Any]) -> int:
    ours = dict(case_graphs(case, engine_flash_attn(case)))
    status = 0
    peak = 0
    for eg in engine_graphs:
        key = (eg.n_tokens, eg.n_seqs, eg.n_outputs)
        graph = ours.get(key)
        if graph is None:
            print(f"!! the replay reserves no graph for ubatch {key} (it has {sorted(ours)})")
            status = 1
            continue
        listed = graph.listed_nodes()
        engine_last = eg.nodes[-1][0] if eg.nodes else -1
        replay_last = listed[-1][0] if listed else -1
        print(f"== ubatch {key}: engine {len(eg.nodes)} listed nodes (last #{engine_last}), replay {len(listed)} (last #{replay_last})")
        for (e_index, e_op, e_name, e_size, e_srcs), (o_index, node) in zip(eg.nodes, listed):
            # Weights are the model's own bytes (the replay does not type them): their sizes are not compared.
            o_srcs = ["w" if src.external and src.view_src is None and not src.name.startswith("cache_") else fmt_size(src.nbytes) for src in node.src]
            e_srcs_cmp = ["w" if o == "w" else size for (_n, size), o in zip(e_srcs, o_srcs)]
            same = e_index == o_index and e_op == node.op_desc[:10] and e_size == fmt_size(node.nbytes) and e_srcs_cmp == o_srcs
            if not same:
                print(f"!! first difference: engine #{e_index} {e_op} {e_name} ({e_size}) <- {e_srcs}")
                replay_srcs = [(src.name, fmt_size(src.nbytes)) for src in node.src]
                print(f"                     replay #{o_index} {node.op_desc} {node.name} ({fmt_size(node.nbytes)}) <- {replay_srcs}")
                status = 1
                break
        else:
            if len(eg.nodes) != len(listed):
                print(f"!! node counts differ: engine {len(eg.nodes)}, replay {len(listed)}")
                status = 1
        peak = max(peak, graph_peak(graph, CPU_ALIGNMENT))
    if exact is not None:
        print(f"compute buffer: engine {exact} B, replay {peak} B ({peak - exact:+d} B)")
        status |= int(peak != exact)
    return status
