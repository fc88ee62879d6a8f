"""The production inventory launches what the fleet ran (expected argv written by hand from the
seeds) and every endpoint's budget check runs on the controller, contacting no host."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import engine_argv, price_shape

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def host_vars(endpoint):
    return yaml.safe_load((ROOT / "inventories" / "production" / "host_vars" / f"{endpoint}.yml").read_text())


def test_primary_runs_the_1ac4d48_shape_with_the_fork_flags():
    # Seed 004 "Shape: MAXLEN 200704, SEQS 3 ... KV_BYTES 3.15e9/rank ... MNBT 1024" and "Live after
    # the 1ac4d48 deploy: 'expert_precise_memory': True"; seed 000 "--default-chat-template-kwargs
    # enables enable_thinking + preserve_thinking", "--enable-expert-offload --expert-precise-memory".
    assert engine_argv(host_vars("frank-primary")["endpoint_shape"], "/models") == [
        "--model", "/models",
        "--served-model-name", "frank-primary",
        "--host", "0.0.0.0", "--port", "7770",
        "--max-model-len", "200704",
        "--max-num-seqs", "3",
        "--kv-cache-dtype", "fp8",
        "--kv-cache-memory-bytes", "3150000000",
        "--max-num-batched-tokens", "1024",
        "--tensor-parallel-size", "2",
        "--gpu-memory-utilization", "0.98",
        "--enable-prefix-caching",
        "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_xml",
        "--reasoning-parser", "qwen3",
        "--default-chat-template-kwargs", '{"enable_thinking":true,"preserve_thinking":true}',
        "--enable-expert-offload",
        "--expert-precise-memory",
    ]  # fmt: skip


def test_secondary_runs_the_9b_two_window_shape_with_the_verbosity_4_ledger():
    # Seed 004: "--ctx-size 401408 --parallel 2 (two 200,704 windows), f16 K + f16 V ... verbosity 4",
    # "Deploy verified: ... at ubatch 2048"; seed 003: "FLASH_ATTN=on".
    assert engine_argv(host_vars("frank-secondary")["endpoint_shape"], "/srv/models/frank-secondary") == [
        "/usr/bin/llama-server",
        "--model", "/srv/models/frank-secondary/model.gguf",
        "--alias", "frank-secondary",
        "--host", "0.0.0.0", "--port", "7771",
        "--ctx-size", "401408",
        "--parallel", "2",
        "--cache-type-k", "f16", "--cache-type-v", "f16",
        "--flash-attn", "on",
        "--n-gpu-layers", "999",
        "--ubatch-size", "2048",
        "--mmproj", "/srv/models/frank-secondary/mmproj.gguf",
        "--jinja",
        "--log-verbosity", "4",
        "--metrics",
    ]  # fmt: skip


def test_large_runs_the_b11030_mtp_shape_with_its_template():
    # Seed 001: "One conversation, 200,000 ctx, PARALLEL_SLOTS=1", "--spec-type draft-mtp
    # --spec-draft-n-max 2, --jinja, preserve_thinking", "Wiring in --chat-template-file".
    assert engine_argv(host_vars("frank-large")["endpoint_shape"], "/srv/models/frank-large") == [
        "/usr/bin/llama-server",
        "--model", "/srv/models/frank-large/UD-IQ4_XS/model-00001-of-00003.gguf",
        "--alias", "frank-large",
        "--host", "0.0.0.0", "--port", "7770",
        "--ctx-size", "200000",
        "--parallel", "1",
        "--cache-type-k", "f16", "--cache-type-v", "f16",
        "--n-gpu-layers", "999",
        "--ubatch-size", "512",
        "--spec-type", "draft-mtp",
        "--model-draft", "/srv/models/frank-large/mtp/mtp-shared-Q8_0.gguf",
        "--spec-draft-n-max", "2",
        "--jinja",
        "--chat-template-file", "/srv/models/frank-large/chat_template.jinja",
        "--chat-template-kwargs", '{"preserve_thinking":true}',
        "--log-verbosity", "4",
        "--metrics",
    ]  # fmt: skip


def test_the_secondary_ledger_lands_near_the_measured_boot():
    # Seed 004: "Deploy verified: nvidia-smi 21,436 MiB used / 2,689 free at ubatch 2048" and the
    # KV buffer "12,544.00 MiB".
    data = host_vars("frank-secondary")
    result = price_shape(data["endpoint_shape"], data["endpoint_devices"])
    assert result.fits
    kv = next(t for t in result.devices[0].terms if t.name == "kv")
    assert kv.bytes == 12_544 * 2**20
    assert abs(result.devices[0].used / 2**20 - 21_436) < 1_024  # weights are the seed's "~7 GiB"


def test_a_cold_boot_is_not_rolled_back_by_the_health_gate():
    # Seed 004: "boot healthy in 420 s" warm and "~184 s of inductor/AOT build per restart" cold;
    # seed 000: "each attempt ~6.7 min". The gate must wait longer than a healthy cold boot.
    assert host_vars("frank-primary")["endpoint_health_timeout"] >= 420 + 184
    assert host_vars("frank-large")["endpoint_health_timeout"] >= 1800


@pytest.mark.parametrize(("playbook", "endpoint"), [("deploy-secondary.yml", "frank-secondary"), ("deploy-large.yml", "frank-large")])
def test_the_llamacpp_budget_checks_price_on_the_controller(playbook, endpoint):
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
    argv = [str(BIN / "ansible-playbook"), f"playbooks/{playbook}", "-i", "inventories/production", "--check", "--tags", "budget"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"{endpoint} -> localhost" in proc.stdout and "fits: yes" in proc.stdout
