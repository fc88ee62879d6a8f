# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's GPU devices as facts: what nvidia-smi, rocm-smi or the amdgpu sysfs files report.

One `DeviceFacts` per device, in bytes. Parsers take the tool's text (or a sysfs root), so a
recorded output parses exactly as a live one; `discover()` runs the tools as argv lists through a
runner with AnsibleModule.run_command's contract (argv -> rc, stdout, stderr).

Laws (docs/gpu_facts.md):
- free-field law (seed 004: "nvidia-smi free-field law (driver holds ~450 MiB the subtraction
  hides)"): on NVIDIA total - used != free; the difference is the driver's own reserve, recorded
  as `driver_reserved_bytes` (memory.reserved where the driver reports it, else the subtraction).
- iGPU pool law: an integrated GPU (Strix Halo gfx1151) has a VRAM carve-out and a GTT pool of
  system memory. The engine allocates from one of them, never from their sum: `usable_bytes` is
  the larger pool (GTT behind a small BIOS carve-out, the carve-out when the BIOS gives it most
  memory), and `memory_pool` names it.
- fp8 KV needs the architecture vLLM accepts (`kv_dtype_support`).

Every failure is a `GpuFactsError` naming the tool, its exit status and the first line of its
output; every count parsed is bounded.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

MIB = 1 << 20
MAX_DEVICES = 64
MAX_OUTPUT_CHARS = 1 << 20  # 1 MiB of tool output; a GPU list is a few hundred bytes per device
MAX_MEMORY_BYTES = 1 << 50  # 1 PiB: no device reports more
MAX_PCIE_GEN = 10
MAX_PCIE_WIDTH = 64
MAX_SYSFS_FILE_CHARS = 64 << 10

# (argv) -> (rc, stdout, stderr): AnsibleModule.run_command's contract.
Runner = Callable[[list[str]], tuple[int, str, str]]


class GpuFactsError(Exception):
    """A tool missing, failing or printing what is not its format; the message says which."""


@dataclass(frozen=True)
class DeviceFacts:
    index: int  # the tool's own index (nvidia-smi index, rocm-smi/sysfs cardN)
    name: str
    vendor: str  # nvidia | amd
    backend: str  # the engines' device name: CUDA0, ROCm0 (llama.cpp's GGML_CUDA_NAME + ordinal)
    total_bytes: int | None  # VRAM (the carve-out on an iGPU); None where the tool reports [N/A]
    used_bytes: int | None
    free_bytes: int | None
    driver_reserved_bytes: int | None  # NVIDIA: memory.reserved, else total - used - free
    architecture: str | None  # sm_86, sm_90, gfx1201, gfx1151: what budget/ledger.py's ARCH_RE accepts
    compute_capability: str | None  # NVIDIA only: "8.6"
    integrated: bool
    memory_pool: str  # vram | gtt: the pool the engine allocates from (iGPU pool law)
    usable_bytes: int | None  # the size of that pool: what the budget should price against
    usable_free_bytes: int | None
    gtt_total_bytes: int | None
    gtt_free_bytes: int | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    uuid: str | None
    pci_bus: str | None
    source: str  # nvidia-smi | rocm-smi | sysfs

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def budget_device(self) -> dict[str, object]:
        """The device as vram_budget's `devices` take it: {name, memory, arch}."""
        if not self.usable_bytes:
            raise GpuFactsError(f"{self.backend} ({self.name}): {self.source} reports no memory size; give the device by hand")
        device: dict[str, object] = {"name": self.backend.lower(), "memory": self.usable_bytes}
        if self.architecture:
            device["arch"] = self.architecture
        return device


def budget_devices(devices: Iterable[DeviceFacts]) -> list[dict[str, object]]:
    """Every device as vram_budget's `devices` (and endpoint_devices) take them."""
    return [device.budget_device() for device in devices]


# --- shared helpers ---------------------------------------------------------------------------


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return "(no output)"


def _bounded_int(text: str, what: str, tool: str, upper: int) -> int:
    try:
        value = int(text.strip(), 0) if text.strip().lower().startswith("0x") else int(text.strip())
    except ValueError:
        raise GpuFactsError(f"{tool}: {what} is {text.strip()[:40]!r}, not a whole number") from None
    if not 0 <= value <= upper:
        raise GpuFactsError(f"{tool}: {what} {value} is out of range (0..{upper})")
    return value


