# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render a root systemd unit for a long-running engine, and its EnvironmentFile.

The defaults survive the failures seen in production: the API server exits 0 on a worker fault,
so `Restart=always` (not on-failure) with `StartLimitIntervalSec=0`; model loads take minutes, so a
long `TimeoutStartSec`; pinned host memory needs `LimitMEMLOCK=infinity`; the engine is the last
thing the OOM killer should pick (`OOMScoreAdjust=-500`).

Quoting: ExecStart is rendered from an argv list with systemd's own rules (double quotes,
backslash escapes, `$$` and `%%`), so no argument can split or expand. Environment values go to an
EnvironmentFile in double quotes with `"`, `\\`, `` ` `` and `$` backslash-escaped: the one form
that systemd and a shell sourcing the file with `set -a` both read back byte for byte, and that
neither expands nor executes. (Single quotes with `'\\''` are shell-only: systemd keeps the
backslash.)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import UNIT_OPTIONS, default

_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNIT_NAME_RE = re.compile(r"^[A-Za-z0-9:_.@-]+\.service$")
# Inside double quotes both systemd's EnvironmentFile parser and a POSIX shell unescape exactly
# these four after a backslash, and leave every other character literal.
_ENV_NEED_ESCAPE = '"\\`$'
_SAFE_ARG_RE = re.compile(r"^[A-Za-z0-9_@%$+=:,./-]+$")


class UnitError(ValueError):
    """A unit or environment that cannot be rendered safely; names the field."""


def quote_exec_arg(arg: str, field_name: str = "command") -> str:
    """One argv element in systemd's command-line syntax."""
    if not isinstance(arg, str):
        raise UnitError(f"{field_name}: every argument must be a string, got {type(arg).__name__}")
    if "\n" in arg or "\r" in arg or "\0" in arg:
        raise UnitError(f"{field_name}: argument {arg!r} contains a newline or NUL")
    # systemd expands $VAR/${VAR} and %-specifiers in command lines: double them to keep literals.
    literal = arg.replace("%", "%%").replace("$", "$$")
    # Prefix characters (-@:+!) only mean something on the executable, which must be absolute.
    if literal and _SAFE_ARG_RE.match(literal):
        return literal
    escaped = literal.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def render_exec(argv: list[str], field_name: str = "command") -> str:
    if not argv:
        raise UnitError(f"{field_name}: give the command as a non-empty argv list")
    if not argv[0].startswith("/"):
        raise UnitError(f"{field_name}: the executable must be an absolute path, got {argv[0]!r}")
    return " ".join(quote_exec_arg(arg, field_name) for arg in argv)


def render_env_file(environment: dict[str, str]) -> str:
    lines = ["# Managed by frank.llm_fleet.systemd_root_unit: values are escaped double-quoted literals."]
    for key in sorted(environment):
        value = environment[key]
        if not _ENV_KEY_RE.match(key):
            raise UnitError(f"environment: {key!r} is not a valid variable name")
        if not isinstance(value, str):
            value = str(value)
        if "\n" in value or "\r" in value or "\0" in value:
            raise UnitError(f"environment.{key}: newlines and NUL are refused (they cannot round-trip an EnvironmentFile)")
        escaped = "".join("\\" + char if char in _ENV_NEED_ESCAPE else char for char in value)
        lines.append(f'{key}="{escaped}"')
    return "\n".join(lines) + "\n"


@dataclass
class UnitSpec:
    name: str
    command: list[str]
    description: str = default(UNIT_OPTIONS, "description")
    stop_command: list[str] = field(default_factory=list)
    pre_start: list[list[str]] = field(default_factory=lambda: default(UNIT_OPTIONS, "pre_start"))
    user: str = default(UNIT_OPTIONS, "user")
    group: str = default(UNIT_OPTIONS, "group")
    environment_file: str = ""
    working_directory: str = default(UNIT_OPTIONS, "working_directory")
    restart_sec: int = default(UNIT_OPTIONS, "restart_sec")
    timeout_start_sec: int = default(UNIT_OPTIONS, "timeout_start_sec")
    timeout_stop_sec: int = default(UNIT_OPTIONS, "timeout_stop_sec")
    oom_score_adjust: int = -500
    limit_memlock: str = "infinity"
    limit_nofile: int | None = 65536
    after: list[str] = field(default_factory=lambda: ["network-online.target"])
    wants: list[str] = field(default_factory=lambda: ["network-online.target"])
    kill_mode: str = "control-group"
    extra_service: dict[str, str] = field(default_factory=lambda: default(UNIT_OPTIONS, "extra_service"))

    def validate(self) -> None:
        if not _UNIT_NAME_RE.match(self.name):
            raise UnitError(f"name: {self.name!r} must be a unit name ending in .service")
        for key, value in self.extra_service.items():
            if "\n" in str(value) or not re.match(r"^[A-Za-z]+$", key):
                raise UnitError(f"extra_service.{key}: invalid directive or value")


