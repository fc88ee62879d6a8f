"""The production inventory launches what the fleet ran (expected argv written by hand from the
seeds) and every endpoint's budget check runs on the controller, contacting no host."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import engine_argv, engine_environment, price_shape

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def host_vars(endpoint):
    return yaml.safe_load((ROOT / "inventories" / "production" / "host_vars" / f"{endpoint}.yml").read_text())


def test_archon_runs_the_radiance_3_x_200000_fp8_shape():
    # Seed 004: "the deployed 3 x 200,000 fp8 shape", "the shipped pair 25600/5120" (the KV half is
    # the pool per card); radiance takes its vLLM parent's flags.
    assert engine_argv(host_vars("frank-archon")["endpoint_shape"], "/models") == [
        "--model", "/models/qwen38-iq4r.rad",
        "--served-model-name", "frank-archon",
        "--host", "0.0.0.0", "--port", "7770",
        "--middleware", "llm_fleet_vllm_key_guard.KeyGuard",
        "--max-model-len", "200000",
        "--max-num-seqs", "3",
        "--kv-cache-dtype", "fp8",
        "--kv-cache-memory-bytes", str(5120 * 2**20),
        "--tensor-parallel-size", "2",
        "--gpu-memory-utilization", "0.9",
    ]  # fmt: skip


def test_archon_ledger_is_the_engine_budget_table():
    # Seed 004: "card 32,624 MiB, pair at 29,120 settling 2,058 MiB free against its 209.19 MiB
    # floor => 30,969 claimable"; the capacity contract "3 x 199,984-token prompts accepted".
    data = host_vars("frank-archon")
    result = price_shape(data["endpoint_shape"], data["endpoint_devices"])
    assert result.fits
    assert result.kv["claimable_mib"] == 30969 and result.kv["pair_mib"] == 30720
    assert result.kv["contract_tokens"] == 600000


def test_dragoon_runs_halogen_by_environment_at_200704():
    # Seed 004: "HALOGEN_CTX and HALOGEN_KV_POOL_POSITIONS both 262144 -> 200704", "SPEC_ADAPT=0",
    # the tokenizer directory "mounted whole at /tokenizer".
    shape = host_vars("frank-dragoon")["endpoint_shape"]
    assert engine_environment(shape, "/models") == {
        "HALOGEN_CTX": "200704",
        "HALOGEN_KV_POOL_POSITIONS": "200704",
        "HALOGEN_TOKENIZER": "/models/tokenizer",
        "SPEC_ADAPT": "0",
        # Placeholder names (docs/vram_budget.md "halogen"): the LAN bind, the port and the id.
        "HALOGEN_HOST": "0.0.0.0",
        "HALOGEN_PORT": "7770",
        "HALOGEN_SERVED_ID": "frank-dragoon",
    }
    assert engine_argv(shape, "/models", container=True) == []


def test_dragoon_ledger_is_the_200704_boot():
    # Seed 004: "The 200,704 boot printed 5.5 GiB reserved and 74.1 GiB in all".
    data = host_vars("frank-dragoon")
    result = price_shape(data["endpoint_shape"], data["endpoint_devices"])
    assert result.fits
    assert (result.kv["reserved_gib"], result.kv["total_gib"]) == (5.5, 74.1)
    assert result.client["context_window"] == 155648 and result.client["max_tokens"] == 45056


def test_secondary_runs_the_9b_two_window_shape_with_the_verbosity_4_ledger():
    # Seed 004: "--ctx-size 401408 --parallel 2 (two 200,704 windows), f16 K + f16 V ... verbosity 4",
    # "Deploy verified: ... at ubatch 2048"; seed 003: "FLASH_ATTN=on".
    assert engine_argv(host_vars("frank-zealot")["endpoint_shape"], "/srv/models/frank-zealot") == [
        "/usr/bin/llama-server",
        "--model", "/srv/models/frank-zealot/model.gguf",
        "--alias", "frank-zealot",
        "--host", "0.0.0.0", "--port", "7771",
        "--ctx-size", "401408",
        "--parallel", "2",
        "--cache-type-k", "f16", "--cache-type-v", "f16",
        "--flash-attn", "on",
        "--n-gpu-layers", "999",
        "--ubatch-size", "2048",
        "--mmproj", "/srv/models/frank-zealot/mmproj.gguf",
        "--jinja",
        "--log-verbosity", "4",
        "--metrics",
    ]  # fmt: skip


def test_the_secondary_ledger_lands_near_the_measured_boot():
    # Seed 004: "Deploy verified: nvidia-smi 21,436 MiB used / 2,689 free at ubatch 2048" and the
    # KV buffer "12,544.00 MiB".
    data = host_vars("frank-zealot")
    result = price_shape(data["endpoint_shape"], data["endpoint_devices"])
    assert result.fits
    kv = next(t for t in result.devices[0].terms if t.name == "kv")
    assert kv.bytes == 12_544 * 2**20
    assert abs(result.devices[0].used / 2**20 - 21_436) < 1_024  # weights are the seed's "~7 GiB"


def test_a_cold_boot_is_not_rolled_back_by_the_health_gate():
    # Seed 004: "boot healthy in 420 s" warm and "~184 s of inductor/AOT build per restart" cold;
    # seed 000: "each attempt ~6.7 min". The gate must wait longer than a healthy cold boot.
    assert host_vars("frank-archon")["endpoint_health_timeout"] >= 420 + 184
    assert host_vars("frank-dragoon")["endpoint_health_timeout"] >= 1800


@pytest.mark.parametrize(
    ("playbook", "endpoint"), [("deploy-primary.yml", "frank-archon"), ("deploy-secondary.yml", "frank-zealot"), ("deploy-large.yml", "frank-dragoon")]
)
def test_each_role_s_budget_check_prices_its_endpoint_on_the_controller(playbook, endpoint):
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
    argv = [str(BIN / "ansible-playbook"), f"playbooks/{playbook}", "-i", "inventories/production", "--check", "--tags", "budget"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"{endpoint} -> localhost" in proc.stdout and "fits: yes" in proc.stdout
