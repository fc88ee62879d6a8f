"""Engine containers: input that would reach `podman run`'s argv or the container's env file.

The env-file rule rests on podman's own parsers, ported here line for line:
- podman 4.3.1 (the lab's; every release but 4.7.0 reads the same way), pkg/env/env.go ParseFile:
  bufio.Scanner lines (a trailing CR dropped, at most 64 KiB), leading spaces and tabs trimmed,
  '#' lines skipped, the value is everything after the first '=';
- podman 4.7.0, pkg/env/env.go after 170a78631b "feat(env): support multiline in env-file"
  (reverted in 4.7.1 by 297a66c303): one dotenv regexp over the whole file.
A rendered env file must read back byte for byte through both, or be refused naming the key.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from fake_host import FakeRunner

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.engine_step import ensure_engine
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.podman_engine import ENV_LINE_MAX_BYTES, EngineContainer, EngineError, render_podman_env_file
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

DIGEST = "sha256:" + "ab" * 32
KEY = bytes(32)
GO_WHITESPACE = " \t"
GO_SPACE = r"[\t\n\f\r ]"  # RE2's \s (no \v)
GO_WORD = "0-9A-Za-z_"  # RE2's \w (ASCII only); every \w in these patterns sits inside a class


class ScanError(ValueError):
    """bufio.Scanner's ErrTooLong."""


def read_env_file_podman_4_3(text: str, environ: dict[str, str]) -> dict[str, str]:
    """podman 4.3.1 pkg/env ParseFile + parseEnv."""
    data = text.encode("utf-8")
    if any(len(line) + 1 > 64 * 1024 for line in data.split(b"\n")):
        raise ScanError("bufio.Scanner: token too long")
    env: dict[str, str] = {}
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # ScanLines: the final newline ends the last line, it starts no new one
    for raw in lines:
        line = (raw[:-1] if raw.endswith("\r") else raw).lstrip(GO_WHITESPACE)
        if not line or line.startswith("#"):
            continue
        name, has_value, value = line.partition("=")
        if name == "":
            raise ValueError(f"invalid environment variable: {line!r}")
        name = name.lstrip(GO_WHITESPACE)
        if has_value:
            env[name] = value
        elif name.endswith("*"):
            env.update({k: v for k, v in environ.items() if k.startswith(name[:-1])})
        elif name in environ:
            env[name] = environ[name]
    return env


# podman 4.7.0's lineRegexp and onlyKeyRegexp, with RE2's \s and \w spelled out for Python.
_LINE_4_7 = re.compile(
    (
        r"(?m)(?:^|^)\s*(?:export\s+)?([\w.%-]+)(\s*[=|*]\s*?|:\s+?)(\s*'(?:\\'|[^'])*'|\s*\"(?:\\\"|[^\"])*\"|\s*"
        r"`(?:\\`|[^`])*`"
        r"|[^#\r\n]+)?\s*(?:#.*)?(?:$|$)"
    )
    .replace(r"\s", GO_SPACE)
    .replace(r"\w", GO_WORD)
)
_ONLY_KEY_4_7 = re.compile(r"^[\w.-]+$".replace(r"\w", GO_WORD))


def read_env_file_podman_4_7(text: str, environ: dict[str, str]) -> dict[str, str]:
    """podman 4.7.0 pkg/env ParseFile + parseEnv + envMatch."""
    content = text.replace("\r\n", "\n").replace("\r", "\n")
    matches = [[m.group(0), m.group(1), m.group(2), m.group(3) or ""] for m in _LINE_4_7.finditer(content)]
    for key in _LINE_4_7.sub("", content).split("\n"):
        key = key.strip(GO_WHITESPACE)
        if key and _ONLY_KEY_4_7.match(key):
            matches.append([key, key, "=", ""])
    env: dict[str, str] = {}
    for whole, key, separator, value in matches:
        separator = separator.strip(GO_WHITESPACE)
        if "\n" in value:
            if value.startswith("`"):
                raise ValueError(f"only support multi-line environment variables surrounded by quotes: {whole!r}")
            value = value.strip("\"'")
        if separator == "*" and value.startswith("="):
            key, separator, value = key + "*", "=", value[1:]
        if separator == "=":
            if value == "":
                if key in environ:
                    env[key] = environ[key]
            else:
                env[key] = value
        elif separator == "*":
            env.update({k: v for k, v in environ.items() if k.startswith(key)})
    return env


PARSERS = [read_env_file_podman_4_3, read_env_file_podman_4_7]