def _check_output_size(text: str, tool: str) -> None:
    if len(text) > MAX_OUTPUT_CHARS:
        raise GpuFactsError(f"{tool}: output is {len(text)} characters, more than {MAX_OUTPUT_CHARS}; first line: {_first_line(text)}")


def _check_count(count: int, tool: str) -> None:
    if count > MAX_DEVICES:
        raise GpuFactsError(f"{tool}: {count} devices; at most {MAX_DEVICES}")


def _minus(total: int | None, *parts: int | None) -> int | None:
    if total is None or any(part is None for part in parts):
        return None
    return total - sum(part for part in parts if part is not None)


# --- architectures ----------------------------------------------------------------------------

_COMPUTE_CAP_RE = re.compile(r"^(\d{1,2})\.(\d)$")


def sm_arch(compute_cap: str) -> str:
    """nvidia-smi's compute_cap "8.6" -> "sm_86" ("10.0" -> "sm_100", "12.0" -> "sm_120")."""
    match = _COMPUTE_CAP_RE.match(compute_cap.strip())
    if not match:
        raise GpuFactsError(f"nvidia-smi: compute_cap {compute_cap.strip()[:20]!r} is not MAJOR.MINOR")
    return f"sm_{int(match.group(1))}{match.group(2)}"


def gfx_from_target_version(version: int) -> str:
    """KFD's gfx_target_version (major*10000 + minor*100 + stepping) -> the gfx target name.

    The kernel prints it in decimal; the target name writes minor and stepping as hex digits:
    110501 -> gfx1151, 120001 -> gfx1201, 90010 -> gfx90a, 90402 -> gfx942."""
    major, rest = divmod(version, 10000)
    minor, stepping = divmod(rest, 100)
    if not (1 <= major <= 99 and minor <= 15 and stepping <= 15):
        raise GpuFactsError(f"sysfs: gfx_target_version {version} is not major*10000 + minor*100 + stepping")
    return f"gfx{major}{minor:x}{stepping:x}"


# AMD APUs: integrated GPUs whose memory is a BIOS carve-out plus GTT (system memory). sysfs and
# rocm-smi carry no "integrated" flag, so the gfx target decides (ROCm's and LLVM's AMDGPU target
# tables: Strix Halo, Strix Point, Krackan, Phoenix/Hawk Point, Raphael, Rembrandt, Mendocino,
# Van Gogh, Renoir/Cezanne/Lucienne, Raven/Picasso).
INTEGRATED_GFX = frozenset({"gfx1151", "gfx1150", "gfx1152", "gfx1153", "gfx1103", "gfx1036", "gfx1035", "gfx1037", "gfx1033", "gfx90c", "gfx902", "gfx909"})


# --- KV dtype support -------------------------------------------------------------------------

_FP8_KV = re.compile(r"^fp8(_.*)?$")
_SM_RE = re.compile(r"^sm_(\d{2,3})[a-z]?$")


@dataclass(frozen=True)
class KvDtypeSupport:
    supported: bool | None  # None: the architecture is unknown, so nothing can be said
    reason: str


