"""vLLM's key guard: the ASGI middleware the collection loads into vLLM (--middleware), its
install on the host and mount into the container, and the health gate that refuses a keyed
endpoint serving any path without the key."""

import asyncio
import dataclasses
import hashlib
import hmac
import json
import os

import pytest
from fake_host import SYSTEMCTL, FakeClock, FakeRunner, fake_process, show, ss_listening

from ansible_collections.frank.llm_fleet.plugins.module_utils.host import engine_python
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.health import UNKEYED_PATHS, wait_healthy
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.podman_engine import EngineContainer
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import GateError, HealthSpec, UnitManager
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes import vllm, vllm_key_guard
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.base import ArgvError
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import engine_argv, engine_environment

KEY = "sk-guard-test-5e1d"


def call(guard, path, headers=(), kind="http", method="POST"):
    """Run one request through the guard; (status or close code, whether the app was reached)."""
    reached = []
    sent = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "path": path, "method": method, "headers": [(k.encode(), v.encode()) for k, v in headers]}
    asyncio.run(guard(app)(scope, receive, send))
    status = next((m.get("status") or m.get("code") for m in sent), None)
    return status, bool(reached)


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    return vllm_key_guard.KeyGuard


@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/pooling", "/score", "/rerank", "/v1/models", "/pause", "/health/", "//health", "/"])
def test_every_path_but_the_open_ones_needs_the_key(keyed, path):
    assert call(keyed, path) == (401, False)
    assert call(keyed, path, [("Authorization", "Bearer wrong")]) == (401, False)
    assert call(keyed, path, [("Authorization", f"Basic {KEY}")]) == (401, False)
    assert call(keyed, path, [("Authorization", f"Bearer {KEY}")]) == (None, True)
    assert call(keyed, path, [("authorization", f"bearer {KEY}")]) == (None, True)


@pytest.mark.parametrize("path", ["/health", "/ping", "/metrics"])
def test_health_ping_and_metrics_answer_without_the_key(keyed, path):
    assert call(keyed, path, method="GET") == (None, True)


def test_a_websocket_without_the_key_is_closed(keyed):
    assert call(keyed, "/v1/realtime", kind="websocket") == (1008, False)
    assert call(keyed, "/health", kind="websocket") == (1008, False)


