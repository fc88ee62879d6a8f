import os
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