def kv_dtype_support(kv_dtype: str, architecture: str | None) -> KvDtypeSupport:
    """Whether a device's architecture can run a KV-cache dtype, by vLLM's own rule for fp8.

    Only fp8 KV (fp8, fp8_e4m3, fp8_e5m2, ...) has an architecture rule here; any other dtype is
    accepted (the block/head-dim and backend rules live in budget/rules.py).
    - NVIDIA: vllm/platforms/cuda.py, CudaPlatformBase.supports_fp8():
      `return cls.has_device_capability(89)` -- compute capability >= 8.9 (Ada, Hopper, Blackwell).
      The seeds agree: "fp8 KV is hardware-dead on the 3090 (sm_86, no cvt.e4m3x2)" (seed 001).
    - AMD: vllm/platforms/rocm.py, RocmPlatform.supports_fp8():
      `any(gfx in gcn_arch for gfx in ["gfx94", "gfx95", "gfx12"])` (MI300/MI350 and RDNA4);
      later revisions write `on_cdna() or on_rdna4()` (_ON_CDNA: "gfx9" or "gfx1250"; _ON_RDNA4:
      "gfx1200"/"gfx1201"). The rule here accepts what both revisions accept.
    """
    dtype = (kv_dtype or "").strip().lower()
    if not _FP8_KV.match(dtype):
        return KvDtypeSupport(True, f"{kv_dtype}: no architecture rule")
    if not architecture:
        return KvDtypeSupport(None, f"{kv_dtype}: the device's architecture is unknown")
    arch = architecture.strip().lower()
    sm = _SM_RE.match(arch)
    if sm:
        capability = int(sm.group(1))
        if capability >= 89:
            return KvDtypeSupport(True, f"{kv_dtype} on {arch}: compute capability >= 8.9 (vLLM supports_fp8)")
        return KvDtypeSupport(False, f"{kv_dtype} on {arch}: fp8 KV needs compute capability >= 8.9 (sm_89: Ada, Hopper, Blackwell)")
    if arch.startswith("gfx"):
        if arch.startswith(("gfx94", "gfx95", "gfx12")):
            return KvDtypeSupport(True, f"{kv_dtype} on {arch}: gfx94x/gfx95x/gfx12 (vLLM supports_fp8)")
        return KvDtypeSupport(False, f"{kv_dtype} on {arch}: fp8 KV needs gfx94x, gfx95x or gfx12 (RDNA4)")
    return KvDtypeSupport(None, f"{kv_dtype}: {architecture!r} is not an sm_NN or gfx architecture")


def kv_dtype_supported(kv_dtype: str, architecture: str | None) -> bool | None:
    """kv_dtype_support(...).supported: True, False, or None when the architecture is unknown."""
    return kv_dtype_support(kv_dtype, architecture).supported


# --- nvidia-smi -------------------------------------------------------------------------------

NVIDIA_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "memory.used",
    "memory.free",
    "memory.reserved",
    "compute_cap",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
)
NVIDIA_REQUIRED = ("index", "name", "memory.total", "memory.used", "memory.free")
# Fields an older driver may not know: nvidia-smi then refuses the WHOLE query (exit 2,
# 'Field "compute_cap" is not a valid field to query.'), so discover() drops the named field and
# asks again. memory.reserved is R510+, compute_cap arrived around R510 as well (drivers 470.x
# refuse it). Without memory.reserved the reserve is the subtraction; without compute_cap the
# architecture is unknown and the fp8 rule answers None.
NVIDIA_OPTIONAL = ("memory.reserved", "compute_cap", "uuid", "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max")
_NOT_A_VALUE = {"", "[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]", "[gpu is lost]"}
_INVALID_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field to query')
_HEADER_UNIT_RE = re.compile(r"\s*\[[^\]]*\]\s*$")


def nvidia_smi_argv(fields: Iterable[str] = NVIDIA_FIELDS) -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


def _nvidia_value(text: str) -> str | None:
    value = text.strip()
    return None if value.lower() in _NOT_A_VALUE else value


