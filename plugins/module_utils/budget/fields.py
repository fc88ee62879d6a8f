# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shape field readers shared by the budget: every error names the field.

A shape is a plain dict, as an inventory holds it (see docs/vram_budget.md); these read one field
of it as a size, a whole number or a number, and raise ShapeError naming the field otherwise.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import SizeError, parse_size

DEFAULT_FREE_FLOOR = "1.5 GiB"
DEFAULT_MAX_GAP = "0.5 GiB"


class ShapeError(ValueError):
    """A shape field that is missing, of the wrong kind or out of range."""


def _size(shape: dict[str, Any], key: str, default: Any = None) -> int | None:
    value = shape.get(key, default)
    if value is None:
        return None
    try:
        return parse_size(value, key)
    except SizeError as exc:
        raise ShapeError(str(exc)) from None


def _int(shape: dict[str, Any], key: str, default: int | None = None, minimum: int = 0) -> int | None:
    value = shape.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ShapeError(f"{key}: expected a whole number, got {value!r}")
    try:
        number = int(str(value).replace(",", "").replace("_", ""))
    except ValueError:
        raise ShapeError(f"{key}: expected a whole number, got {value!r}") from None
    if number < minimum:
        raise ShapeError(f"{key}: must be at least {minimum}, got {number}")
    return number


def _float(shape: dict[str, Any], key: str, default: float | None = None) -> float | None:
    value = shape.get(key, default)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ShapeError(f"{key}: expected a number, got {value!r}") from None
