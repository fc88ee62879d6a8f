# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ladder as playbooks/qualify.yml drives it, one rung at a time, and its results on disk.

`step` judges the rung just measured, appends it, and names the next value (None: the search is
done). `write` leaves three files per endpoint in the results directory: NAME.qualify.json (every
rung, the answer, the restore's timing), NAME.qualify.txt (the table) and NAME.recommended.yml
(the inventory snippet); the controller draws NAME.qualify.png from the JSON (plugin_utils/plots.py,
where matplotlib is). `read` is the reader an operator view (`llm-fleet qualify`) uses.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import write_atomically
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.ladder import LadderError, Search, answer, next_value
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.verdicts import Rung, judge, snippet, table

FORMAT = 1


def rung_from_dict(raw: dict[str, Any]) -> Rung:
    concurrency = raw.get("concurrency")
    return Rung(
        index=int(raw["rung"]),
        value=int(raw["value"]),
        verdict=str(raw["verdict"]),
        why=str(raw.get("why", "")),
        free_at_boot={str(k): int(v) for k, v in (raw.get("free_at_boot") or {}).items()},
        free_under_probe={str(k): int(v) for k, v in (raw.get("free_under_probe") or {}).items()},
        tokens=raw.get("tokens"),
        concurrency=(int(concurrency[0]), int(concurrency[1])) if concurrency else None,
        decode_tps=raw.get("decode_tps"),
    )


def _flag(value: Any) -> bool:
    """A yes/no as a playbook passes it: a bool, or its text."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1")
    return bool(value)


def measured_rung(index: int, measured: dict[str, Any]) -> Rung:
    """A rung from what the playbook measured: `value`, `fits` (the budget gate), `booted`, and
    `probe` (qualify_probe's findings) or `why` (the gate's or the boot's own words)."""
    for name in ("value", "fits"):
        if name not in measured:
            raise LadderError(f"measured: field {name!r} is missing (the rung's value and the budget gate's answer)")
    found = measured.get("probe") or None
    verdict, why = judge(_flag(measured["fits"]), _flag(measured.get("booted")), found)
    if measured.get("why") and verdict in ("refused", "boot_failed"):
        why = f"{why}: {str(measured['why'])[:300]}"
    if found and found.get("errors") and verdict != "passed":
        why = f"{why}; the engine said: {found['errors'][0]}"
    f = found or {}
    return Rung(
        index,
        int(measured["value"]),
        verdict,
        why,
        dict(f.get("free_at_boot") or {}),
        dict(f.get("free_under_probe") or {}),
        f.get("tokens"),
        (int(f["decoding_together"]), int(f["streams"])) if "streams" in f else None,
        f.get("decode_tps"),
    )


def step(settings: dict[str, Any], rungs: list[dict[str, Any]], measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """Judge `measured` (when given) as the next rung; the rungs so far, the next value and the answer."""
    search = Search.from_settings(settings)
    done = [rung_from_dict(raw) for raw in rungs]
    if measured is not None:
        done.append(measured_rung(len(done) + 1, measured))
    history = [(rung.value, rung.verdict) for rung in done]
    return {
        "key": search.key,
        "max_rungs": search.max_rungs,
        "rungs": [rung.as_dict() for rung in done],
        "next": next_value(search, history),
        "answer": answer(history),
    }


def paths(results_dir: str, endpoint: str) -> dict[str, str]:
    return {
        "json": os.path.join(results_dir, f"{endpoint}.qualify.json"),
        "table": os.path.join(results_dir, f"{endpoint}.qualify.txt"),
        "snippet": os.path.join(results_dir, f"{endpoint}.recommended.yml"),
        "picture": os.path.join(results_dir, f"{endpoint}.qualify.png"),
    }


def render(endpoint: str, settings: dict[str, Any], shape: dict[str, Any], rungs: list[dict[str, Any]], timing: dict[str, Any]) -> dict[str, Any]:
    """The result document, the table and the snippet, as `write` stores them."""
    search = Search.from_settings(settings)
    done = [rung_from_dict(raw) for raw in rungs]
    best = answer([(rung.value, rung.verdict) for rung in done])
    bound = search.ceiling_reason or f"the ladder's ceiling {search.ceiling}"
    document = {
        "format": FORMAT,
        "endpoint": endpoint,
        "key": search.key,
        "search": {name: getattr(search, name) for name in search.__dataclass_fields__},
        "rungs": [rung.as_dict() for rung in done],
        "answer": best,
        "timing": timing,
    }
    return {
        "document": document,
        "table": table(done),
        "snippet": snippet(endpoint, shape, search.key, best, len(done), bound),
        "answer": best,
        "rungs": len(done),
    }


def write(
    results_dir: str, endpoint: str, settings: dict[str, Any], shape: dict[str, Any], rungs: list[dict[str, Any]], timing: dict[str, Any]
) -> dict[str, Any]:
    out = render(endpoint, settings, shape, rungs, timing)
    where = paths(results_dir, endpoint)
    os.makedirs(results_dir, exist_ok=True)
    write_atomically(where["json"], json.dumps(out.pop("document"), indent=2) + "\n", 0o644)
    write_atomically(where["table"], out["table"] + "\n", 0o644)
    write_atomically(where["snippet"], out["snippet"], 0o644)
    return {"paths": where, **out}


class ResultsError(ValueError):
    """Results that cannot be read; the message names the file and the fix."""


def read(results_dir: str, endpoint: str) -> dict[str, Any]:
    """An endpoint's last qualification: the JSON document with its table and snippet texts."""
    where = paths(results_dir, endpoint)
    if not os.path.exists(where["json"]):
        raise ResultsError(f"{where['json']}: no qualification results for {endpoint}; run playbooks/qualify.yml --limit {endpoint}")
    try:
        with open(where["json"], encoding="utf-8") as handle:
            document = json.load(handle)
    except ValueError as exc:
        raise ResultsError(f"{where['json']}: not JSON ({exc}); run playbooks/qualify.yml --limit {endpoint} again") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(document.get("rungs"), list):
        raise ResultsError(f"{where['json']}: not a qualification result of format {FORMAT}; run playbooks/qualify.yml --limit {endpoint} again")
    document["table"] = table([rung_from_dict(raw) for raw in document["rungs"]])
    if os.path.exists(where["snippet"]):
        with open(where["snippet"], encoding="utf-8") as handle:
            document["snippet"] = handle.read()
    if os.path.exists(where["picture"]):
        document["picture"] = where["picture"]
    return document
