"""gpu_facts: recorded nvidia-smi, rocm-smi and sysfs outputs parse to the numbers their sources
print (typed by hand here, see fixtures/gpu_facts/README.md), the free-field and iGPU pool laws,
the fp8 KV rule, and the errors for a missing tool, a failing one and garbage."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.devices.gpu_facts import (
    NVIDIA_FIELDS,
    GpuFactsError,
    budget_devices,
    discover,
    gfx_from_target_version,
    kv_dtype_support,
    kv_dtype_supported,
    parse_amd_sysfs,
    parse_nvidia_smi,
    parse_rocm_smi,
    query_nvidia_smi,
    render_devices,
    sm_arch,
)

FIXTURES = Path(__file__).parent / "fixtures" / "gpu_facts"
MIB = 1 << 20
GIB = 1 << 30


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def no_tools(_name: str) -> None:
    return None


def all_tools(name: str) -> str:
    return f"/usr/bin/{name}"


# --- NVIDIA -----------------------------------------------------------------------------------


def test_rtx3090_seed_boot_and_the_free_field_law():
    (card,) = parse_nvidia_smi(fixture("rtx3090_sm86.csv"))
    assert card.name == "NVIDIA GeForce RTX 3090"
    assert card.backend == "CUDA0"
    assert card.vendor == "nvidia"
    assert card.total_bytes == 24_576 * MIB
    assert card.used_bytes == 21_436 * MIB
    assert card.free_bytes == 2_689 * MIB
    # seed 004: "nvidia-smi free-field law (driver holds ~450 MiB the subtraction hides)"
    assert card.total_bytes - card.used_bytes != card.free_bytes
    assert card.driver_reserved_bytes == 451 * MIB
    assert card.architecture == "sm_86"
    assert card.compute_capability == "8.6"
    assert (card.pcie_gen_current, card.pcie_gen_max, card.pcie_width_current, card.pcie_width_max) == (None, 4, 16, 16)
    assert card.usable_bytes == 24_576 * MIB and card.memory_pool == "vram" and not card.integrated
    assert card.budget_device() == {"name": "cuda0", "memory": 24_576 * MIB, "arch": "sm_86"}


def test_h100_full_query_reports_its_own_reserve():
    (card,) = parse_nvidia_smi(fixture("h100_sm90.csv"))
    assert card.name == "NVIDIA H100 80GB HBM3"
    assert card.uuid == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
    assert card.total_bytes == 81_559 * MIB
    assert card.used_bytes == 1 * MIB
    assert card.free_bytes == 81_106 * MIB
    assert card.driver_reserved_bytes == 454 * MIB  # memory.reserved, not the subtraction (452)
    # The law holds within nvidia-smi's MiB rounding: 81,559 - 1 - 81,106 = 452 against 454 reported.
    assert abs((card.total_bytes - card.used_bytes - card.free_bytes) - card.driver_reserved_bytes) <= 2 * MIB
    assert card.architecture == "sm_90"
    assert (card.pcie_gen_current, card.pcie_gen_max, card.pcie_width_current, card.pcie_width_max) == (5, 5, 16, 16)


def test_unified_memory_card_answers_na_and_cannot_be_priced():
    (card,) = parse_nvidia_smi(fixture("gb10_unified_na.csv"), ("index", "name", "memory.total", "memory.used", "memory.free"))
    assert card.name == "NVIDIA GB10"
    assert card.total_bytes is None and card.used_bytes is None and card.free_bytes is None
    assert card.driver_reserved_bytes is None and card.architecture is None
    with pytest.raises(GpuFactsError, match="CUDA0 \\(NVIDIA GB10\\): nvidia-smi reports no memory size"):
        card.budget_device()


def test_not_supported_cells_are_none():
    row = "1, NVIDIA GeForce RTX 3090, [Not Supported], 24576, 100, 24000, [N/A], 8.6, [N/A], [N/A], [Not Supported], [N/A]\n"
    (card,) = parse_nvidia_smi(row)
    assert card.index == 1 and card.uuid is None
    assert card.driver_reserved_bytes == 476 * MIB  # [N/A] memory.reserved falls back to the subtraction
    assert card.pcie_gen_current is None and card.pcie_width_max is None


def test_an_older_driver_drops_the_fields_it_does_not_know():
    asked: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        asked.append(argv)
        query = argv[1].removeprefix("--query-gpu=").split(",")
        for field in ("memory.reserved", "compute_cap"):
            if field in query:
                return 2, f'Field "{field}" is not a valid field to query.\n\n', ""
        return 0, "0, NVIDIA GeForce RTX 3090, GPU-x, 24576, 21436, 2689, 4, 4, 16, 16\n", ""

    (card,) = query_nvidia_smi(run)
    assert len(asked) == 3
    assert asked[0] == ["nvidia-smi", "--query-gpu=" + ",".join(NVIDIA_FIELDS), "--format=csv,noheader,nounits"]
    assert "memory.reserved" not in asked[2][1] and "compute_cap" not in asked[2][1]
    assert card.driver_reserved_bytes == 451 * MIB
    assert card.architecture is None
    assert kv_dtype_supported("fp8", card.architecture) is None


def test_a_refused_required_field_is_an_error_not_a_retry():
    def run(_argv: list[str]) -> tuple[int, str, str]:
        return 2, 'Field "memory.total" is not a valid field to query.\n', ""

    with pytest.raises(GpuFactsError, match='^nvidia-smi exited 2: Field "memory.total" is not a valid field to query.$'):
        query_nvidia_smi(run)


def test_nvidia_smi_failing_names_tool_rc_and_first_line():
    def run(_argv: list[str]) -> tuple[int, str, str]:
        return 9, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\nMake sure ...\n"

    with pytest.raises(GpuFactsError) as caught:
        discover(run, "nvidia-smi", which=all_tools)
    assert str(caught.value) == "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Failed to initialize NVML: Driver/library version mismatch\n", "row 1 has 1 fields, the query asked for 12"),
        ("0, RTX, x, lots, 1, 1, 1, 8.6, 4, 4, 16, 16\n", "memory.total is 'lots', not a whole number"),
        ("0, RTX, x, 99999999999999, 1, 1, 1, 8.6, 4, 4, 16, 16\n", "memory.total 99999999999999 is out of range"),
        ("0, RTX, x, 100, 1, 1, 1, 8.6, 99, 4, 16, 16\n", "pcie.link.gen.current 99 is out of range"),
        ("0, RTX, x, 100, 90, 20, [N/A], 8.6, 4, 4, 16, 16\n", "used 94371840 \\+ free 20971520 exceed total 104857600"),
        ("0, RTX, x, 100, 1, 1, 1, eight, 4, 4, 16, 16\n", "compute_cap 'eight' is not MAJOR.MINOR"),
        ("", "no GPU rows"),
        ("0, RTX, x, 100, 1, 1, 1, 8.6, 4, 4, 16, 16\n" * 65, "65 devices; at most 64"),
    ],
)
def test_nvidia_garbage_is_a_clear_error(text, message):
    with pytest.raises(GpuFactsError, match=message):
        parse_nvidia_smi(text)


# --- AMD: rocm-smi ----------------------------------------------------------------------------


def test_r9700_rocm_smi_with_the_integrated_raphael_beside_it():
    r9700, raphael = parse_rocm_smi(fixture("r9700_gfx1201_rocm_smi.json"))
    assert r9700.name == "AMD Radeon AI PRO R9700"
    assert r9700.backend == "ROCm0" and r9700.index == 0 and r9700.vendor == "amd"
    assert r9700.total_bytes == 34_208_743_424
    assert r9700.used_bytes == 889_229_312
    assert r9700.free_bytes == 33_319_514_112
    assert r9700.architecture == "gfx1201"
    assert not r9700.integrated and r9700.memory_pool == "vram" and r9700.usable_bytes == 34_208_743_424
    assert r9700.driver_reserved_bytes is None and r9700.gtt_total_bytes is None
    assert raphael.name == "AMD Ryzen 9 9950X3D 16-Core Processor"
    assert raphael.backend == "ROCm1" and raphael.architecture == "gfx1036" and raphael.integrated
    assert raphael.total_bytes == 2_147_483_648  # no GTT figure in this output: the carve-out is all there is
    assert raphael.usable_bytes == 2_147_483_648 and raphael.memory_pool == "vram"


def test_strix_halo_rocm_smi_skips_the_warning_and_prices_a_large_carve_out():
    (halo,) = parse_rocm_smi(fixture("strix_halo_gfx1151_rocm_smi.json"))
    assert halo.name == "AMD Radeon Graphics"
    assert halo.architecture == "gfx1151" and halo.integrated
    assert halo.total_bytes == 103_079_215_104  # 96 GiB: the BIOS gave the carve-out most of memory
    assert halo.used_bytes == 249_303_040
    assert halo.memory_pool == "vram" and halo.usable_bytes == 103_079_215_104
    assert halo.usable_free_bytes == 102_829_912_064


def test_rx7900xt_rocm_smi():
    (card,) = parse_rocm_smi(fixture("rx7900xt_gfx1100_rocm_smi.json"))
    assert (card.name, card.architecture, card.total_bytes, card.used_bytes) == ("Radeon RX 7900 XT", "gfx1100", 21_458_059_264, 27_856_896)
    assert not card.integrated


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ERROR: GPU[0] : Unable to get GPU memory use.\n", "no JSON in the output; first line: ERROR: GPU\\[0\\] : Unable to get GPU memory use."),
        ('{"card0": {"VRAM Total Memory (B)": "12"', "the output is not JSON"),
        ('{"system": {"Driver version": "6.17.0"}}', "no card in the JSON \\(keys: system\\)"),
        ('{"card0": {"VRAM Total Memory (B)": "-5"}}', "card0 'VRAM Total Memory \\(B\\)' -5 is out of range"),
        ("[1, 2]", "the JSON is a list"),
    ],
)
def test_rocm_smi_garbage_is_a_clear_error(text, message):
    with pytest.raises(GpuFactsError, match=f"^rocm-smi: {message}"):
        parse_rocm_smi(text)


# --- AMD: sysfs -------------------------------------------------------------------------------


def test_strix_halo_sysfs_prices_the_gtt_pool():
    (halo,) = parse_amd_sysfs(str(FIXTURES / "strix_halo_gfx1151_sysfs"))
    assert halo.index == 1 and halo.backend == "ROCm0"  # card1-eDP-1 is a connector, not a card
    assert halo.name == "AMD gfx1151 [0x1586]"
    assert halo.architecture == "gfx1151" and halo.integrated
    assert halo.total_bytes == 4_294_967_296 and halo.used_bytes == 155_123_712
    assert halo.gtt_total_bytes == 103_079_215_104
    assert halo.gtt_free_bytes == 81_604_378_624
    # iGPU pool law: a 4 GiB carve-out beside 96 GiB of GTT; the engine allocates from GTT, and the
    # device is priced on that pool alone, never on the sum (105 GiB).
    assert halo.memory_pool == "gtt"
    assert halo.usable_bytes == 96 * GIB
    assert halo.usable_free_bytes == 81_604_378_624
    assert halo.pcie_gen_current is None and halo.pcie_width_current is None
    assert halo.budget_device() == {"name": "rocm0", "memory": 103_079_215_104, "arch": "gfx1151"}


def test_r9700_sysfs_pair_and_the_x1_link():
    first, second = parse_amd_sysfs(str(FIXTURES / "r9700_gfx1201_sysfs"))
    assert (first.backend, second.backend) == ("ROCm0", "ROCm1")
    assert first.architecture == second.architecture == "gfx1201"
    assert first.total_bytes == second.total_bytes == 34_208_743_424
    assert first.free_bytes == 33_319_514_112 and second.free_bytes == 33_120_321_536
    assert first.memory_pool == "vram" and not first.integrated and first.gtt_total_bytes == 33_252_196_352
    assert (first.pcie_gen_current, first.pcie_width_current, first.pcie_gen_max, first.pcie_width_max) == (4, 16, 4, 16)
    assert (second.pcie_gen_current, second.pcie_width_current, second.pcie_gen_max, second.pcie_width_max) == (4, 1, 4, 16)
    assert budget_devices([first, second]) == [
        {"name": "rocm0", "memory": 34_208_743_424, "arch": "gfx1201"},
        {"name": "rocm1", "memory": 34_208_743_424, "arch": "gfx1201"},
    ]


def test_sysfs_garbage_and_absence(tmp_path):
    with pytest.raises(GpuFactsError, match="^sysfs: no amdgpu card under"):
        parse_amd_sysfs(str(tmp_path))
    device = tmp_path / "class" / "drm" / "card0" / "device"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x1002\n")
    (device / "mem_info_vram_total").write_text("a lot\n")
    with pytest.raises(GpuFactsError, match="is 'a', not a whole number"):
        parse_amd_sysfs(str(tmp_path))
    (device / "mem_info_vram_total").write_text("1024\n")
    (device / "current_link_speed").write_text("fast\n")
    with pytest.raises(GpuFactsError, match="not a PCIe rate"):
        parse_amd_sysfs(str(tmp_path))


@pytest.mark.parametrize(("version", "target"), [(110501, "gfx1151"), (120001, "gfx1201"), (90010, "gfx90a"), (90402, "gfx942"), (110000, "gfx1100")])
def test_gfx_target_version(version, target):
    assert gfx_from_target_version(version) == target


@pytest.mark.parametrize(("cap", "arch"), [("8.6", "sm_86"), ("8.9", "sm_89"), ("9.0", "sm_90"), ("10.0", "sm_100"), ("12.0", "sm_120")])
def test_compute_capability_to_sm(cap, arch):
    assert sm_arch(cap) == arch


# --- the fp8 KV rule --------------------------------------------------------------------------


def test_fp8_refused_on_the_3090_accepted_on_the_h100():
    (rtx3090,) = parse_nvidia_smi(fixture("rtx3090_sm86.csv"))
    (h100,) = parse_nvidia_smi(fixture("h100_sm90.csv"))
    refused = kv_dtype_support("fp8", rtx3090.architecture)
    assert refused.supported is False and "sm_86" in refused.reason and "8.9" in refused.reason
    assert kv_dtype_supported("fp8", h100.architecture) is True
    assert kv_dtype_supported("fp8_e5m2", rtx3090.architecture) is False
    assert kv_dtype_supported("bf16", rtx3090.architecture) is True


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("sm_80", False),
        ("sm_89", True),
        ("sm_120", True),
        ("gfx1201", True),  # RDNA4
        ("gfx1200", True),
        ("gfx942", True),  # MI300
        ("gfx950", True),
        ("gfx1151", False),  # Strix Halo: neither CDNA3+ nor RDNA4
        ("gfx1100", False),
        ("gfx90a", False),
        (None, None),
        ("tpu_v5", None),
    ],
)
def test_fp8_rule_per_architecture(arch, expected):
    assert kv_dtype_supported("fp8", arch) is expected


# --- discovery --------------------------------------------------------------------------------


def test_no_gpu_tool_is_a_clear_error(tmp_path):
    def run(argv: list[str]) -> tuple[int, str, str]:
        raise AssertionError(f"nothing should run: {argv}")

    with pytest.raises(GpuFactsError, match="^no GPU tool: neither nvidia-smi nor rocm-smi is on PATH, and no amdgpu card under"):
        discover(run, "auto", sysfs_root=str(tmp_path), which=no_tools)
    with pytest.raises(GpuFactsError, match="^rocm-smi: not found on PATH$"):
        discover(run, "rocm-smi", which=no_tools)
    with pytest.raises(GpuFactsError, match="^source 'cuda': use one of auto, nvidia-smi, rocm-smi, sysfs$"):
        discover(run, "cuda", which=no_tools)


def test_a_tool_that_cannot_start_is_a_clear_error():
    def run(_argv: list[str]) -> tuple[int, str, str]:
        raise PermissionError(13, "Permission denied")

    with pytest.raises(GpuFactsError, match="^rocm-smi: could not run it \\(Permission denied\\)$"):
        discover(run, "rocm-smi", which=all_tools)


def test_auto_reports_both_vendors_on_a_mixed_host():
    # dankclaw: the 3090 beside the Strix Halo iGPU.
    def run(argv: list[str]) -> tuple[int, str, str]:
        assert argv[0] == "nvidia-smi"
        return 0, fixture("rtx3090_sm86.csv"), ""

    def which(name: str) -> str | None:
        return "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None

    devices = discover(run, "auto", sysfs_root=str(FIXTURES / "strix_halo_gfx1151_sysfs"), which=which)
    assert [(d.backend, d.architecture, d.memory_pool) for d in devices] == [("CUDA0", "sm_86", "vram"), ("ROCm0", "gfx1151", "gtt")]
    table = render_devices(devices).splitlines()
    assert table[0].split()[:4] == ["backend", "name", "arch", "pool"]
    cells = [cell.strip() for cell in table[2].split("  ") if cell.strip()]
    assert cells[:6] == ["ROCm0", "AMD gfx1151 [0x1586] (integrated)", "gfx1151", "gtt", "98,304", "77,824"]  # the GTT pool, in MiB


def test_cli_devices_parses_a_recorded_output(capsys):
    from ansible_collections.frank.llm_fleet.plugins.plugin_utils.cli import main

    assert main(["devices", "--from", str(FIXTURES / "strix_halo_gfx1151_sysfs"), "--tool", "sysfs-dir", "--budget-yaml"]) == 0
    assert capsys.readouterr().out == "endpoint_devices:\n- name: rocm0\n  memory: 103079215104\n  arch: gfx1151\n"
    assert main(["devices", "--from", str(FIXTURES / "rtx3090_sm86.csv"), "--tool", "rocm-smi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-fleet devices: rocm-smi: no JSON in the output; first line: index, name, memory.total [MiB], memory.used [MiB]")
