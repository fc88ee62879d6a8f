import os
import shutil
import subprocess

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import write_atomically
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.systemd_unit import (
    UnitError,
    UnitSpec,
    quote_exec_arg,
    render_env_file,
    render_exec,
    render_unit,
)

HOSTILE = {
    "SERVED": "qwen-fp8",
    "QUOTES": 'it\'s "quoted"',
    "DOLLAR": "$HOME and ${PATH}",
    "BACKTICK": "`touch /tmp/pwned` $(touch /tmp/pwned2)",
    "SPACES": "  lead and trail  ",
    "SEMI": "a; rm -rf /tmp/x && echo",
    "BACKSLASH": "C:\\path\\n",
    "EMPTY": "",
}


def test_unit_defaults_survive_clean_exit_crashes():
    text = render_unit(UnitSpec("frank-secondary.service", ["/usr/bin/llama-server", "--port", "7771"], stop_command=["/bin/kill", "-TERM", "$MAINPID"]))
    for line in (
        "Restart=always",
        "StartLimitIntervalSec=0",
        "RestartSec=5",
        "OOMScoreAdjust=-500",
        "LimitMEMLOCK=infinity",
        "TimeoutStartSec=900",
        "ExecStart=/usr/bin/llama-server --port 7771",
        "ExecStop=/bin/kill -TERM $$MAINPID",
    ):
        assert line in text.splitlines()
    assert "Restart=on-failure" not in text


@pytest.mark.parametrize(
    ("arg", "rendered"),
    [
        ("--ctx-size", "--ctx-size"),
        ("hello world", '"hello world"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("$HOME", "$$HOME"),
        ("100%", "100%%"),
        ("", '""'),
        ("a\\b", '"a\\\\b"'),
    ],
)
def test_exec_quoting(arg, rendered):
    assert quote_exec_arg(arg) == rendered


def test_exec_refuses_newlines_and_relative_programs():
    with pytest.raises(UnitError, match="newline"):
        render_exec(["/bin/echo", "a\nb"])
    with pytest.raises(UnitError, match="absolute path"):
        render_exec(["llama-server"])


def test_bad_unit_name_is_refused():
    with pytest.raises(UnitError, match="^name"):
        render_unit(UnitSpec("../evil", ["/bin/true"]))


def test_env_file_values_round_trip_through_a_shell_and_never_execute(tmp_path):
    env_file = tmp_path / "engine.env"
    env_file.write_text(render_env_file(HOSTILE))
    script = f"set -a; . {env_file}; set +a; env -0"
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True, cwd=tmp_path, env={"PATH": os.environ["PATH"]}).stdout
    seen = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    for key, value in HOSTILE.items():
        assert seen[key] == value
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_env_file_refuses_newlines_and_bad_keys():
    with pytest.raises(UnitError, match=r"environment\.X: newlines"):
        render_env_file({"X": "a\nb"})
    with pytest.raises(UnitError, match="not a valid variable name"):
        render_env_file({"1BAD": "x"})


def test_atomic_write_leaves_no_temp_file(tmp_path):
    target = tmp_path / "x.service"
    write_atomically(str(target), "one\n", 0o644)
    write_atomically(str(target), "two\n", 0o600)
    assert target.read_text() == "two\n"
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert os.listdir(tmp_path) == ["x.service"]


# --- sandboxing (docs/engine_units.md, "Sandboxing") ------------------------------------------

NATIVE = ["/usr/bin/llama-server", "--port", "7772"]
# What a sandboxed native engine must carry, written out here rather than read from SANDBOX.
SANDBOXED = [
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=read-only",
    "PrivateTmp=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "RestrictSUIDSGID=yes",
    "LockPersonality=yes",
    "RestrictNamespaces=yes",
    "CapabilityBoundingSet=",
    "DevicePolicy=closed",
    "DeviceAllow=char-drm rw",
    "DeviceAllow=char-kfd rw",
    "DeviceAllow=char-nvidia* rw",
]


def test_sandbox_is_off_unless_asked_for():
    """A unit that runs `podman run` must keep ProtectSystem off: podman writes /var/lib/containers and /run."""
    text = render_unit(UnitSpec("frank-primary.service", ["/usr/bin/podman", "run", "--rm", "img"]))
    assert "ProtectSystem" not in text and "NoNewPrivileges" not in text and "DevicePolicy" not in text


def test_sandboxed_native_unit_keeps_the_gpu_reachable():
    lines = render_unit(UnitSpec("frank-large.service", NATIVE, user="llm", sandbox=True, read_write_paths=["/var/cache/frank-large"])).splitlines()
    for line in [*SANDBOXED, "ReadWritePaths=-/var/cache/frank-large"]:
        assert line in lines, line
    # GPU runtimes need the device nodes and JIT their kernels into writable+executable memory.
    assert not [line for line in lines if line.startswith(("PrivateDevices", "MemoryDenyWriteExecute", "ProcSubset"))]


def test_extra_service_replaces_a_sandbox_directive_with_all_its_lines():
    extra = {"ProtectSystem": "full", "DeviceAllow": "/dev/nvidia0 rw"}
    lines = render_unit(UnitSpec("frank-large.service", NATIVE, sandbox=True, extra_service=extra)).splitlines()
    assert [line for line in lines if line.startswith("ProtectSystem=")] == ["ProtectSystem=full"]
    assert [line for line in lines if line.startswith("DeviceAllow=")] == ["DeviceAllow=/dev/nvidia0 rw"]
    assert "DevicePolicy=closed" in lines and "NoNewPrivileges=yes" in lines


def test_sandboxed_unit_passes_systemd_analyze_verify(tmp_path):
    """systemd parses every sandbox line (an unknown or misspelt directive is reported)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / "frank-large.service"
    unit.write_text(render_unit(UnitSpec("frank-large.service", ["/bin/sleep", "60"], sandbox=True, read_write_paths=["/var/cache/frank-large"])))
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "Unknown" not in proc.stderr and "ignoring" not in proc.stderr, proc.stderr