def _mib(value: str | None, what: str) -> int | None:
    if value is None:
        return None
    number = value[:-3].strip() if value.endswith("MiB") else value  # a recording made without nounits
    return _bounded_int(number, what, "nvidia-smi", MAX_MEMORY_BYTES // MIB) * MIB


def parse_nvidia_smi(text: str, fields: Iterable[str] = NVIDIA_FIELDS) -> list[DeviceFacts]:
    """nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits, one row per GPU.

    A recording with its header line (--format=csv,nounits) names its own columns; without one,
    the columns are `fields`, in order. Memory is MiB; [N/A] and [Not Supported] are None."""
    _check_output_size(text, "nvidia-smi")
    rows = [row for row in csv.reader(text.splitlines(), skipinitialspace=True) if any(cell.strip() for cell in row)]
    columns = [field.strip() for field in fields]
    if rows and "memory.total" in [_HEADER_UNIT_RE.sub("", cell).strip() for cell in rows[0]]:
        columns = [_HEADER_UNIT_RE.sub("", cell).strip() for cell in rows[0]]
        rows = rows[1:]
    missing = [name for name in NVIDIA_REQUIRED if name not in columns]
    if missing:
        raise GpuFactsError(f"nvidia-smi: the query lacks {', '.join(missing)}")
    if not rows:
        raise GpuFactsError("nvidia-smi: no GPU rows in the output")
    _check_count(len(rows), "nvidia-smi")
    devices = []
    for ordinal, row in enumerate(rows):
        if len(row) != len(columns):
            raise GpuFactsError(f"nvidia-smi: row {ordinal + 1} has {len(row)} fields, the query asked for {len(columns)}: {','.join(row)[:200]!r}")
        cell = {name: _nvidia_value(value) for name, value in zip(columns, row)}
        index_text = cell.get("index")
        if index_text is None:
            raise GpuFactsError(f"nvidia-smi: row {ordinal + 1} has no index")
        index = _bounded_int(index_text, "index", "nvidia-smi", 1023)
        total = _mib(cell.get("memory.total"), "memory.total")
        used = _mib(cell.get("memory.used"), "memory.used")
        free = _mib(cell.get("memory.free"), "memory.free")
        reserved = _mib(cell.get("memory.reserved"), "memory.reserved")
        if reserved is None:
            reserved = _minus(total, used, free)  # the free-field law: what the subtraction hides
        if reserved is not None and reserved < 0:
            raise GpuFactsError(f"nvidia-smi: GPU {index}: used {used} + free {free} exceed total {total}")
        compute_cap = cell.get("compute_cap")

        def small(name: str, upper: int, cell: dict[str, str | None] = cell) -> int | None:
            value = cell.get(name)
            return None if value is None else _bounded_int(value, name, "nvidia-smi", upper)

        devices.append(
            DeviceFacts(
                index=index,
                name=cell.get("name") or f"NVIDIA GPU {index}",
                vendor="nvidia",
                backend=f"CUDA{ordinal}",
                total_bytes=total,
                used_bytes=used,
                free_bytes=free,
                driver_reserved_bytes=reserved,
                architecture=sm_arch(compute_cap) if compute_cap else None,
                compute_capability=compute_cap,
                integrated=False,
                memory_pool="vram",
                usable_bytes=total,
                usable_free_bytes=free,
                gtt_total_bytes=None,
                gtt_free_bytes=None,
                pcie_gen_current=small("pcie.link.gen.current", MAX_PCIE_GEN),
                pcie_gen_max=small("pcie.link.gen.max", MAX_PCIE_GEN),
                pcie_width_current=small("pcie.link.width.current", MAX_PCIE_WIDTH),
                pcie_width_max=small("pcie.link.width.max", MAX_PCIE_WIDTH),
                uuid=cell.get("uuid"),
                pci_bus=cell.get("pci.bus_id"),
                source="nvidia-smi",
            )
        )
    return devices


def query_nvidia_smi(run: Runner) -> list[DeviceFacts]:
    """Run the full query; where the driver refuses an optional field, drop it and ask again."""
    fields = list(NVIDIA_FIELDS)
    for _attempt in range(len(NVIDIA_OPTIONAL) + 1):
        rc, out, err = _run(run, nvidia_smi_argv(fields), "nvidia-smi")
        if rc == 0:
            return parse_nvidia_smi(out, fields)
        refused = _INVALID_FIELD_RE.search(out + "\n" + err)
        if not refused or refused.group(1) not in NVIDIA_OPTIONAL or refused.group(1) not in fields:
            raise _exit_error("nvidia-smi", rc, out, err)
        fields.remove(refused.group(1))
    raise _exit_error("nvidia-smi", rc, out, err)


# --- rocm-smi ---------------------------------------------------------------------------------

ROCM_SMI_ARGV = ["rocm-smi", "--showmeminfo", "vram", "gtt", "--showproductname", "--showbus", "--json"]
_CARD_RE = re.compile(r"^card(\d{1,4})$")


def _rocm_bytes(card: dict, key: str, name: str) -> int | None:
    value = card.get(key)
    if value is None or str(value).strip().lower() in _NOT_A_VALUE:
        return None
    return _bounded_int(str(value), f"{name} {key!r}", "rocm-smi", MAX_MEMORY_BYTES)


def _amd_device(
    index: int,
    ordinal: int,
    name: str,
    gfx: str | None,
    memory: tuple[int | None, int | None, int | None, int | None],
    source: str,
    pci_bus: str | None,
    link: tuple[int | None, int | None, int | None, int | None] = (None, None, None, None),
) -> DeviceFacts:
    """One AMD device; memory = (vram total, vram used, gtt total, gtt used), link = PCIe (gen
    current, gen max, width current, width max). The iGPU pool law: an integrated GPU whose GTT
    pool is larger than its carve-out allocates from the GTT pool, never from their sum."""
    vram_total, vram_used, gtt_total, gtt_used = memory
    integrated = bool(gfx) and gfx in INTEGRATED_GFX
    vram_free = _minus(vram_total, vram_used)
    gtt_free = _minus(gtt_total, gtt_used)
    if integrated and gtt_total is not None and (vram_total is None or gtt_total > vram_total):
        pool, usable, usable_free = "gtt", gtt_total, gtt_free
    else:
        pool, usable, usable_free = "vram", vram_total, vram_free
    return DeviceFacts(
        index=index,
        name=name[:120],
        vendor="amd",
        backend=f"ROCm{ordinal}",
        total_bytes=vram_total,
        used_bytes=vram_used,
        free_bytes=vram_free,
        driver_reserved_bytes=None,
        architecture=gfx,
        compute_capability=None,
        integrated=integrated,
        memory_pool=pool,
        usable_bytes=usable,
        usable_free_bytes=usable_free,
        gtt_total_bytes=gtt_total,
        gtt_free_bytes=gtt_free,
        pcie_gen_current=link[0],
        pcie_gen_max=link[1],
        pcie_width_current=link[2],
        pcie_width_max=link[3],
        uuid=None,
        pci_bus=pci_bus,
        source=source,
    )


def parse_rocm_smi(text: str) -> list[DeviceFacts]:
    """rocm-smi --showmeminfo vram gtt --showproductname --showbus --json: {"cardN": {...}}.

    rocm-smi may print warning lines before the JSON ("WARNING: AMD GPU device(s) is/are in a
    low-power state"); the JSON starts at the first line that opens with "{" (or "[")."""
    _check_output_size(text, "rocm-smi")
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith(("{", "["))), None)
    if start is None:
        raise GpuFactsError(f"rocm-smi: no JSON in the output; first line: {_first_line(text)}")
    try:
        data = json.loads("\n".join(lines[start:]))
    except ValueError as exc:
        raise GpuFactsError(f"rocm-smi: the output is not JSON ({exc}); first line: {_first_line(text)}") from None
    if not isinstance(data, dict):
        raise GpuFactsError(f"rocm-smi: the JSON is a {type(data).__name__}, not an object of cards")
    cards = sorted(((int(m.group(1)), value) for key, value in data.items() if (m := _CARD_RE.match(key))), key=lambda item: item[0])
    if not cards:
        raise GpuFactsError(f"rocm-smi: no card in the JSON (keys: {', '.join(list(data)[:8]) or 'none'})")
    _check_count(len(cards), "rocm-smi")
    devices = []
    for ordinal, (index, card) in enumerate(cards):
        if not isinstance(card, dict):
            raise GpuFactsError(f"rocm-smi: card{index} is not an object")
        vram_total = _rocm_bytes(card, "VRAM Total Memory (B)", f"card{index}")
        vram_used = _rocm_bytes(card, "VRAM Total Used Memory (B)", f"card{index}")
        gtt_total = _rocm_bytes(card, "GTT Total Memory (B)", f"card{index}")
        gtt_used = _rocm_bytes(card, "GTT Total Used Memory (B)", f"card{index}")
        gfx = str(card.get("GFX Version") or "").strip().lower() or None
        if gfx is not None and not re.match(r"^gfx[0-9a-f]{3,4}$", gfx):
            gfx = None
        series = str(card.get("Card Series") or "").strip()
        name = series if series and series.upper() != "N/A" else str(card.get("Card SKU") or f"AMD GPU card{index}").strip()
        bus = str(card["PCI Bus"]).strip()[:32] if card.get("PCI Bus") else None
        devices.append(_amd_device(index, ordinal, name, gfx, (vram_total, vram_used, gtt_total, gtt_used), "rocm-smi", bus))
    return devices


