#!/usr/bin/env python3
"""The compute graphs the lab's real llama-server reserves, node by node, and the exact bytes of its
compute buffer: the ground truth the budget's graph replay (budget/graphs/, budget/ggml_alloc.py)
is held against.

    scripts/engine_graph.py dump 3:11            # boot stored case 3:11, print its graphs
    scripts/engine_graph.py diff 3:11            # ... and the first node where the replay differs
    scripts/engine_graph.py exact [--limit N]    # exact compute bytes of every served corpus case

The engine prints its compute buffer in MiB to two decimals; `exact` boots each served case of
tests/differential/corpus/llamacpp again with a preloaded wrapper (lab/shim/compute_bytes.c, built
here with the host's C compiler) that prints the byte count the scheduler reserved, and stores it
in compute_bytes.jsonl beside the corpus, which the replay then judges byte for byte. `dump` and
`diff` add GGML_SCHED_DEBUG=2 and `-lv 5`: the scheduler then prints every node of each reserved
graph (op, name, size, sources) - ggml-backend.cpp `ggml_backend_sched_print_assignments`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT / "tests" / "differential"))

from differential import _env, engine_image, shim  # noqa: E402
from make_random_gguf import RandomGeometry, ensure_model  # noqa: E402

CORPUS = ROOT / "tests" / "differential" / "corpus" / "llamacpp"
EXACT = CORPUS / "compute_bytes.jsonl"
CACHE = ROOT / ".cache" / "differential"
MODELS = CACHE / "models"
BOOTS = CACHE / "graphs"  # each dumped boot's output, so a diff can be rerun without the engine

_STAMP = re.compile(r"\d+\.\d+\.\d+\.\d+ [DIWE] ")
_NODE = re.compile(r"node #\s*(\d+) \(\s*([A-Z0-9_]+)\):\s*(.{1,20}?) \(\s*(\d+[KM])\) \[[^\]]*\] use=(\d+),c=(\d+):(.*)$")
_SRC = re.compile(r"\s*(.{1,20}?) \(\s*(\d+[KM])\) \[[^\]]*\]")
_RESERVE = re.compile(r"graph_reserve: reserving a graph for ubatch with n_tokens =\s*(\d+), n_seqs =\s*(\d+), n_outputs =\s*(\d+)")
_INPUT = re.compile(r"input tensor '\s*(\S+)' \[(\w+), ne = \{([^}]*)\}\] is used by node '(.*)' \((\w+)\)")
_BYTES = re.compile(r"frank-shim: compute buffer bytes = (\d+)")


@dataclass
class EngineGraph:
    """One graph the scheduler reserved: its ubatch and its nodes as printed (views are not printed)."""

    n_tokens: int
    n_seqs: int
    n_outputs: int
    nodes: list[tuple[int, str, str, str, list[tuple[str, str]]]] = field(default_factory=list)
    inputs: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def stored_case(case_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    cases = {case["id"]: case for case in _jsonl(CORPUS / "cases.jsonl")}
    if case_id not in cases:
        raise SystemExit(f"no case {case_id} in {CORPUS / 'cases.jsonl'}")
    case = cases[case_id]
    models = {model["model"]: model for model in _jsonl(CORPUS / "models.jsonl")}
    return case, models[case["model"]]


def boot(case: dict[str, Any], model: dict[str, Any], graphs: bool, timeout: float = 60) -> list[str]:
    """The engine's output for one stored case, booted again with the wrapper (and the graph dump)."""
    ensure_model(RandomGeometry(**model["generator"]), MODELS)
    argv = list(case["argv"])
    if graphs:
        argv[argv.index("--log-verbosity") + 1] = "5"
    name = f"llm-fleet-graph-{uuid.uuid4().hex[:8]}"
    env_args = ["-e", "LD_PRELOAD=/shim/compute_bytes.so", "-v", f"{shim()}:/shim/compute_bytes.so:ro"]
    if graphs:
        env_args += ["-e", "GGML_SCHED_DEBUG=2"]
    cmd = ["podman", "run", "--rm", "--name", name, "--network", "none", *env_args, "-v", f"{MODELS}:/models:ro", engine_image(), *argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    lines: list[str] = []
    done = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "listening on" in line:
                done.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done.is_set() and proc.poll() is None:
        time.sleep(0.05)
    subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, env=_env(), check=False)
    proc.wait(timeout=30)
    thread.join(timeout=5)
    return lines