def test_the_ported_4_7_parser_passes_podmans_own_cases():
    # containers/podman 170a78631b pkg/env/env_test.go Test_ParseFile: each case is one line
    # `key separator value` of one file; expected values as that test states them.
    content = (
        "Key=Value1\n"
        'Key2="Value2"\n'
        "Key3='Value3'\n"
        "Key4=  Value4  \n"
        "  Key5  =Value5\n"
        "Key6=\n"
        "Key8\n"
        "Key10*=1\n"
        'Key11="First line1\nlast line1"\n'
        "Key12='First line2\nlast line2'\n"
        "BASH_FUNC__fmt_ctx%%=() { echo 1; }\n"
        "export Key13=Value13\n"
        "Key14=\n"
        "=Value\n"
        "=\n"
        "#aaaa\n"
    )
    env = read_env_file_podman_4_7(content, {"Key6": "Value6", "Key8": "Value8"})
    assert env == {
        "Key": "Value1",
        "Key2": '"Value2"',
        "Key3": "'Value3'",
        "Key4": "  Value4  ",
        "Key5": "Value5",
        "Key6": "Value6",
        "Key8": "Value8",
        "Key10*": "1",
        "Key11": "First line1\nlast line1",
        "Key12": "First line2\nlast line2",
        "BASH_FUNC__fmt_ctx%%": "() { echo 1; }",
        "Key13": "Value13",
    }


@pytest.mark.parametrize(
    ("text", "literal", "dotenv"),
    [
        # The finding's own cases: an unquoted '#' truncates, a leading '"' swallows the next lines.
        ("TOKEN=abc#def\n", {"TOKEN": "abc#def"}, {"TOKEN": "abc"}),
        ('A="abc\nB=x"\n', {"A": '"abc', "B": 'x"'}, {"A": "abc\nB=x"}),
        ("A=\n", {"A": ""}, {"A": "from the host"}),
        ('A="abc"  \n', {"A": '"abc"  '}, {"A": '"abc"'}),
    ],
)
def test_the_two_parsers_disagree_where_the_finding_says(text, literal, dotenv):
    environ = {"A": "from the host"}
    assert read_env_file_podman_4_3(text, environ) == literal
    assert read_env_file_podman_4_7(text, environ) == dotenv


HOSTILE_BUT_SAFE = [
    'it\'s "quoted" $HOME `echo pwned` $(id) back\\slash and  two  spaces; done',  # molecule/engine's value
    "  leading spaces",
    "trailing spaces  ",
    "a=b=c",
    "x\"y'z`",
    "*",
    "export X=1",
    "KEY2=smuggled",
    "\\",
    "ключ ✓ 🔑",
    "a | b : c",
]


@pytest.mark.parametrize("value", HOSTILE_BUT_SAFE)
def test_an_accepted_value_reads_back_byte_for_byte_in_every_podman(value):
    text = render_podman_env_file({"A": value, "B": "next"})
    for parse in PARSERS:
        assert parse(text, {}) == {"A": value, "B": "next"}, parse.__name__


# Characters either parser treats specially, and (three times as often) some it does not.
ALPHABET = ["#", '"', "'", "`", "\t", "\n", "\r", "\0", "\x1b"] + 3 * ["a", "Z", "0", " ", "=", "\\", "$", "*", ":", "|", "é", "-"]


def test_every_value_either_reads_back_in_both_parsers_or_is_refused_by_key():
    # Random files of random values: no accepted file may read differently in either podman,
    # and a refusal names the key, never the value.
    rng = random.Random(20261130)
    lengths = range(0, 10)
    accepted = refused = 0
    for _attempt in range(3000):
        environment = {f"K{i}": "".join(rng.choice(ALPHABET) for _char in range(rng.choice(lengths))) for i in range(rng.randint(1, 3))}
        try:
            text = render_podman_env_file(environment)
        except EngineError as exc:
            refused += 1
            key = re.match(r"^environment\.(K\d+): ", str(exc)).group(1)
            if len(environment[key]) >= 6:  # shorter ones can occur in the message's own words
                assert environment[key] not in str(exc)
            continue
        accepted += 1
        for parse in PARSERS:
            assert parse(text, {"K0": "host", "K1": "host"}) == environment, (parse.__name__, environment)
    assert accepted > 300 and refused > 300  # both branches exercised


SECRET = "s3cret-value"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (f"{SECRET}#tail", "'#' is refused"),
        (f'"{SECRET}', "opening with a quote"),
        (f"  '{SECRET}'", "opening with a quote"),
        (f"`{SECRET}`", "opening with a quote"),
        ("", "empty value"),
        (f"{SECRET}\nB=1", "control character '\\\\n'"),
        (f"{SECRET}\r", "control character '\\\\r'"),
        (f"{SECRET}\t", "control character '\\\\t'"),
        (f"{SECRET}\0", "control character '\\\\x00'"),
        (f"{SECRET}\x1b[2J", "control character '\\\\x1b'"),
        (SECRET * (ENV_LINE_MAX_BYTES // len(SECRET)), "longer than 65535 bytes"),
    ],
)
def test_values_podman_versions_read_differently_are_refused_naming_the_key_only(value, why):
    with pytest.raises(EngineError, match=f"^environment.API_KEY: .*{why}") as refused:
        render_podman_env_file({"API_KEY": value})
    assert SECRET not in str(refused.value)