def query_rocm_smi(run: Runner) -> list[DeviceFacts]:
    rc, out, err = _run(run, list(ROCM_SMI_ARGV), "rocm-smi")
    if rc != 0:
        raise _exit_error("rocm-smi", rc, out, err)
    return parse_rocm_smi(out)


# --- amdgpu sysfs -----------------------------------------------------------------------------

AMD_VENDOR = 0x1002
_CARD_DIR_RE = re.compile(r"^card(\d{1,4})$")
_RENDER_RE = re.compile(r"^renderD(\d{1,4})$")
# current_link_speed "16.0 GT/s PCIe" -> PCIe generation
_GT_PER_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(MAX_SYSFS_FILE_CHARS).strip()
    except OSError:
        return None


def _sysfs_int(path: str, upper: int) -> int | None:
    text = _read(path)
    if text is None or not text:
        return None
    return _bounded_int(text.split()[0], path, "sysfs", upper)


def _link_gen(path: str) -> int | None:
    text = _read(path)
    if not text:
        return None
    number = text.split()[0]
    if number not in _GT_PER_GEN:
        raise GpuFactsError(f"sysfs: {path} reads {text[:40]!r}, not a PCIe rate such as '16.0 GT/s PCIe'")
    return _GT_PER_GEN[number]


def _kfd_targets(root: str) -> dict[int, int]:
    """drm_render_minor -> gfx_target_version, from /sys/class/kfd/kfd/topology/nodes/*/properties."""
    nodes = os.path.join(root, "class", "kfd", "kfd", "topology", "nodes")
    out: dict[int, int] = {}
    try:
        names = sorted(os.listdir(nodes))[: MAX_DEVICES * 4]
    except OSError:
        return out
    for name in names:
        props: dict[str, str] = {}
        for line in (_read(os.path.join(nodes, name, "properties")) or "").splitlines()[:200]:
            parts = line.split(None, 1)
            if len(parts) == 2:
                props[parts[0]] = parts[1].strip()
        minor, version = props.get("drm_render_minor"), props.get("gfx_target_version")
        if minor and version and version != "0":  # the CPU node reports gfx_target_version 0
            out[_bounded_int(minor, "drm_render_minor", "sysfs", 65535)] = _bounded_int(version, "gfx_target_version", "sysfs", 999999)
    return out


