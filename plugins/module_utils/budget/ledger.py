# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The per-device ledger: named terms per device, the verdicts of the rules and the result.

`fits` is false when any rule fails, and the failures name the device, the term and the overage in
MiB. The capacity rules (fits, free floor, device gap) and the slot ceiling judge a ledger; the
pricing (pricing.py) fills it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError, parse_bytes, parse_int, parse_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB


@dataclass
class Term:
    name: str
    bytes: int
    note: str = ""


@dataclass
class DeviceLedger:
    name: str
    capacity: int
    terms: list[Term] = field(default_factory=list)
    arch: str | None = None  # sm_86, gfx1201, gfx1151: what the KV dtype rules read
    kind: str = "gpu"  # gpu | cpu: the platform an engine runs on there (vLLM's CPU build: block size 128)

    def add(self, name: str, size: int, note: str = "") -> None:
        if size:
            self.terms.append(Term(name, int(size), note))

    @property
    def used(self) -> int:
        return sum(term.bytes for term in self.terms)

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def crossing_term(self) -> Term | None:
        """The term at which the running total first passes the capacity."""
        running = 0
        for term in self.terms:
            running += term.bytes
            if running > self.capacity:
                return term
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.name,
            "capacity_bytes": self.capacity,
            "used_bytes": self.used,
            "free_bytes": self.free,
            "terms": [{"name": t.name, "bytes": t.bytes, "mib": round(t.bytes / MIB, 2), **({"note": t.note} if t.note else {})} for t in self.terms],
        }


@dataclass
class Verdict:
    rule: str
    ok: bool
    message: str
    device: str | None = None
    term: str | None = None
    overage_mib: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "ok": self.ok, "message": self.message}
        for key in ("device", "term", "overage_mib"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass
class BudgetResult:
    runtime: str
    devices: list[DeviceLedger]
    kv: dict[str, Any]
    client: dict[str, Any]
    verdicts: list[Verdict]
    host_terms: list[Term] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    geometry_key: str = ""
    model_geometry: dict[str, Any] | None = None  # the explicit form, for stored boots

    @property
    def fits(self) -> bool:
        return all(v.ok for v in self.verdicts)

    @property
    def failures(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.ok]

    def as_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "fits": self.fits,
            "ledger": [d.as_dict() for d in self.devices],
            "host_terms": [{"name": t.name, "bytes": t.bytes} for t in self.host_terms],
            "kv": self.kv,
            "client": self.client,
            "rules": [v.as_dict() for v in self.verdicts],
            "notes": self.notes,
            "geometry_key": self.geometry_key,
            "model_geometry": self.model_geometry,
        }


# A CUDA compute capability (sm_86) or an AMD GPU target (gfx1201, gfx1151).
DEVICE_KINDS = ("gpu", "cpu")
ARCH_RE = re.compile(r"^(sm_\d{2,3}[a-z]?|gfx\d{3,4}[a-z]?)$")


def devices_from(spec: Any) -> list[DeviceLedger]:
    """The devices to price on (endpoint_devices): [{name, memory, arch, kind}], one per GPU rank or
    the host (kind: cpu, for an engine that runs on the host's CPU)."""
    if not spec or not isinstance(spec, list):
        raise ShapeError("devices: give at least one device, e.g. [{name: cuda0, memory: '24,576 MiB'}]")
    if len(spec) > 64:
        raise ShapeError(f"devices: {len(spec)} devices; at most 64")
    out = []
    for index, device in enumerate(spec):
        if not isinstance(device, dict) or "memory" not in device:
            raise ShapeError(f"devices[{index}]: each device needs a name and a memory size")
        capacity = parse_bytes(device["memory"], f"devices[{index}].memory")
        if capacity <= 0:
            raise ShapeError(f"devices[{index}].memory: must be positive")
        arch = device.get("arch")
        if arch is not None and not ARCH_RE.match(str(arch)):
            raise ShapeError(f"devices[{index}].arch: {arch!r} is not a GPU architecture; use e.g. sm_86, gfx1201 or gfx1151")
        kind = device.get("kind", "gpu")
        if kind not in DEVICE_KINDS:
            raise ShapeError(f"devices[{index}].kind: {kind!r}; one of {', '.join(DEVICE_KINDS)}")
        out.append(DeviceLedger(parse_text(device.get("name", f"dev{index}"), f"devices[{index}].name"), capacity, arch=arch, kind=kind))
    return out


# A typed size and what the host's tool reports may differ by rounding (GiB in the inventory, MiB
# from nvidia-smi); past this the inventory describes another card.
DEVICE_AGREEMENT = 0.03


