#!/usr/bin/env python3
"""The seeds' full-card replay in numbers: every per-card used and free figure of
tests/replay/seed_cases.yml, priced by the budget and judged within 1% of the measured figure
itself (tests/replay/replay_cases.py), or skipped with the terms the seeds do not give.

    python scripts/seed_replay_report.py            # counts per term and the ten largest errors
    python scripts/seed_replay_report.py --skipped  # also every skipped figure with its reason

Runs in a plain clone (no seed files needed: only the verbatim-quote check reads them).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTIONS = ROOT / ".collections"
link = COLLECTIONS / "ansible_collections" / "frank" / "llm_fleet"
if not link.exists():  # what tests/conftest.py makes: the checkout importable as the collection
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("../../..", link)
sys.path.insert(0, str(COLLECTIONS))
sys.path.insert(0, str(ROOT / "tests" / "replay"))

from replay_cases import TOLERANCE, all_full_card_figures  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skipped", action="store_true", help="list every skipped figure with its reason")
    parser.add_argument("--top", type=int, default=10, help="how many of the largest errors to list (default 10)")
    args = parser.parse_args()

    items = all_full_card_figures()
    cases = {item.case for item in items}
    print(f"full-card figures: {len(items)} in {len(cases)} cases; rule: within {TOLERANCE:.0%} of the measured figure itself")
    print()
    print(f"| {'term':<23} | figures | compared | within 1% | expected miss | skipped |")
    print(f"|{'-' * 25}|--------:|---------:|----------:|--------------:|--------:|")
    terms = sorted({item.term for item in items}, key=lambda term: (-sum(i.term == term for i in items), term))
    for term in [*terms, None]:
        group = [item for item in items if term is None or item.term == term]
        compared = [item for item in group if item.compared]
        name = term or "**all**"
        print(
            f"| {name:<23} | {len(group):>7} | {len(compared):>8} | {sum(item.within for item in compared):>9} | "
            f"{sum(bool(item.expected_miss) for item in compared):>13} | {len(group) - len(compared):>7} |"
        )
    print()
    skipped = [item for item in items if not item.compared]
    print("skipped, by why:")
    for why, count in Counter(_why(item.skip) for item in skipped).most_common():
        print(f"  {count:>3}  {why}")
    print()
    compared = sorted((item for item in items if item.compared), key=lambda item: item.relative_error, reverse=True)
    print(f"the {min(args.top, len(compared))} largest remaining errors (of {len(compared)} compared):")
    print("| case | term | predicted GiB | measured GiB | error | verdict |")
    print("|---|---|---:|---:|---:|---|")
    for item in compared[: args.top]:
        verdict = "within 1%" if item.within else ("expected miss: " + _short(item.expected_miss) if item.expected_miss else "MISS")
        print(
            f"| {item.case} | {item.label} | {item.predicted_gib:,.3f} | {item.measured_gib:,.3f} | "
            f"{item.error_gib:+,.3f} GiB ({item.relative_error:.2%}) | {verdict} |"
        )
    if args.skipped:
        print()
        print("skipped figures:")
        for item in skipped:
            print(f"- {item.case} {item.label} {item.measured_text}: {' '.join(item.skip.split())}")
    unexplained = [item for item in compared if not item.within and not item.expected_miss]
    return 1 if unexplained else 0


def _why(reason: str) -> str:
    """A skip reason's first clause: the payload's missing terms, the moment, or the known miss."""
    head = reason.split(" [")[0]
    return head if len(head) <= 110 else head[:107] + "..."


def _short(reason: str) -> str:
    """The expected miss's missing term: its reason up to the first colon."""
    return reason.split(":")[0].strip()[:80]


if __name__ == "__main__":
    sys.exit(main())