def _render_minor(device_dir: str) -> int | None:
    try:
        entries = os.listdir(os.path.join(device_dir, "drm"))
    except OSError:
        return None
    for entry in entries:
        match = _RENDER_RE.match(entry)
        if match:
            return int(match.group(1))
    return None


def amd_sysfs_cards(root: str = "/sys") -> list[tuple[int, str]]:
    """(N, ROOT/class/drm/cardN/device) for every amdgpu card (vendor 0x1002 with mem_info files)."""
    drm = os.path.join(root, "class", "drm")
    try:
        names = os.listdir(drm)
    except OSError:
        return []
    cards = []
    for name in names:
        match = _CARD_DIR_RE.match(name)
        if not match:
            continue  # card0-DP-1 and friends are connectors
        device = os.path.join(drm, name, "device")
        vendor = _read(os.path.join(device, "vendor"))
        if vendor and vendor.lower() == hex(AMD_VENDOR) and os.path.exists(os.path.join(device, "mem_info_vram_total")):
            cards.append((int(match.group(1)), device))
    cards.sort()
    _check_count(len(cards), "sysfs")
    return cards


def parse_amd_sysfs(root: str = "/sys") -> list[DeviceFacts]:
    """The amdgpu driver's own files: ROOT/class/drm/cardN/device/{mem_info_*, *_link_*, vendor,
    device}, the gfx target from ROOT/class/kfd/kfd/topology/nodes/*/properties (matched to the
    card by drm_render_minor). ROOT is /sys on a host, a recorded tree in the tests."""
    cards = amd_sysfs_cards(root)
    if not cards:
        raise GpuFactsError(f"sysfs: no amdgpu card under {os.path.join(root, 'class', 'drm')} (vendor 0x1002 with mem_info_vram_total)")
    targets = _kfd_targets(root)
    devices = []
    for ordinal, (index, device) in enumerate(cards):

        def mem(name: str, device: str = device) -> int | None:
            return _sysfs_int(os.path.join(device, name), MAX_MEMORY_BYTES)

        vram_total, vram_used = mem("mem_info_vram_total"), mem("mem_info_vram_used")
        gtt_total, gtt_used = mem("mem_info_gtt_total"), mem("mem_info_gtt_used")
        minor = _render_minor(device)
        gfx = gfx_from_target_version(targets[minor]) if minor is not None and minor in targets else None
        device_id = (_read(os.path.join(device, "device")) or "").lower()
        product = _read(os.path.join(device, "product_name"))
        name = product or f"AMD {gfx or 'GPU'} [{device_id or 'unknown'}]"
        bus = os.path.basename(os.path.realpath(device))
        link = (
            _link_gen(os.path.join(device, "current_link_speed")),
            _link_gen(os.path.join(device, "max_link_speed")),
            _sysfs_int(os.path.join(device, "current_link_width"), MAX_PCIE_WIDTH),
            _sysfs_int(os.path.join(device, "max_link_width"), MAX_PCIE_WIDTH),
        )
        pci_bus = bus if re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", bus) else None
        devices.append(_amd_device(index, ordinal, name, gfx, (vram_total, vram_used, gtt_total, gtt_used), "sysfs", pci_bus, link))
    return devices