def test_without_a_key_the_guard_passes_everything_as_vllm_does(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert call(vllm_key_guard.KeyGuard, "/tokenize") == (None, True)


def test_the_guard_uses_only_the_standard_library():
    # It is imported by the engine's Python, where the collection is not installed.
    source = engine_python.engine_python_source(vllm_key_guard.__name__)
    imports = {line.split()[1] for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert imports == {"__future__", "hashlib", "hmac", "os", "typing"}


# A realistic digest: podman_engine refuses a placeholder one (all zeros).
IMAGE_DIGEST = "sha256:" + hashlib.sha256(b"img").hexdigest()
SHAPE = {"runtime": "vllm", "launch": "podman", "port": 7770, "model_file": "m", "served_id": "frank-primary", "max_model_len": 4096, "max_num_seqs": 2}


def test_vllm_loads_the_guard_from_the_directory_the_deploy_writes():
    argv = engine_argv(SHAPE, "/models", container=True)
    assert argv[argv.index("--middleware") + 1] == "llm_fleet_vllm_key_guard.KeyGuard"
    assert engine_environment(SHAPE) == {"PYTHONPATH": engine_python.ENGINE_PYTHON_DIR}
    assert vllm.KEY_GUARD_DIR == engine_python.ENGINE_PYTHON_DIR
    assert [name.removesuffix(".py") for name in engine_python.ENGINE_PYTHON_FILES] == [vllm.KEY_GUARD_MIDDLEWARE.split(".", maxsplit=1)[0]]


def test_the_guard_inherits_to_radiance_the_vllm_fork():
    # The fork takes vLLM's flags and serves vLLM's routes: the same hole, the same guard.
    shape = {**SHAPE, "runtime": "radiance", "model_file": "m.rad"}
    try:
        argv = engine_argv(shape, "/models", container=True)
    except ArgvError as exc:
        pytest.fail(f"a minimal radiance shape: {exc}")
    assert argv[argv.index("--middleware") + 1] == vllm.KEY_GUARD_MIDDLEWARE
    assert engine_environment(shape) == {"PYTHONPATH": engine_python.ENGINE_PYTHON_DIR}


def test_the_container_mounts_the_guard_read_only_only_for_engines_that_use_it():
    guarded = EngineContainer(name="frank-primary", image="img", digest=IMAGE_DIGEST, environment=engine_environment(SHAPE))
    argv = guarded.run_argv(b"k" * 32)
    directory = engine_python.ENGINE_PYTHON_DIR
    assert argv[argv.index(f"{directory}:{directory}:ro") - 1] == "--volume"
    plain = EngineContainer(name="frank-secondary", image="img", digest=IMAGE_DIGEST, environment={"LLAMA_ARG_X": "1"})
    assert not any(directory in arg for arg in plain.run_argv(b"k" * 32))


def test_the_install_writes_the_guard_once_read_only(tmp_path):
    directory = str(tmp_path / "engine-python")
    host = Host.files_only()
    assert engine_python.ensure_engine_python(host, directory) is True
    path = os.path.join(directory, "llm_fleet_vllm_key_guard.py")
    with open(path) as handle:
        assert "class KeyGuard" in handle.read()
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert engine_python.ensure_engine_python(host, directory) is False
    os.chmod(path, 0o666)
    assert engine_python.ensure_engine_python(host, directory) is True
    with open(path, "w") as handle:
        handle.write("tampered")
    assert engine_python.ensure_engine_python(host, directory) is True


# --- the health gate ---------------------------------------------------------------------------

UNIT = "guarded.service"
CGROUP = f"/system.slice/{UNIT}"
PORT = 7771


def gate(tmp_path, post, api_key=KEY):
    fake_process(tmp_path / "proc", 4242, CGROUP, "vllm serve --port 7771", started_s=200)
    active = show(ActiveState="active", SubState="running", MainPID=4242, NRestarts=0, ControlGroup=CGROUP)
    manager = UnitManager(Host(FakeRunner({(SYSTEMCTL, "show"): [active], ("/usr/bin/ss",): [ss_listening(PORT, 4242)]})), proc=str(tmp_path / "proc"))
    clock = FakeClock()
    health = HealthSpec(port=PORT, served_id="guarded", timeout=30, api_key=api_key)

    def get(_host, _port, path, key=""):
        if key != api_key:
            return 401, b""
        return (200, b"") if path == "/health" else (200, json.dumps({"data": [{"id": "guarded"}]}).encode())

    return wait_healthy(manager, UNIT, health, started_at=100.0, restarts_before=0, clock=clock, sleep=clock.sleep, get=get, post=post)


def test_a_keyed_engine_serving_tokenize_without_the_key_fails_the_gate(tmp_path):
    # vLLM 0.32 without the guard: /v1 is keyed, /tokenize and /invocations are not.
    answers = {"/tokenize": 200, "/invocations": 200}
    with pytest.raises(GateError, match=r"serves without the API key \(/invocations answered 200, /tokenize answered 200") as failure:
        gate(tmp_path, lambda _h, _p, path: answers.get(path, 401))
    assert KEY not in str(failure.value)


def test_a_bad_request_answer_is_serving_too(tmp_path):
    # A 422 means the route parsed the body: it was reached without the key.
    with pytest.raises(GateError, match=r"/score answered 422"):
        gate(tmp_path, lambda _h, _p, path: 422 if path == "/score" else 404)


def test_a_guarded_engine_passes_and_every_path_was_asked(tmp_path):
    asked = []

    def post(_host, _port, path):
        asked.append(path)
        return 401

    assert gate(tmp_path, post).healthy
    assert asked == list(UNKEYED_PATHS) and "/invocations" in asked


def test_a_keyless_endpoint_is_not_asked(tmp_path):
    asked = []
    assert gate(tmp_path, lambda *args: asked.append(args) or 200, api_key="").healthy
    assert asked == []


def test_a_new_guard_changes_the_containers_config_hash_and_an_engine_without_it_keeps_its_own():
    key = b"k" * 32
    guarded = EngineContainer(name="frank-primary", image="img", digest=IMAGE_DIGEST, environment=engine_environment(SHAPE))
    before = guarded.config_hash(key)
    guarded.engine_python_digest = engine_python.engine_python_digest()
    installed = guarded.config_hash(key)
    guarded.engine_python_digest = "0" * 64  # another release's guard
    assert len({before, installed, guarded.config_hash(key)}) == 3
    # The hash of an engine without engine-side Python, as main computed it before the field existed.
    plain = EngineContainer(name="frank-secondary", image="img", digest=IMAGE_DIGEST)
    fields = {k: v for k, v in dataclasses.asdict(plain).items() if k != "engine_python_digest"}
    assert plain.config_hash(key) == hmac.new(key, json.dumps(fields, sort_keys=True).encode(), hashlib.sha256).hexdigest()[:32]
