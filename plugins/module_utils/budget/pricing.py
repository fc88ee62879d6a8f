# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every runtime's pricing shares: where the payload is read, the declared extra terms and
the client window's verdict.

Each runtime's driver (runtimes/<name>.py `price`) builds its own terms on every device from its
engine's rules; the registry's `price_shape()` is the one entry point (runtimes/registry.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.client_contract import client_window
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import load_geometry
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFHeader
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import DeviceLedger, Verdict
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import Shape, ShapeError, parse_bytes, resolve_path


class PayloadReader:
    """Where the budget may read the payload: files under the payload directory on this machine,
    or nothing (then explicit geometries and sizes stand in)."""

    def __init__(self, payload_dir: str | None, loader: Callable[[str], GGUFHeader]) -> None:
        self.payload_dir = payload_dir
        self._loader = loader
        self._headers: dict[str, GGUFHeader] = {}

    def loader(self, path: str) -> GGUFHeader:
        """Each file's header is read once per pricing (the geometry and the tensor placement
        both read the model's: a large MoE lists about 100,000 tensor infos)."""
        if path not in self._headers:
            self._headers[path] = self._loader(path)
        return self._headers[path]

    def path(self, relative: str | None) -> str | None:
        return resolve_path(relative, self.payload_dir) if self.payload_dir and relative else None

    def geometry(self, explicit: Any, relative: str | None, field_name: str) -> kv_law.ModelGeometry | None:
        return load_geometry(explicit, self.path(relative), self.loader, field_name)


def add_extra_terms(devices: list[DeviceLedger], extras: tuple[Any, ...]) -> None:
    """The shape's declared extra terms (extra_terms), each on its device or on every device."""
    for index, extra in enumerate(extras):
        _add_extra(devices, extra, index)


def _add_extra(devices: list[DeviceLedger], extra: Any, index: int) -> None:
    if not isinstance(extra, dict) or "name" not in extra or "size" not in extra:
        raise ShapeError(f"extra_terms[{index}]: give name, size and optionally device")
    size = parse_bytes(extra["size"], f"extra_terms[{index}].size")
    target = extra.get("device")
    chosen = [d for d in devices if target in (None, "all", d.name)]
    if not chosen:
        raise ShapeError(f"extra_terms[{index}].device: no device named {target!r}")
    for device in chosen:
        device.add(str(extra["name"]), size, "declared")


def client_verdicts(shape: Shape) -> tuple[dict[str, Any], list[Verdict]]:
    ceiling = shape.request_ceiling
    try:
        window = client_window(ceiling, shape.client_gap, shape.client_max_tokens)
    except ValueError as exc:
        raise ShapeError(str(exc)) from None
    gap = window.ceiling - window.context_window
    verdict = Verdict(
        "client_window",
        window.safe,
        f"client window {window.context_window:,} (ceiling {ceiling:,}, gap {gap:,}): worst-case request {window.worst_case_tokens:,} tokens"
        + (" fits" if window.safe else f" exceeds the ceiling by {window.worst_case_tokens - ceiling:,}: widen client_gap"),
    )
    return window.as_dict(), [verdict]
