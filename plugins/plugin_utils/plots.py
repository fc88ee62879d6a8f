# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PNG pictures for the controller: bench results, a budget ledger and a qualification ladder.

Controller only: matplotlib is imported inside each function, so endpoint hosts, which never
draw, do not need it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.bench import render_bench_table
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.results import rung_from_dict
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.verdicts import Rung
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB

MAX_RESULT_BYTES = 16 * 1024 * 1024  # a stored bench result is a few KiB

SIZE_INCHES = (10.0, 6.0)
DPI = 100  # 1000 x 600 pixels


def _pyplot() -> Any:
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    return plt


def _grouped_bars(axis: Any, prompts: list[str], arms: list[str], values: dict[tuple[str, str], float | None], ylabel: str) -> None:
    width = 0.8 / max(len(arms), 1)
    for index, arm in enumerate(arms):
        xs = [p + index * width - 0.4 + width / 2 for p in range(len(prompts))]
        ys = [values.get((arm, prompt)) or 0.0 for prompt in prompts]
        axis.bar(xs, ys, width, label=arm)
    axis.set_xticks(range(len(prompts)))
    axis.set_xticklabels(prompts)
    axis.set_ylabel(ylabel)
    axis.grid(axis="y", alpha=0.3)


def render_bench_png(report: dict[str, Any], path: str) -> None:
    """Decode tok/s and TTFT per prompt, one bar per arm."""
    plt = _pyplot()
    arms = [arm["name"] for arm in report["arms"]]
    prompts: list[str] = []
    for job in report["jobs"]:
        if job["prompt"] not in prompts:
            prompts.append(job["prompt"])
    tps = {(j["arm"], j["prompt"]): j["decode_tps"] for j in report["jobs"] if j["ok"]}
    ttft = {(j["arm"], j["prompt"]): j["ttft_s"] for j in report["jobs"] if j["ok"]}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=SIZE_INCHES, dpi=DPI, sharex=True)
    _grouped_bars(top, prompts, arms, tps, "decode tok/s")
    _grouped_bars(bottom, prompts, arms, ttft, "time to first token (s)")
    top.legend(loc="upper right", fontsize="small")
    warned = len(report.get("warnings") or [])
    fig.suptitle(f"bench {report['run_id']} - max_tokens {report['max_tokens']}" + (f" - {warned} WARNING(S)" if warned else ""))
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def render_ledger_png(result: dict[str, Any] | None, path: str, title: str = "") -> None:
    """A budget result (vram_budget's as_dict) as stacked bars per device, capacity marked; with
    no result, a picture that says why there is no ledger (title), so a page never shows a hole."""
    plt = _pyplot()
    if result is None:
        fig = plt.figure(figsize=SIZE_INCHES, dpi=DPI)
        fig.text(0.5, 0.5, title, ha="center", va="center", wrap=True, fontsize="large")
        fig.savefig(path, format="png")
        plt.close(fig)
        return
    ledger = result["ledger"]
    names: list[str] = []
    for device in ledger:
        for term in device["terms"]:
            if term["name"] not in names:
                names.append(term["name"])
    fig, axis = plt.subplots(figsize=SIZE_INCHES, dpi=DPI)
    bottoms = [0.0] * len(ledger)
    xs = list(range(len(ledger)))
    for name in names:
        sizes = [sum(t["bytes"] for t in device["terms"] if t["name"] == name) / MIB for device in ledger]
        if any(sizes):
            axis.bar(xs, sizes, 0.6, bottom=bottoms, label=name)
            bottoms = [b + s for b, s in zip(bottoms, sizes)]
    for x, device in zip(xs, ledger):
        capacity = device["capacity_bytes"] / MIB
        axis.hlines(capacity, x - 0.4, x + 0.4, colors="red", linestyles="dashed")
        axis.text(x, capacity, f" capacity {capacity:,.0f} MiB", ha="center", va="bottom", fontsize="small", color="red")
    axis.set_xticks(xs)
    axis.set_xticklabels([device["device"] for device in ledger])
    axis.set_ylabel("MiB")
    axis.legend(loc="upper left", fontsize="small", ncol=3)
    axis.set_title(title or f"{result['runtime']} ledger - fits: {'yes' if result['fits'] else 'NO'}")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def write_bench_outputs(report: dict[str, Any], stem: str, with_json: bool = True) -> list[Path]:
    """RESULT.json (unless rendering a stored one), RESULT.txt (the table) and RESULT.png (the plot)."""
    base = Path(stem)
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = [base.with_suffix(".txt"), base.with_suffix(".png")]
    paths[0].write_text(render_bench_table(report) + "\n")
    render_bench_png(report, str(paths[1]))
    if with_json:
        paths.insert(0, base.with_suffix(".json"))
        paths[0].write_text(json.dumps(report, indent=2) + "\n")
    return paths


