"""The lab stand-in engines (lab/stand-ins/standin_engine.py) run here as real processes, configured
exactly as the halogen and radiance drivers render the lab-standins inventory's shapes: their boot
lines must read back through the drivers' parsers into the figures the drivers price, they refuse
what the real engines refuse, and their oversized-prompt refusal reads back through the capacity
probe's parser. Also: the image pin, and the placeholder digest the deploy refuses."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.podman_engine import EngineContainer, EngineError
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import window_from_refusal
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import compare_boot, engine_argv, engine_environment, parse_boot_log

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "lab" / "stand-ins" / "standin_engine.py"
STANDINS = ROOT / "inventories" / "lab-standins"


def host_vars(name: str, inventory: Path = STANDINS) -> dict:
    return yaml.safe_load((inventory / "host_vars" / f"{name}.yml").read_text())


@pytest.fixture(scope="module")
def payloads(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models")
    subprocess.run([sys.executable, str(ROOT / "lab" / "stand-ins" / "make_standin_payloads.py"), "--out-dir", str(out)], check=True, capture_output=True)
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_engine(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the stand-in to its end (a configuration it refuses exits at boot)."""
    return subprocess.run([sys.executable, str(ENGINE), *argv], env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=9, check=False)


def start(argv: list[str], env: dict[str, str], port: int) -> tuple[subprocess.Popen, list[str]]:
    """Start the stand-in; wait until it serves /health; return it and its boot lines."""
    command = [sys.executable, str(ENGINE), *argv]
    proc = subprocess.Popen(command, env={"PATH": os.environ["PATH"], **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if " stand-in serving " in line:
            break
    else:
        pytest.fail(f"the stand-in exited {proc.wait()} before serving: {lines}")
    assert json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read())["status"] == "ok"
    return proc, lines


def halogen(payloads: Path, port: int, **changes) -> tuple[dict, dict[str, str]]:
    shape = {**host_vars("standin-dragoon")["endpoint_shape"], "port": port, "served_id": "standin-dragoon", **changes}
    return shape, engine_environment(shape, str(payloads / "standin-halogen"))


def chat(port: int, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=10).read())


def refused(port: int, body: dict) -> ApiError:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    payload = json.loads(info.value.read())
    return ApiError(payload["error"]["message"], info.value.code, payload)


def test_the_image_pins_the_engine_source_it_copies():
    pin = re.search(r"^STANDIN_SHA256=([0-9a-f]{64})$", (ROOT / "lab" / "images" / "engine-standin.sh").read_text(), re.M)
    assert pin, "lab/images/engine-standin.sh has no STANDIN_SHA256"
    assert pin.group(1) == hashlib.sha256(ENGINE.read_bytes()).hexdigest(), "standin_engine.py changed: update STANDIN_SHA256 (the image's tag follows it)"