def parse(lines: list[str]) -> tuple[int | None, list[EngineGraph]]:
    """The exact compute bytes and the graphs of the last context the engine built (a first,
    unallocated context sizes the fit; its graphs are dropped)."""
    exact = None
    graphs: list[EngineGraph] = []
    reserving = False
    for raw in lines:
        # The wrapper writes its line to stderr, which can land inside a node listing's line.
        if match := _BYTES.search(raw):
            exact = int(match.group(1))
            raw = _BYTES.sub("", raw)
        line = _STAMP.sub("", raw)
        if "sched_reserve: reserving ..." in line:
            graphs, reserving = [], True
        elif "sched_reserve: reserve took" in line:
            reserving = False  # later listings are decodes (the warm-up), not reserves
        if not reserving:
            continue
        elif match := _RESERVE.search(line):
            graphs.append(EngineGraph(*(int(g) for g in match.groups())))
        elif (match := _INPUT.search(line)) and graphs:
            ne = tuple(int(n) for n in match.group(3).split(","))
            entry = (match.group(1), match.group(2), ne)
            if entry not in graphs[-1].inputs:
                graphs[-1].inputs.append(entry)
        elif (match := _NODE.search(line)) and graphs:
            index, op, name, size, _use, _compute, rest = match.groups()
            if int(index) == 0 and graphs[-1].nodes:  # the same graph split again: a second listing
                last = graphs[-1]
                graphs.append(EngineGraph(last.n_tokens, last.n_seqs, last.n_outputs, inputs=list(last.inputs)))
            sources = [(src.strip(), src_size) for src, src_size in _SRC.findall(rest)]
            graphs[-1].nodes.append((int(index), op, name.strip(), size, sources))
    return exact, graphs


def unique_graphs(graphs: list[EngineGraph]) -> list[EngineGraph]:
    """Each reserved ubatch once (the engine reserves the prompt graph twice)."""
    seen: dict[tuple[int, int, int], EngineGraph] = {}
    for graph in graphs:
        seen[(graph.n_tokens, graph.n_seqs, graph.n_outputs)] = graph
    return list(seen.values())


def print_graph(graph: EngineGraph) -> None:
    print(f"## ubatch n_tokens={graph.n_tokens} n_seqs={graph.n_seqs} n_outputs={graph.n_outputs}")
    for name, dtype, ne in graph.inputs:
        print(f"   input {name} {dtype} {list(ne)}")
    for index, op, name, size, sources in graph.nodes:
        print(f"   #{index:<4} {op:<14} {name:<22} {size:>6}  <- " + ", ".join(f"{src} ({src_size})" for src, src_size in sources))


def cmd_exact(limit: int | None) -> int:
    done = {record["id"] for record in _jsonl(EXACT)}
    todo = [case for case in _jsonl(CORPUS / "cases.jsonl") if case["served"] and case["id"] not in done]
    models = {model["model"]: model for model in _jsonl(CORPUS / "models.jsonl")}
    for count, case in enumerate(todo[:limit] if limit else todo, 1):
        start = time.monotonic()
        exact = parse(boot(case, models[case["model"]], graphs=False))[0]
        if exact is None:
            print(f"[exact] {case['id']}: no byte count printed (did the engine serve?); nothing stored", file=sys.stderr, flush=True)
            continue
        with EXACT.open("a") as out:
            out.write(json.dumps({"id": case["id"], "compute_bytes": exact}, sort_keys=True) + "\n")
        print(f"[exact] {count}/{len(todo)} {case['id']} {exact} B in {time.monotonic() - start:.1f}s", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    dump = sub.add_parser("dump", help="boot a stored case and print the graphs it reserves")
    dump.add_argument("case")
    diff = sub.add_parser("diff", help="boot a stored case and compare its graphs with the replay's")
    diff.add_argument("case")
    for verb in (dump, diff):
        verb.add_argument("--fresh", action="store_true", help=f"boot again even if {BOOTS} keeps this case's boot")
        verb.add_argument("--quiet", action="store_true", help="do not print the graphs")
    exact = sub.add_parser("exact", help="the exact compute bytes of every served case not yet measured")
    exact.add_argument("--limit", type=int)
    args = parser.parse_args(argv)
    if args.command == "exact":
        return cmd_exact(args.limit)
    case, model = stored_case(args.case)
    kept = BOOTS / f"{args.case.replace(':', '_')}.log"
    if args.fresh or not kept.exists():
        BOOTS.mkdir(parents=True, exist_ok=True)
        kept.write_text("\n".join(boot(case, model, graphs=True)) + "\n")
    exact_bytes, graphs = parse(kept.read_text().splitlines())
    print(f"case {args.case} {model['model']} {case['shape']}")
    print(f"compute buffer: {exact_bytes} B")
    for graph in unique_graphs(graphs) if not args.quiet else []:
        print_graph(graph)
    if args.command == "diff":
        sys.path.insert(0, str(ROOT / "scripts"))
        from graph_diff import diff_case

        return diff_case(case, model, exact_bytes, unique_graphs(graphs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