def test_the_longest_line_podman_4_3_reads_is_accepted():
    value = "v" * (ENV_LINE_MAX_BYTES - len("A="))
    text = render_podman_env_file({"A": value})
    assert read_env_file_podman_4_3(text, {}) == {"A": value}
    with pytest.raises(ScanError):
        read_env_file_podman_4_3("A=v" + value + "\n", {})


# --- argv: control characters, paths, privilege flags ------------------------------------------


def engine(**overrides):
    return EngineContainer(**{"name": "frank-primary", "image": "localhost/vllm:fork", "digest": DIGEST, **overrides})


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": "e\nx"}, "name"),
        ({"image": "localhost/vllm:fork\x1b"}, "image"),
        ({"command": ["--port", "7770\n--api-key"]}, r"command\[1\]"),
        ({"entrypoint": "/bin/sh\r"}, "entrypoint"),
        ({"model_dir": "/srv/models\n"}, "model_dir"),
        ({"cache_dir": "/var/cache/\0x"}, "cache_dir"),
        ({"gpu_devices": ["/dev/dri\t"]}, r"gpu_devices\[0\]"),
        ({"network": "host\n"}, "network"),
        ({"publish": ["7770:7770\x7f"]}, r"publish\[0\]"),
        ({"ipc": "private\n"}, "ipc"),
        ({"ulimits": ["nofile=1:1\n"]}, r"ulimits\[0\]"),
        ({"runtime": "crun\n"}, "runtime"),
        ({"cgroups": "disabled\n"}, "cgroups"),
        ({"extra_args": ["--log-level\n"]}, r"extra_args\[0\]"),
        ({"labels": {"owner": "x\ny"}}, "labels.owner"),
        ({"user": "10001:10001\n"}, "user"),
        ({"cap_add": ["SYS_NICE\n"]}, r"cap_add\[0\]"),
    ],
)
def test_control_characters_never_reach_argv(overrides, field):
    with pytest.raises(EngineError, match=f"^{field}: control character"):
        engine(**overrides).run_argv(KEY)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"model_dir": "srv/models"}, "model_dir"),
        ({"cache_dir": "cache"}, "cache_dir"),
        ({"cache_dir": "/var/cache/../../etc"}, "cache_dir"),
        ({"model_mount": "models"}, "model_mount"),
        ({"cache_mount": "/cache,exec"}, "cache_mount"),
        ({"model_dir": "/srv/models:/etc:rw"}, "model_dir"),
    ],
)
def test_mount_paths_are_absolute_and_cannot_split_a_volume(overrides, field):
    with pytest.raises(EngineError, match=f"^{field}: "):
        engine(**overrides).run_argv(KEY)


@pytest.mark.parametrize(
    "flag",
    [
        "--privileged",
        "--cap-add=ALL",
        "--cap-drop=NET_RAW",
        "--security-opt=seccomp=unconfined",
        "--security-opt",
        "--user=0",
        "-u0",
        "--userns=host",
        "--pid=host",
    ],
)
def test_extra_args_cannot_undo_a_privilege_default(flag):
    with pytest.raises(EngineError, match=r"^extra_args\[1\]: .* is refused here"):
        engine(extra_args=["--log-level=info", flag]).run_argv(KEY)


def test_cap_add_cannot_take_everything_back():
    with pytest.raises(EngineError, match=r"^cap_add\[0\]: name one capability"):
        engine(cap_add=["all"]).run_argv(KEY)


@pytest.mark.parametrize(
    ("env_file", "message"),
    [
        ("relative.env", "^env_file: give an absolute path"),
        ("/etc/llm-fleet/../x.env", "^env_file: give an absolute path"),
        ("/etc/e\n.env", "^env_file: control character"),
        ("/etc/systemd/system/other.env", "^env_file: .* is outside the collection's own files"),
    ],
)
def test_the_env_file_path_is_checked_before_anything_is_written(tmp_path, env_file, message):
    host = Host(FakeRunner())
    params = {"name": "e", "image": "localhost/vllm:fork", "digest": DIGEST, "env_file": env_file, "secret_environment": {"A": SECRET}}
    with pytest.raises(StepError, match=message) as refused:
        ensure_engine(params, host, diff=False)
    assert host.actions == [] and SECRET not in json.dumps(refused.value.result)


@pytest.mark.parametrize("parse", PARSERS)
def test_the_env_files_header_is_a_comment_to_every_podman(parse):
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host.engine_step import ENV_HEADER

    text = ENV_HEADER.format(name="frank-primary") + render_podman_env_file({"A": "1", "B": "two words"})
    assert parse(text, {"Written": "x", "it": "y"}) == {"A": "1", "B": "two words"}
