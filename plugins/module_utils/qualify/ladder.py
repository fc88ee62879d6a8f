# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ladder's search over one shape key: which value the next rung tries, given the rungs run.

Two documented searches (docs/qualify.md):

- `step` (the fleet's night ladder, seed 000): start at the ceiling, subtract `step` until a rung
  passes, then one bonus rung at pass + `bonus` (262144 and 245760 failed, 237568 passed, the
  +4096 bonus rung passed: 241664 was deployed). The answer is the largest passing value.
- `bisect`: the ceiling first; after a failure, the midpoint of the largest pass (or the floor)
  and the smallest failure, aligned down, until the gap is at most `resolution`.

A rung the budget gate refuses counts as a failure that cost no boot. Pure logic: the playbook
records each rung's verdict and asks `next_value` for the next one.
"""

from __future__ import annotations

from dataclasses import dataclass

SEARCHES = ("step", "bisect")
# The words for the shape keys a ladder may climb, and the shape keys themselves.
KEY_ALIASES = {"context": "ctx_size", "slots": "parallel", "ubatch": "ubatch"}
PASS = "passed"
VERDICTS = ("refused", "boot_failed", "probe_failed", PASS)


class LadderError(ValueError):
    """A ladder's settings that cannot describe a search; the message names the field and the fix."""


@dataclass(frozen=True)
class Search:
    key: str
    ceiling: int
    floor: int
    method: str = "step"
    step: int = 16384
    bonus: int = 4096
    resolution: int = 4096
    align: int = 256
    max_rungs: int = 12
    ceiling_reason: str = ""

    @classmethod
    def from_settings(cls, settings: dict, source: str = "qualify_ladder") -> Search:
        """Validated settings; an error names the field, where it came from and the fix."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(settings) - known)
        if unknown:
            raise LadderError(f"{source}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        for name in ("key", "ceiling", "floor"):
            if name not in settings:
                raise LadderError(f"{source}: field {name!r} is missing (the shape key to climb, and the values bounding its ladder)")
        values = dict(settings)
        values["key"] = KEY_ALIASES.get(str(values["key"]), str(values["key"]))
        for name in ("ceiling", "floor", "step", "bonus", "resolution", "align", "max_rungs"):
            if name in values:
                value = values[name]
                if isinstance(value, bool) or (not isinstance(value, int) and not (isinstance(value, str) and value.isdigit())):
                    raise LadderError(f"{source}: field {name!r} must be a whole number, got {value!r}")
                values[name] = int(value)
                if values[name] < 1:
                    raise LadderError(f"{source}: field {name!r} must be at least 1, got {values[name]}")
        search = cls(**values)
        if search.method not in SEARCHES:
            raise LadderError(f"{source}: field 'method' is {search.method!r}; use one of {', '.join(SEARCHES)}")
        if search.floor > search.ceiling:
            raise LadderError(f"{source}: field 'floor' ({search.floor}) is above 'ceiling' ({search.ceiling}); lower the floor")
        if search.method == "step" and search.bonus >= search.step:
            raise LadderError(f"{source}: field 'bonus' ({search.bonus}) must be below 'step' ({search.step}), else the bonus rung repeats a failed one")
        return search

    def aligned(self, value: int) -> int:
        return max(self.floor, value - value % self.align)


def best_pass(history: list[tuple[int, str]]) -> int | None:
    passed = [value for value, verdict in history if verdict == PASS]
    return max(passed) if passed else None


def _smallest_failure(history: list[tuple[int, str]]) -> int | None:
    failed = [value for value, verdict in history if verdict != PASS]
    return min(failed) if failed else None


def next_value(search: Search, history: list[tuple[int, str]]) -> int | None:
    """The value the next rung tries, or None when the search is done. `history` is the
    (value, verdict) of every rung run, in order."""
    for _value, verdict in history:
        if verdict not in VERDICTS:
            raise LadderError(f"rung verdict {verdict!r} is not one of {', '.join(VERDICTS)}")
    if len(history) >= search.max_rungs:
        return None
    tried = {value for value, _verdict in history}
    if not history:
        return search.aligned(search.ceiling)
    best, fail = best_pass(history), _smallest_failure(history)
    if best is not None and (fail is None or best >= search.aligned(search.ceiling)):
        return None  # the ceiling itself passed
    if search.method == "step":
        candidate = _next_step(search, history, best)
    else:
        low = best if best is not None else search.floor
        candidate = None
        if fail is not None and fail - low > search.resolution:
            candidate = search.aligned(low + (fail - low) // 2)
        elif best is None and search.floor not in tried:
            candidate = search.floor
    if candidate is None or candidate in tried or candidate < search.floor:
        return None
    if fail is not None and candidate >= fail:
        return None
    return candidate


def _next_step(search: Search, history: list[tuple[int, str]], best: int | None) -> int | None:
    last_value, last_verdict = history[-1]
    if best is None:
        if last_value <= search.floor:
            return None
        return max(search.floor, search.aligned(last_value - search.step))
    first_pass = next(value for value, verdict in history if verdict == PASS)
    if last_value == first_pass and last_verdict == PASS:
        return search.aligned(first_pass + search.bonus)
    return None  # the bonus rung ran, whatever its verdict


def answer(history: list[tuple[int, str]]) -> int | None:
    """The largest value that passed: the recommended setting, or None when none did."""
    return best_pass(history)
