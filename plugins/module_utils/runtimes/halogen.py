# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The halogen runtime: halogen's flash-server (served as frank-dragoon in seed 004), configured by
environment, not flags.

What the seeds give, and where it lives here:
- the environment it ran with: HALOGEN_CTX, HALOGEN_KV_POOL_POSITIONS (both 200704 in the latest
  era, "a multiple of 4096"), HALOGEN_TOKENIZER (a directory: "the engine's HALOGEN_TOKENIZER
  default is the directory") and SPEC_ADAPT=0 ("three deliberate deviations from the card (served
  id, SPEC_ADAPT=0, engine pin 0.16.2)"); variables the seeds do not name go in
  `extra_environment`;
- the pool law "ctx <= pool <= slots * ctx" (refused at parse time, naming the key);
- the ledger "62.9 GiB weights locked (0.8 vision) + 7.2 GiB KV in ONE 262,144-position pool
  (6,656 MiB, two slots) + 5.7 GiB working = 75.8 GiB in all", and at 200,704 "5.5 GiB reserved
  and 74.1 GiB in all": the KV reservation scales with the pool's positions from one calibration
  boot (7.2 GiB at 262,144 -> 5.51 GiB at 200,704), weights and working memory stay;
- the boot lines (the figures as the seed quotes them) feeding calibration;
- the refusal "400 in 0.86 s naming 200704 and the 96,405-token overage, before any prefill";
- the tokenizer payload rule: "tokenizer dir must be a real directory and every named file a
  regular file, no symlinks (HF snapshot links dangle in the mount)".
docs/vram_budget.md ("halogen") says what the seeds do not give.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import BudgetResult, DeviceLedger, Verdict, _capacity_verdicts
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.pricing import PayloadReader, add_extra_terms, client_verdicts
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.identity import DIRECTORY, PayloadName
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.base import AlertRule, ArgvError, Panel, RefusalContract, Runtime
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.boot_ledger import NUM, BootLedger, to_float, to_int
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import (
    MAX_SLOTS,
    MAX_TOKENS,
    Shape,
    ShapeError,
    key,
    parse_bytes,
    parse_int,
    parse_text,
    resolve_path,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, MIB

NAME = "halogen"
POOL_LAW = "seed 004: the pool law ctx <= pool <= slots * ctx"
TOKENIZER_LAW = "seed 004: 'tokenizer dir must be a real directory and every named file a regular file, no symlinks (HF snapshot links dangle in the mount)'"
# The variables the seeds name, and the four the collection names because the seeds do not (the
# engine must listen on the shape's port and address and serve its id and model, or the health
# gate judges a process the shape does not describe): PLACEHOLDER names until the card's are known
# (docs/vram_budget.md "halogen"). extra_environment may not shadow any of them.
SEED_VARIABLES = ("HALOGEN_CTX", "HALOGEN_KV_POOL_POSITIONS", "HALOGEN_TOKENIZER", "SPEC_ADAPT")
PLACEHOLDER_VARIABLES = ("HALOGEN_HOST", "HALOGEN_PORT", "HALOGEN_SERVED_ID", "HALOGEN_MODEL")
OWN_VARIABLES = SEED_VARIABLES + PLACEHOLDER_VARIABLES
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --- the shape ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HalogenShape(Shape):
    """halogen's flash-server, configured by environment."""

    ctx: int = key("int", "halogen HALOGEN_CTX: the most positions one request may hold.", required=True, minimum=1, maximum=MAX_TOKENS)
    kv_pool_positions: int = key(
        "int",
        "halogen HALOGEN_KV_POOL_POSITIONS: the ONE KV pool every slot shares; ctx <= pool <= pool_slots x ctx.",
        required=True,
        minimum=1,
        maximum=MAX_TOKENS,
    )
    pool_slots: int = key(
        "int",
        "halogen: the slots sharing the pool (the boot prints 'two slots'; no engine variable sets it, so none is rendered).",
        default=2,
        minimum=1,
        maximum=MAX_SLOTS,
    )
    tokenizer_dir: str = key(
        "str",
        "halogen: the tokenizer directory relative to the payload directory (HALOGEN_TOKENIZER is where the engine sees it); "
        "a real directory whose files are regular files, no symlinks.",
        default="tokenizer",
    )
    tokenizer_files: tuple[str, ...] = key("list", "halogen: the files the tokenizer directory must hold (each a regular file).", default=())
    spec_adapt: bool | None = key("bool", "halogen SPEC_ADAPT (the fleet runs 0, a deliberate deviation from the card).")
    mtp_depth: int | None = key("int", "halogen: the MTP depth the boot must print ('MTP depth-2'); checked against the boot ledger.", maximum=64)
    prompt_cache_entries: int | None = key(
        "int", "halogen: the prompt-cache entries the boot must print ('prompt cache ON (12 entries)'); 0 for off.", maximum=1 << 20
    )
    extra_environment: Mapping[str, Any] | None = key("mapping", "halogen: further variables for the engine, rendered as they are.")
    weights_locked: int | None = key("size", "Budget - the weights the engine locks (62.9 GiB, vision included).", group="budget")
    vision_bytes: int | None = key("size", "Budget - the vision part of the locked weights (0.8 GiB), shown in the note.", group="budget")
    working_bytes: int | None = key("size", "Budget - the engine's working memory (5.7 GiB).", group="budget")
    kv_pool_bytes_per_position: int | None = key("size", "Budget - the pool's bytes per position (6,656 MiB over 262,144 positions: 26 KiB).", group="budget")
    kv_reservation_calibration: Mapping[str, Any] | None = key(
        "mapping",
        "Budget - one boot's KV reservation {positions, reserved} (7.2 GiB at 262,144): the reservation scales with the pool's positions.",
        group="budget",
    )
    ngram_table_bytes: int | None = key("size", "Budget - the n-gram table read from disk through the page cache (47.68 GiB), a host note.", group="budget")

    RUNTIME: ClassVar[str] = NAME
    LAYOUT_KEYS: ClassVar[tuple[str, ...]] = ("ctx", "kv_pool_positions", "pool_slots")

    @property
    def slots(self) -> int:
        return self.pool_slots

    @property
    def kv_dtypes(self) -> tuple[str, ...]:
        return ()

    @property
    def request_ceiling(self) -> int:
        return self.ctx

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        ctx, pool, slots = values.get("ctx"), values.get("kv_pool_positions"), values.get("pool_slots", 2)
        if ctx is not None and pool is not None:
            check_pool_law(ctx, pool, slots)
        for name in values.get("tokenizer_files") or ():
            text = parse_text(name, "tokenizer_files")
            if not text or "/" in text or text in (".", ".."):
                raise ShapeError(f"tokenizer_files: {text!r} is not a file name; the tokenizer directory is FLAT ({TOKENIZER_LAW})")
        tokenizer = str(values.get("tokenizer_dir", "tokenizer"))
        if tokenizer.startswith("/") or ".." in tokenizer.split("/"):
            raise ShapeError(f"tokenizer_dir: {tokenizer!r} must be a path inside the payload directory")
        for name in values.get("extra_environment") or {}:
            if not _VARIABLE.match(str(name)):
                raise ShapeError(f"extra_environment: {name!r} is not a valid variable name")
            if name in OWN_VARIABLES:
                raise ShapeError(f"extra_environment: {name} is rendered from its own shape key; set that key instead")


def check_pool_law(ctx: int, pool: int, slots: int) -> None:
    """ctx <= pool <= slots x ctx: the pool must hold one full request, and more than every slot's
    full window is memory no request can use."""
    if pool < ctx:
        raise ShapeError(f"kv_pool_positions: {pool:,} is below ctx {ctx:,}: one maximum-length request would not fit the pool ({POOL_LAW})")
    if pool > slots * ctx:
        raise ShapeError(f"kv_pool_positions: {pool:,} is above pool_slots x ctx = {slots} x {ctx:,} = {slots * ctx:,}: positions no slot can use ({POOL_LAW})")


# --- environment and argv ------------------------------------------------------------------------


def halogen_environment(shape: HalogenShape, model_root: str = "") -> dict[str, str]:
    env = {
        "HALOGEN_CTX": str(shape.ctx),
        "HALOGEN_KV_POOL_POSITIONS": str(shape.kv_pool_positions),
        "HALOGEN_TOKENIZER": str(resolve_path(shape.tokenizer_dir, model_root) or shape.tokenizer_dir),
    }
    if shape.spec_adapt is not None:
        env["SPEC_ADAPT"] = "1" if shape.spec_adapt else "0"
    env["HALOGEN_HOST"] = shape.bind
    if shape.port not in (None, ""):
        env["HALOGEN_PORT"] = str(shape.port)
    if shape.served_id:
        env["HALOGEN_SERVED_ID"] = str(shape.served_id)
    if shape.model_file:
        env["HALOGEN_MODEL"] = str(resolve_path(shape.model_file, model_root) or shape.model_file)
    for name, value in (shape.extra_environment or {}).items():
        env[str(name)] = parse_text(value, f"extra_environment.{name}")
    return env


# --- the payload rule: the tokenizer directory ---------------------------------------------------


def check_tokenizer_dir(shape: HalogenShape, payload_dir: str) -> None:
    """The tokenizer directory is mounted whole: a real directory (not a link), every entry a
    regular file (no symlink: an HF snapshot's links dangle inside the mount), every named file
    present. Raises ShapeError naming tokenizer_dir and the seed rule."""
    path = resolve_path(shape.tokenizer_dir, payload_dir) or shape.tokenizer_dir
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise ShapeError(f"tokenizer_dir: {path} does not exist ({TOKENIZER_LAW})") from None
    if stat.S_ISLNK(info.st_mode):
        raise ShapeError(f"tokenizer_dir: {path} is a symlink, not a real directory ({TOKENIZER_LAW})")
    if not stat.S_ISDIR(info.st_mode):
        raise ShapeError(f"tokenizer_dir: {path} is not a directory ({TOKENIZER_LAW})")
    for entry in sorted(os.listdir(path)):
        mode = os.lstat(os.path.join(path, entry)).st_mode
        if stat.S_ISLNK(mode):
            raise ShapeError(f"tokenizer_dir: {path}/{entry} is a symlink ({TOKENIZER_LAW})")
        if not stat.S_ISREG(mode):
            raise ShapeError(f"tokenizer_dir: {path}/{entry} is not a regular file; the directory is flat ({TOKENIZER_LAW})")
    missing = [name for name in shape.tokenizer_files if not os.path.isfile(os.path.join(path, name))]
    if missing:
        raise ShapeError(f"tokenizer_dir: {path} lacks {', '.join(missing)} ({TOKENIZER_LAW})")


# --- the ledger ----------------------------------------------------------------------------------


def kv_reserved_bytes(shape: HalogenShape) -> int | None:
    """The KV reservation at the shape's pool: the calibration boot's reservation scaled by
    positions (seed 004: 7.2 GiB at 262,144; the 200,704 boot printed 5.5)."""
    calibration = shape.kv_reservation_calibration
    if not calibration:
        if shape.kv_pool_bytes_per_position is None:
            return None
        return shape.kv_pool_positions * shape.kv_pool_bytes_per_position
    positions = parse_int(calibration.get("positions"), "kv_reservation_calibration.positions", 1, MAX_TOKENS)
    reserved = parse_bytes(calibration.get("reserved"), "kv_reservation_calibration.reserved")
    return reserved * shape.kv_pool_positions // positions


def _price_halogen(shape: HalogenShape, devices: list[DeviceLedger], payload: PayloadReader, boots: list[dict[str, Any]]) -> BudgetResult:
    if len(devices) != 1:
        raise ShapeError(f"endpoint_devices: halogen's flash-server runs on one device (unified memory), {len(devices)} are listed")
    if payload.payload_dir and os.path.isdir(payload.payload_dir):
        check_tokenizer_dir(shape, payload.payload_dir)
    device = devices[0]
    notes: list[str] = []
    weights = shape.weights_locked or 0
    vision = f"{shape.vision_bytes / GIB:.1f} GiB vision inside" if shape.vision_bytes else ""
    device.add("weights_locked", weights, vision)
    reserved = kv_reserved_bytes(shape)
    pool_bytes = shape.kv_pool_positions * shape.kv_pool_bytes_per_position if shape.kv_pool_bytes_per_position else None
    pool_note = f"ONE {shape.kv_pool_positions:,}-position pool" + (f" ({pool_bytes / MIB:,.0f} MiB)" if pool_bytes else "") + f", {shape.pool_slots} slots"
    if reserved is None:
        notes.append("kv: no kv_reservation_calibration or kv_pool_bytes_per_position, so the KV reservation is not priced")
    else:
        device.add("kv_reserved", reserved, pool_note)
    device.add("working", shape.working_bytes or 0)
    add_extra_terms(devices, shape.extra_terms)
    if shape.ngram_table_bytes:
        notes.append(
            f"n-gram table {shape.ngram_table_bytes / GIB:.2f} GiB is read from disk through the page cache: RAM the pool takes is RAM that table loses"
        )
    if shape.kv_pool_positions < 2 * shape.ctx:
        notes.append(f"pool {shape.kv_pool_positions:,} < 2 x ctx: ONE maximum-length request fills the pool; two long conversations never coexist")
    verdicts = [
        Verdict(
            "pool_law",
            True,
            f"ctx {shape.ctx:,} <= pool {shape.kv_pool_positions:,} <= {shape.pool_slots} x ctx {shape.pool_slots * shape.ctx:,}",
        )
    ]
    verdicts.extend(_capacity_verdicts(devices, shape.free_floor, shape.max_device_gap))
    client, client_judged = client_verdicts(shape)
    verdicts.extend(client_judged)
    kv: dict[str, Any] = {
        "pool_positions": shape.kv_pool_positions,
        "ctx": shape.ctx,
        "slots": shape.pool_slots,
        "full_requests_at_once": shape.kv_pool_positions // shape.ctx,
        "total_bytes": device.used,
        "total_gib": round(device.used / GIB, 1),
    }
    if reserved is not None:
        kv.update(reserved_bytes=reserved, reserved_gib=round(reserved / GIB, 1))
    if pool_bytes is not None:
        kv.update(pool_bytes=pool_bytes, pool_mib=round(pool_bytes / MIB, 1))
    if reserved is not None:
        notes.append(f"ledger: {reserved / GIB:.1f} GiB reserved and {device.used / GIB:.1f} GiB in all")
    key_text = f"{NAME}:ctx={shape.ctx}:pool={shape.kv_pool_positions}:slots={shape.pool_slots}"
    return BudgetResult(NAME, devices, kv, client, verdicts, [], notes, key_text, None)


# --- boot lines and calibration ------------------------------------------------------------------

GIB_NUM = NUM + r"\s*GiB"
_BOOT = (
    ("weights_locked_gib", re.compile(GIB_NUM + r"\s*weights locked")),
    ("vision_gib", re.compile(r"weights locked\s*\(\s*" + NUM + r"\s*(?:GiB\s*)?vision\)")),
    ("kv_reserved_gib", re.compile(GIB_NUM + r"\s*(?:KV in ONE|reserved)")),
    ("pool_positions", re.compile(r"ONE\s*" + NUM + r"-position pool")),
    ("pool_mib", re.compile(r"-position pool\s*\(\s*" + NUM + r"\s*MiB")),
    ("working_gib", re.compile(GIB_NUM + r"\s*working")),
    ("total_gib", re.compile(GIB_NUM + r"\s*in all")),
    ("ngram_gib", re.compile(r"n-gram\s*" + GIB_NUM)),
    ("prompt_cache_entries", re.compile(r"prompt cache ON\s*\(\s*" + NUM + r"\s*entries")),
    ("mtp_depth", re.compile(r"MTP depth-(\d+)")),
)
_SLOTS = re.compile(r"-position pool\s*\([^)]*?\b(one|two|three|four|\d+) slots?\)")
_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4}
_CACHE_OFF = re.compile(r"prompt cache OFF")
_CLAMP = re.compile(r"(?i)\bclamp(?:ed|ing)?\b(?! line)")
_ENTRY_WARNING = re.compile(r"smaller than ONE full-context entry")


def _parse_halogen_line(line: str, ledger: BootLedger) -> None:
    facts = ledger.facts
    for name, pattern in _BOOT:
        match = pattern.search(line)
        if match:
            text = match.group(1)
            facts[f"halogen_{name}"] = to_float(text) if name.endswith(("_gib", "_mib")) else to_int(text)
    match = _SLOTS.search(line)
    if match:
        word = match.group(1)
        facts["halogen_slots"] = _WORDS.get(word) or int(word)
    if _CACHE_OFF.search(line):
        facts["halogen_prompt_cache_entries"] = 0
    if _CLAMP.search(line):
        facts["halogen_clamped"] = True
    if _ENTRY_WARNING.search(line):
        facts["halogen_entry_warning"] = True


def predicted_boot(shape: HalogenShape) -> dict[str, Any]:
    """What the boot must print at this shape, at the engine's 0.1 GiB precision."""
    reserved = kv_reserved_bytes(shape) or 0
    total = (shape.weights_locked or 0) + reserved + (shape.working_bytes or 0)
    out: dict[str, Any] = {"kv_reserved_gib": round(reserved / GIB, 1), "total_gib": round(total / GIB, 1), "pool_positions": shape.kv_pool_positions}
    if shape.mtp_depth is not None:
        out["mtp_depth"] = shape.mtp_depth
    if shape.prompt_cache_entries is not None:
        out["prompt_cache_entries"] = shape.prompt_cache_entries
    return out


def _compare_halogen(boot: dict[str, Any], shape: HalogenShape) -> dict[str, Any]:
    facts = (boot.get("ledger") or {}).get("facts") or {}
    if "halogen_total_gib" not in facts:
        return {"agree": None, "detail": "the boot printed no '... GiB in all' line"}
    predicted = predicted_boot(shape)
    measured = {name: facts.get(f"halogen_{name}") for name in predicted}
    measured = {name: value for name, value in measured.items() if value is not None}
    predicted = {name: predicted[name] for name in measured}
    agree = all(abs(float(predicted[name]) - float(measured[name])) <= 0.05 + 1e-9 for name in measured)
    basis = "scaled by positions from kv_reservation_calibration" if shape.kv_reservation_calibration else "positions x kv_pool_bytes_per_position"
    detail = f"KV reservation {basis}; weights and working as declared"
    if facts.get("halogen_clamped"):
        agree, detail = False, detail + "; the boot printed a clamp line (the engine changed the shape)"
    return {"predicted": predicted, "measured": measured, "agree": agree, "detail": detail}


# --- the driver ------------------------------------------------------------------------------------

# seed 004: "the refusal contract at the new ceiling (400 in 0.86 s naming 200704 and the
# 96,405-token overage, before any prefill)". The seeds quote the figures, not the sentence, so the
# patterns read a window number and an overage number however the sentence is worded.
REFUSAL = RefusalContract(
    (re.compile(r"(?i)(?:HALOGEN_CTX|ctx|context(?: window)?|window|ceiling|limit)\D{0,24}?\b(\d[\d,]{3,})\b(?!-token)"),),
    (re.compile(r"(?i)prompt (?:of|has|is) (\d[\d,]*) tokens"),),
    (re.compile(r"(?i)\b(\d[\d,]*)[- ]tokens? overage"), re.compile(r"(?i)over (?:by )?(\d[\d,]*) tokens")),
    True,
)


class Halogen(Runtime):
    name = NAME
    shape_class = HalogenShape
    # The seeds name no key variable for flash-server; this one is the collection's (docs/vram_budget.md).
    api_key_env = "HALOGEN_API_KEY"
    native_program = "flash-server"
    image_starts_program = True
    # The seeds capture no /metrics of flash-server: observability/exported/halogen.metrics is a
    # minimal exposition of the two in-flight gauges the drain needs, in the driver's namespace,
    # and no alert rule or panel is claimed beyond what it holds.
    in_flight_gauges = (f"{NAME}:requests_processing", f"{NAME}:requests_deferred")
    alert_rules = (AlertRule("RequestsQueueing", f"{NAME}:requests_deferred{{sel}} > 0", "5m", "warning", "{name}: requests wait for a slot"),)
    panels = (
        Panel(
            "Requests processing / deferred",
            ((f"{NAME}:requests_processing{{sel}}", "{{job}} processing"), (f"{NAME}:requests_deferred{{sel}}", "{{job}} deferred")),
        ),
    )
    refusal = REFUSAL
    reasoning_field = "reasoning_content"
    echoes_requested_name = False

    def argv(self, shape: Any, model_root: str = "", entry: list[str] | None = None) -> list[str]:
        # Configured by environment (`environment`): the command line is the program alone.
        if shape.port in (None, ""):
            raise ArgvError("port: required to build the halogen command line")
        return list(entry or [self.native_program]) + list(shape.extra_args)

    def environment(self, shape: Any, model_root: str = "") -> dict[str, str]:
        return halogen_environment(shape, model_root)

    def price(self, shape: Any, devices: list[DeviceLedger], payload: PayloadReader, boots: list[dict[str, Any]]) -> BudgetResult:
        return _price_halogen(shape, devices, payload, boots)

    def payload_names(self, shape: Any) -> list[PayloadName]:
        # The engine reads its tokenizer from HALOGEN_TOKENIZER, a directory of the payload holding
        # every tokenizer_files name; its weights path is not a shape key.
        folder = shape.tokenizer_dir
        files = [PayloadName(f"tokenizer_files[{index}]", posixpath.join(folder, name)) for index, name in enumerate(shape.tokenizer_files)]
        return [PayloadName("tokenizer_dir", folder, DIRECTORY), *files]

    def prices_on_controller(self, shape: Any) -> bool:
        # Every term is declared in the shape: nothing is read on the host to price it.
        return True

    def controller_geometry_source(self, shape: Any) -> bool:
        return False

    def parse_boot_line(self, line: str, ledger: BootLedger) -> None:
        _parse_halogen_line(line, ledger)

    def claims_boot(self, ledger: BootLedger) -> bool:
        return "halogen_total_gib" in ledger.facts or "halogen_weights_locked_gib" in ledger.facts

    def compare_boot(self, boot: dict[str, Any], boots: list[dict[str, Any]], shape: Any, geometry: Any) -> dict[str, Any]:
        return _compare_halogen(boot, shape)


DRIVER = Halogen()