def render_unit(spec: UnitSpec) -> str:
    spec.validate()
    lines = [
        "# Managed by frank.llm_fleet.systemd_root_unit; local edits are replaced on the next deploy.",
        "[Unit]",
        f"Description={spec.description or spec.name}",
    ]
    if spec.after:
        lines.append(f"After={' '.join(spec.after)}")
    if spec.wants:
        lines.append(f"Wants={' '.join(spec.wants)}")
    lines += [
        # Never give up restarting: a worker fault makes the API server exit 0.
        "StartLimitIntervalSec=0",
        "",
        "[Service]",
        "Type=simple",
    ]
    if spec.user:
        lines.append(f"User={spec.user}")
    if spec.group:
        lines.append(f"Group={spec.group}")
    if spec.environment_file:
        lines.append(f"EnvironmentFile={spec.environment_file}")
    if spec.working_directory:
        lines.append(f"WorkingDirectory={spec.working_directory}")
    for index, argv in enumerate(spec.pre_start):
        lines.append(f"ExecStartPre={render_exec(argv, f'pre_start[{index}]')}")
    lines.append(f"ExecStart={render_exec(spec.command)}")
    if spec.stop_command:
        lines.append(f"ExecStop={render_exec(spec.stop_command, 'stop_command')}")
    lines += [
        "Restart=always",
        f"RestartSec={spec.restart_sec}",
        f"TimeoutStartSec={spec.timeout_start_sec}",
        f"TimeoutStopSec={spec.timeout_stop_sec}",
        f"KillMode={spec.kill_mode}",
        f"OOMScoreAdjust={spec.oom_score_adjust}",
        f"LimitMEMLOCK={spec.limit_memlock}",
    ]
    if spec.limit_nofile:
        lines.append(f"LimitNOFILE={spec.limit_nofile}")
    for key in sorted(spec.extra_service):
        lines.append(f"{key}={spec.extra_service[key]}")
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


# --- what changed, and who else changes the unit ----------------------------------------------

# Lines that document a unit without changing how it runs: a change to them alone rewrites the file
# and reloads systemd, but never restarts a serving engine (the seeds: "Comment-only: no restart needed.").
_COSMETIC_KEYS = ("Description=", "Documentation=")
# Where systemd reads a service's drop-ins from (besides the unit directory the module writes to).
DROPIN_ROOTS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")


def running_lines(text: str | None) -> list[str]:
    """A unit's text without comments, blank lines and documentation: what systemd runs."""
    if text is None:
        return []
    kept = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")) or stripped.startswith(_COSMETIC_KEYS):
            continue
        kept.append(stripped)
    return kept


def is_cosmetic_change(before: str | None, after: str) -> bool:
    """True when the unit changes only in comments or documentation (a serving engine keeps running)."""
    return before is not None and before != after and running_lines(before) == running_lines(after)


def foreign_dropins(name: str, unit_dir: str, allowed: list[str], roots: tuple[str, ...] = DROPIN_ROOTS) -> list[str]:
    """Drop-in files that change the unit behind the module's back: every NAME.d/*.conf under the
    unit directory and systemd's own search path that the inventory does not list (by file name or
    full path). The seeds' story: a forgotten bench.conf drop-in "made every frank-primary deploy
    since 2026-10-08 04:09 restart the staging worktree behind a green health gate"."""
    found = []
    for root in dict.fromkeys((unit_dir, *roots)):
        directory = os.path.join(root, f"{name}.d")
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for entry in names:
            path = os.path.join(directory, entry)
            if entry.endswith(".conf") and entry not in allowed and path not in allowed:
                found.append(path)
    return found