def test_halogen_stand_in_boots_as_the_driver_prices_it_and_refuses_past_the_window(payloads):
    port = free_port()
    shape, env = halogen(payloads, port)
    proc, lines = start(["halogen"], env, port)
    try:
        ledger = parse_boot_log("\n".join(lines), "halogen").as_dict()
        # The boot ledger in the engine's own wording: 16,384 positions x 26 KiB = 416 MiB.
        assert ledger["facts"]["halogen_pool_positions"] == 16384 and ledger["facts"]["halogen_pool_mib"] == 416.0
        verdict = compare_boot({"ledger": ledger, "shape": shape}, [])
        assert verdict["agree"] is True, verdict
        models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read())
        assert [m["id"] for m in models["data"]] == ["standin-dragoon"]
        answer = chat(port, {"model": "standin-dragoon", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
        assert answer["model"] == "standin-dragoon" and answer["choices"][0]["message"]["reasoning_content"]
        # 10,000 words against HALOGEN_CTX 8192: refused naming the window and the 1,808 overage.
        started = time.monotonic()
        error = refused(port, {"model": "standin-dragoon", "messages": [{"role": "user", "content": "w " * 10000}]})
        assert error.status == 400 and time.monotonic() - started < 1.0
        assert window_from_refusal(error) == (8192, 10000), str(error)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("changes", "fatal"),
    [
        ({"kv_pool_positions": 16385}, r"HALOGEN_KV_POOL_POSITIONS=16385 outside ctx <= pool <= slots \* ctx"),
        ({"kv_pool_positions": 4096}, r"HALOGEN_KV_POOL_POSITIONS=4096 outside"),
        ({"tokenizer_dir": "tokenizer-absent"}, r"HALOGEN_TOKENIZER=.*tokenizer-absent: no such directory"),
    ],
)
def test_halogen_stand_in_refuses_what_flash_server_refuses(payloads, changes, fatal):
    port = free_port()
    shape = {**host_vars("standin-dragoon")["endpoint_shape"], "port": port}
    env = engine_environment({**shape, "kv_pool_positions": 16384}, str(payloads / "standin-halogen"))
    # The driver refuses the pool outside the law itself, so the variables go to the engine directly.
    if "kv_pool_positions" in changes:
        env["HALOGEN_KV_POOL_POSITIONS"] = str(changes["kv_pool_positions"])
    else:
        env = engine_environment({**shape, **changes}, str(payloads / "standin-halogen"))
    proc = run_engine(["halogen"], env)
    assert proc.returncode == 1 and re.search(fatal, proc.stderr), proc.stderr


def test_halogen_stand_in_refuses_a_tokenizer_directory_holding_a_symlink(tmp_path, payloads):
    copy = tmp_path / "standin-halogen"
    subprocess.run(["cp", "-r", str(payloads / "standin-halogen"), str(copy)], check=True)
    (copy / "tokenizer" / "vocab.json").unlink()
    (copy / "tokenizer" / "vocab.json").symlink_to("../../snapshots/vocab.json")
    _shape, env = halogen(tmp_path, free_port())
    proc = run_engine(["halogen"], env)
    assert proc.returncode == 1 and "vocab.json is a symlink" in proc.stderr, proc.stderr


def test_radiance_stand_in_takes_the_driver_argv_echoes_the_name_and_answers_in_reasoning(payloads):
    port = free_port()
    shape = {**host_vars("standin-archon")["endpoint_shape"], "port": port, "served_id": "standin-archon"}
    argv = engine_argv(shape, str(payloads / "standin-radiance"), container=True)
    proc, lines = start(["radiance", *argv], {}, port)
    try:
        ledger = parse_boot_log("\n".join(lines), "radiance").as_dict()
        # The stand-in's table: card 2,048, pair 512 + 64, fixed 256 => 1,216 free, 1,728 claimable.
        assert ledger["facts"]["radiance_claimable_mib"] == 1728.0 and ledger["facts"]["radiance_pool_tokens"] == 32768
        verdict = compare_boot({"ledger": ledger, "shape": shape}, [])
        assert verdict["agree"] is True, verdict
        answer = chat(port, {"model": "another-name", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
        message = answer["choices"][0]["message"]
        # "radiance echoes the requested name": only /v1/models says what is served.
        assert answer["model"] == "another-name" and message["content"] == "" and message["reasoning_content"]
        models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read())
        assert [m["id"] for m in models["data"]] == ["standin-archon"]
        error = refused(port, {"model": "standin-archon", "messages": [{"role": "user", "content": "w " * 5000}]})
        assert window_from_refusal(error) == (4096, 5000), str(error)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("flags", "fatal"),
    [
        (["--kv-cache-dtype", "fp8_e5m2"], "only bf16|fp8, no K/V split"),
        (["--kv-cache-memory-bytes", str(4 << 20)], "under one 4,096-token window"),
    ],
)
def test_radiance_stand_in_refuses_what_the_engine_refuses(payloads, flags, fatal):
    shape = {**host_vars("standin-archon")["endpoint_shape"], "port": free_port(), "served_id": "standin-archon"}
    argv = engine_argv(shape, str(payloads / "standin-radiance"), container=True)
    index = argv.index(flags[0])
    argv[index + 1] = flags[1]
    proc = run_engine(["radiance", *argv], {})
    assert proc.returncode == 1 and fatal in proc.stderr, proc.stderr


@pytest.mark.parametrize("digest", ["sha256:" + "0" * 64, "sha256:" + "f" * 64, "sha256:" + "0123456789abcdef" * 4])
def test_a_placeholder_digest_is_refused_naming_the_variable(digest):
    engine = EngineContainer(name="frank-dragoon", image="registry.local/halogen-flash-server:0.16.2", digest=digest)
    with pytest.raises(EngineError, match=r"digest: .* is a placeholder.*endpoint_image_digest"):
        engine.validate()


def test_a_production_placeholder_digest_is_marked_as_one_and_refused():
    # The seeds give no image digest: until one is pinned, its line says PLACEHOLDER and a deploy
    # refuses it before the host changes.
    for name in ("frank-archon", "frank-dragoon", "frank-zealot"):
        text = (ROOT / "inventories" / "production" / "host_vars" / f"{name}.yml").read_text()
        data = yaml.safe_load(text)
        if "endpoint_image_digest" not in data:
            continue
        engine = EngineContainer(name=name, image=data["endpoint_image"], digest=data["endpoint_image_digest"])
        try:
            engine.validate()
        except EngineError as exc:
            assert "placeholder" in str(exc)
            line = next(line for line in text.splitlines() if line.startswith("endpoint_image_digest:"))
            assert "PLACEHOLDER" in line, f"{name}: a placeholder digest must say so on its line"
