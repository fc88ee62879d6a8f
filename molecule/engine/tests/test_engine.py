"""Final state after converge, idempotence and the fault tests (testinfra, podman backend)."""

import json

import pytest

HOSTILE = 'it\'s "quoted" $HOME `echo pwned` $(id) back\\slash and  two  spaces; done'
UNITS = {"lab-native.service": (18082, "lab-native"), "lab-podman.service": (18081, "lab-podman")}


def show(host, unit, prop):
    return host.check_output(f"systemctl show -p {prop} --value {unit}")


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_unit_is_active_with_the_surviving_restart_policy(host, unit):
    assert show(host, unit, "ActiveState") == "active"
    text = host.file(f"/etc/systemd/system/{unit}").content_string
    assert "Restart=always" in text and "StartLimitIntervalSec=0" in text and "OOMScoreAdjust=-500" in text


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_endpoint_serves_its_id(host, unit):
    port, served = UNITS[unit]
    assert host.check_output(f"curl -s http://127.0.0.1:{port}/health") == '{"status":"ok"}'
    models = json.loads(host.check_output(f"curl -s http://127.0.0.1:{port}/v1/models"))
    assert served in [m["id"] for m in models["data"]]


def engine_environ(host, pid):
    raw = host.check_output(f"cat /proc/{pid}/environ | base64 -w0")
    import base64

    return dict(item.split(b"=", 1) for item in base64.b64decode(raw).split(b"\0") if b"=" in item)


def test_hostile_value_reaches_the_native_engine_byte_for_byte(host):
    pid = show(host, "lab-native.service", "MainPID")
    assert engine_environ(host, pid)[b"LAB_HOSTILE"] == HOSTILE.encode()
    env_file = host.file("/etc/llm-fleet/lab-native.env")
    assert env_file.mode == 0o640 and env_file.user == "root"


def test_hostile_value_reaches_the_container_engine_byte_for_byte(host):
    pid = host.check_output("podman inspect lab-engine --format '{{.State.Pid}}'")
    assert engine_environ(host, pid)[b"LAB_HOSTILE"] == HOSTILE.encode()
    assert host.file("/etc/llm-fleet/lab-engine.podman.env").mode == 0o600


def test_native_engine_runs_as_the_service_user(host):
    pid = show(host, "lab-native.service", "MainPID")
    assert host.check_output(f"ps -o user= -p {pid}") == "llm"


def test_no_crash_unit_or_foreign_listener_is_left(host):
    assert not host.file("/etc/systemd/system/lab-crash.service").exists
    assert host.run("ss -Hltn sport = :18083").stdout.strip() == ""
