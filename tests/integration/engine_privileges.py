"""What an engine container on the lab host holds, read from inside it: the engine process's
/proc/1/status and whether its root filesystem takes a write (docs/engine_units.md, "Container
privileges")."""

from __future__ import annotations

import subprocess

from lab_host import HOST, env

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.podman_engine import ENGINE_UID_BASE, ENGINE_UID_SPAN, engine_uid


def engine_uid_gid(container: str) -> tuple[int, int]:
    """podman_engine's default user (host/specs.py ENGINE_OPTIONS["user"] empty): the engine's own
    UID:GID, derived from its name, in a range no other default shares."""
    uid = engine_uid(container)
    assert ENGINE_UID_BASE <= uid < ENGINE_UID_BASE + ENGINE_UID_SPAN
    return uid, uid


def in_container(container: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", HOST, "podman", "exec", container, *argv], capture_output=True, text=True, env=env(), check=False)


def assert_least_privilege(container: str, cache_mount: str = "/cache") -> None:
    status = in_container(container, "cat", "/proc/1/status")
    assert status.returncode == 0, status.stderr
    fields = dict(line.split(":", 1) for line in status.stdout.splitlines() if ":" in line)
    fields = {key: value.split() for key, value in fields.items()}
    capabilities = {key: int(fields[key][0], 16) for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    assert capabilities == dict.fromkeys(capabilities, 0), capabilities
    assert fields["NoNewPrivs"] == ["1"]
    assert fields["Seccomp"] == ["2"]  # podman's profile filters the engine's syscalls
    own = engine_uid_gid(container)
    assert [int(uid) for uid in fields["Uid"]] == [own[0]] * 4
    assert [int(gid) for gid in fields["Gid"]] == [own[1]] * 4
    root = in_container(container, "touch", "/.llm-fleet-write-probe")
    assert root.returncode != 0 and "Read-only file system" in root.stderr, root
    for writable in ("/tmp", cache_mount):
        probe = in_container(container, "touch", f"{writable}/.llm-fleet-write-probe")
        assert probe.returncode == 0, (writable, probe.stderr)
        in_container(container, "rm", "-f", f"{writable}/.llm-fleet-write-probe")
