# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Byte sizes as operators and engines write them: 31.86 GiB, 12,544 MiB, 7.2e9, 3150000000.

Binary units only for GiB/MiB/KiB (engines log binary units); GB/MB/KB are decimal.
"""

from __future__ import annotations

import math
import re

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40

_UNITS = {
    "": 1,
    "b": 1,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "tib": TIB,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE_RE = re.compile(r"^\s*([0-9][0-9,_]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


class SizeError(ValueError):
    """A size that cannot be parsed, or that is negative or not finite."""


def parse_size(value: object, field: str = "size") -> int:
    """Return a size in bytes; `field` names the input in the error message."""
    if isinstance(value, bool):
        raise SizeError(f"{field}: expected a size, got a boolean")
    if isinstance(value, int):
        number: float = value
        unit = ""
    elif isinstance(value, float):
        number = value
        unit = ""
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if not match:
            raise SizeError(f"{field}: cannot parse size {value!r} (write e.g. '31.86 GiB', '12,544 MiB', '7.2e9' or bytes)")
        number = float(match.group(1).replace(",", "").replace("_", ""))
        unit = match.group(2).lower()
        if unit not in _UNITS:
            raise SizeError(f"{field}: unknown unit {match.group(2)!r} in {value!r} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    else:
        raise SizeError(f"{field}: expected a size, got {type(value).__name__}")
    if not math.isfinite(number):
        raise SizeError(f"{field}: size must be finite, got {value!r}")
    if number < 0:
        raise SizeError(f"{field}: size must not be negative, got {value!r}")
    return round(number * _UNITS[unit])


def human(n_bytes: float) -> str:
    """Short binary rendering for tables and messages."""
    sign = "-" if n_bytes < 0 else ""
    value = abs(n_bytes)
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if value >= scale:
            return f"{sign}{value / scale:,.2f} {unit}"
    return f"{sign}{value:,.0f} B"