def render_stored_bench(result_path: str) -> tuple[dict[str, Any], list[Path]]:
    """The table and the plot beside a stored result (the bench playbook stores {bench, probe})."""
    source = Path(result_path)
    text = read_text(result_path, MAX_RESULT_BYTES)  # FileTooLarge is a ValueError
    if text is None:
        raise FileNotFoundError(f"{source}: no bench result there")
    report = json.loads(text)
    report = report.get("bench", report)
    return report, write_bench_outputs(report, str(source.with_suffix("")), with_json=False)


VERDICT_COLOURS = {"passed": "tab:green", "probe_failed": "tab:orange", "boot_failed": "tab:red", "refused": "tab:gray"}


def _qualify_rungs(document: dict[str, Any], source: str) -> list[Rung]:
    """The document's rungs, typed; a rung the picture cannot read is refused naming it."""
    rungs = document.get("rungs")
    if not isinstance(rungs, list) or not rungs:
        raise ValueError(f"{source}: no rungs to draw (field 'rungs' is missing or empty); run playbooks/qualify.yml again")
    typed = []
    for number, raw in enumerate(rungs, 1):
        try:
            typed.append(rung_from_dict(raw))
        except KeyError as exc:
            raise ValueError(f"{source}: rung {number} has no field {exc}; run playbooks/qualify.yml again") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{source}: rung {number} cannot be read ({exc}); run playbooks/qualify.yml again") from None
    return typed


def render_qualify_png(document: dict[str, Any], path: str, source: str = "the results document") -> None:
    """A qualification (results.render's document) as one bar group per rung: free MiB per device at
    boot and under the probe, the tokens answered with the concurrency over them, and decode tok/s,
    each bar coloured by the rung's verdict (boot hatched, probe solid). A rung the probe never
    reached (refused, boot_failed) has no figures: its place says 'not measured'."""
    rungs = _qualify_rungs(document, source)
    plt = _pyplot()
    devices = sorted({name for rung in rungs for name in (*rung.free_at_boot, *rung.free_under_probe)})
    xs = list(range(len(rungs)))
    colours = [VERDICT_COLOURS.get(rung.verdict, "black") for rung in rungs]
    fig, (free, tokens, decode) = plt.subplots(3, 1, figsize=(SIZE_INCHES[0], 8.0), dpi=DPI, sharex=True)
    width = 0.8 / max(2 * len(devices), 1)
    for d, device in enumerate(devices):
        for p, (phase, hatch) in enumerate((("boot", "//"), ("probe", ""))):
            offset = (2 * d + p) * width - 0.4 + width / 2
            values = [(rung.free_at_boot if phase == "boot" else rung.free_under_probe).get(device) for rung in rungs]
            free.bar([x + offset for x in xs], [(v or 0) / MIB for v in values], width, color=colours, hatch=hatch, edgecolor="black", linewidth=0.5)
            for x, value in zip(xs, values):
                if value is not None:
                    free.text(x + offset, value / MIB, f"{device} {phase}", ha="center", va="bottom", fontsize="x-small", rotation=90)
    free.set_ylabel("free MiB (min sampled)")
    tokens.bar(xs, [rung.tokens or 0 for rung in rungs], 0.5, color=colours)
    for x, rung in zip(xs, rungs):
        if rung.concurrency is not None:
            tokens.text(x, rung.tokens or 0, f"{rung.concurrency[0]}/{rung.concurrency[1]} at once", ha="center", va="bottom", fontsize="small")
    tokens.set_ylabel("tokens answered")
    decode.bar(xs, [rung.decode_tps or 0.0 for rung in rungs], 0.5, color=colours)
    decode.set_ylabel("decode tok/s")
    for x, rung in zip(xs, rungs):
        if not (rung.free_at_boot or rung.free_under_probe or rung.tokens or rung.decode_tps):
            for axis in (free, tokens, decode):
                axis.text(x, 0, "not measured", ha="center", va="bottom", fontsize="small", color=VERDICT_COLOURS.get(rung.verdict, "black"))
    for axis in (free, tokens, decode):
        axis.grid(axis="y", alpha=0.3)
        axis.margins(y=0.35)  # room above the bars for their labels and the legend
    decode.set_xticks(xs)
    decode.set_xticklabels([f"{rung.index}: {rung.value:,}\n{rung.verdict}" for rung in rungs], fontsize="small")
    for label, colour in zip(decode.get_xticklabels(), colours):
        label.set_color(colour)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour) for colour in VERDICT_COLOURS.values()]
    free.legend(handles, list(VERDICT_COLOURS), loc="upper left", fontsize="small", ncol=4, title="verdict (hatched: at boot)")
    best = document.get("answer")
    fig.suptitle(f"{document.get('endpoint')}: ladder over {document.get('key')}, answer {best if best is not None else 'none (no rung passed)'}")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