def reconcile_devices(typed: Any, discovered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The devices to price on when the host's own tools have been read (devices/gpu_facts.py):
    `endpoint_devices: discover` takes what the host reports; a typed list is kept (its names are
    the operator's) only where it agrees with the host: the same count, each size within
    DEVICE_AGREEMENT of what the host reports, and the same architecture where both name one."""
    if typed == "discover" or not typed:
        return list(discovered)
    mine, host = devices_from(typed), devices_from(discovered)
    if len(mine) != len(host):
        names = ", ".join(f"{d.name} {d.capacity / MIB:,.0f} MiB" for d in host)
        raise ShapeError(
            f"endpoint_devices: {len(mine)} device(s) typed, but the host reports {len(host)} ({names}); fix the list or set endpoint_devices: discover"
        )
    for index, (own, seen) in enumerate(zip(mine, host)):
        if abs(own.capacity - seen.capacity) > DEVICE_AGREEMENT * seen.capacity:
            raise ShapeError(
                f"endpoint_devices[{index}].memory: {own.capacity / MIB:,.0f} MiB typed for {own.name}, but the host reports "
                f"{seen.capacity / MIB:,.0f} MiB for {seen.name}; fix the size or set endpoint_devices: discover"
            )
        if own.arch and seen.arch and own.arch != seen.arch:
            raise ShapeError(f"endpoint_devices[{index}].arch: {own.arch} typed for {own.name}, but the host reports {seen.arch}; fix the arch")
    return list(typed)


# --- rules shared by both runtimes ------------------------------------------------------------


def _capacity_verdicts(devices: list[DeviceLedger], floor: int, max_gap: int | None) -> list[Verdict]:
    verdicts = []
    for device in devices:
        crossing = device.crossing_term()
        if crossing is not None:
            over = -device.free / MIB
            verdicts.append(
                Verdict(
                    "fits",
                    False,
                    f"{device.name}: {device.used / MIB:,.1f} MiB needed of {device.capacity / MIB:,.1f} MiB: "
                    f"over by {over:,.1f} MiB at term '{crossing.name}' ({crossing.bytes / MIB:,.1f} MiB)",
                    device.name,
                    crossing.name,
                    round(over, 1),
                )
            )
            continue
        verdicts.append(Verdict("fits", True, f"{device.name}: {device.used / MIB:,.1f} of {device.capacity / MIB:,.1f} MiB", device.name))
        if device.free < floor:
            short = (floor - device.free) / MIB
            largest = max(device.terms, key=lambda t: t.bytes)
            verdicts.append(
                Verdict(
                    "free_floor",
                    False,
                    f"{device.name}: {device.free / MIB:,.1f} MiB free, below the floor of {floor / MIB:,.1f} MiB by {short:,.1f} MiB "
                    f"(largest term '{largest.name}', {largest.bytes / MIB:,.1f} MiB)",
                    device.name,
                    largest.name,
                    round(short, 1),
                )
            )
        else:
            verdicts.append(Verdict("free_floor", True, f"{device.name}: {device.free / MIB:,.1f} MiB free >= floor {floor / MIB:,.1f} MiB", device.name))
    if max_gap is not None and len(devices) > 1:
        ranked = sorted(devices, key=lambda d: d.used)
        low, high = ranked[0], ranked[-1]
        gap = high.used - low.used
        ok = gap <= max_gap
        verdicts.append(
            Verdict(
                "device_gap",
                ok,
                f"{high.name} uses {gap / MIB:,.1f} MiB more than {low.name} (limit {max_gap / MIB:,.1f} MiB)" + ("" if ok else ": rebalance tensor_split"),
                None if ok else high.name,
                None,
                None if ok else round((gap - max_gap) / MIB, 1),
            )
        )
    return verdicts


def slot_ceiling(boots: Any, capacity: int, floor: int) -> tuple[int, int, int]:
    """From two measured boots (slots, used): fixed cost, per-slot cost and the largest slot count that fits."""
    if not isinstance(boots, list) or len(boots) < 2:
        raise ShapeError("slot_calibration.boots: give two measured boots with different slot counts")
    if not all(isinstance(b, dict) for b in boots[:2]):
        raise ShapeError("slot_calibration.boots: each boot is a mapping {slots, used}")
    (s1, u1), (s2, u2) = (
        (parse_int(b.get("slots"), f"slot_calibration.boots[{i}].slots", 1, 4096), parse_bytes(b.get("used"), f"slot_calibration.boots[{i}].used"))
        for i, b in enumerate(boots[:2])
    )
    if s1 == s2:
        raise ShapeError("slot_calibration.boots: the two boots must differ in slot count")
    per_slot = (u2 - u1) // (s2 - s1)
    fixed = u1 - s1 * per_slot
    if per_slot <= 0:
        raise ShapeError("slot_calibration.boots: more slots must use more memory")
    return fixed, per_slot, max((capacity - floor - fixed) // per_slot, 0)


def render_table(result: BudgetResult) -> str:
    """The ledger as a plain-text table, one column per device."""
    names = []
    for device in result.devices:
        for term in device.terms:
            if term.name not in names:
                names.append(term.name)
    header = ["term"] + [d.name for d in result.devices]
    rows = []
    for name in names:
        row = [name]
        for device in result.devices:
            size = sum(t.bytes for t in device.terms if t.name == name)
            row.append(f"{size / MIB:,.1f}" if size else "-")
        rows.append(row)
    rows.append(["used"] + [f"{d.used / MIB:,.1f}" for d in result.devices])
    rows.append(["capacity"] + [f"{d.capacity / MIB:,.1f}" for d in result.devices])
    rows.append(["free"] + [f"{d.free / MIB:,.1f}" for d in result.devices])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))) + "   (MiB)"]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        if row[0] == "used":
            lines.append("  ".join("-" * w for w in widths))
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    if result.host_terms:
        # What stays in host RAM (token embeddings, layers past --n-gpu-layers, tensors --override-tensor sends to CPU).
        lines.append("host RAM: " + ", ".join(f"{t.name} {t.bytes / MIB:,.1f}" for t in result.host_terms) + " (MiB)")
    lines.append("")
    for verdict in result.verdicts:
        lines.append(f"[{'ok' if verdict.ok else 'FAIL'}] {verdict.rule}: {verdict.message}")
    for note in result.notes:
        lines.append(f"note: {note}")
    lines.append(f"fits: {'yes' if result.fits else 'NO'}")
    return "\n".join(lines)