# --- discovery --------------------------------------------------------------------------------

SOURCES = ("auto", "nvidia-smi", "rocm-smi", "sysfs")


def _run(run: Runner, argv: list[str], tool: str) -> tuple[int, str, str]:
    try:
        rc, out, err = run(argv)
    except OSError as exc:
        raise GpuFactsError(f"{tool}: could not run it ({exc.strerror or exc})") from None
    return rc, out or "", err or ""


def _exit_error(tool: str, rc: int, out: str, err: str) -> GpuFactsError:
    return GpuFactsError(f"{tool} exited {rc}: {_first_line(out + chr(10) + err)}")


def discover(
    run: Runner,
    source: str = "auto",
    sysfs_root: str = "/sys",
    which: Callable[[str], str | None] = shutil.which,
) -> list[DeviceFacts]:
    """The host's GPUs. `auto`: NVIDIA through nvidia-smi when it is on PATH, AMD through the
    amdgpu sysfs files when there are amdgpu cards (the kernel's own figures, no ROCm needed),
    else through rocm-smi when it is on PATH; a host with both vendors reports both."""
    if source not in SOURCES:
        raise GpuFactsError(f"source {source!r}: use one of {', '.join(SOURCES)}")
    if source in ("nvidia-smi", "rocm-smi") and not which(source):
        raise GpuFactsError(f"{source}: not found on PATH")
    if source == "nvidia-smi":
        return query_nvidia_smi(run)
    if source == "rocm-smi":
        return query_rocm_smi(run)
    if source == "sysfs":
        return parse_amd_sysfs(sysfs_root)
    devices: list[DeviceFacts] = []
    if which("nvidia-smi"):
        devices += query_nvidia_smi(run)
    if amd_sysfs_cards(sysfs_root):
        devices += parse_amd_sysfs(sysfs_root)
    elif which("rocm-smi"):
        devices += query_rocm_smi(run)
    if not devices and not which("nvidia-smi") and not which("rocm-smi"):
        raise GpuFactsError(f"no GPU tool: neither nvidia-smi nor rocm-smi is on PATH, and no amdgpu card under {os.path.join(sysfs_root, 'class', 'drm')}")
    return devices


def render_devices(devices: list[DeviceFacts]) -> str:
    """A table for the operator: one line per device, sizes in MiB."""

    def mib(value: int | None) -> str:
        return "-" if value is None else f"{value / MIB:,.0f}"

    def link(gen: int | None, width: int | None) -> str:
        return "-" if gen is None and width is None else f"Gen{gen or '?'} x{width or '?'}"

    header = ("backend", "name", "arch", "pool", "usable MiB", "free MiB", "total MiB", "used MiB", "reserved MiB", "GTT MiB", "PCIe now", "PCIe max")
    rows = [header]
    for d in devices:
        rows.append(
            (
                d.backend,
                d.name + (" (integrated)" if d.integrated else ""),
                d.architecture or "?",
                d.memory_pool,
                mib(d.usable_bytes),
                mib(d.usable_free_bytes),
                mib(d.total_bytes),
                mib(d.used_bytes),
                mib(d.driver_reserved_bytes),
                mib(d.gtt_total_bytes),
                link(d.pcie_gen_current, d.pcie_width_current),
                link(d.pcie_gen_max, d.pcie_width_max),
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows)
