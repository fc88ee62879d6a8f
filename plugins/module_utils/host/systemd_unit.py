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

Injection: systemd ends a line at `\n`, `\r` or NUL and joins a line ending in a backslash to the
next, so a value carrying either could add or swallow a directive. Every field is refused with a
control character (or, single-line values, a trailing backslash), named by its field, never by
its value. The unit name is the only part of a path that comes from the caller: `unit_paths` checks
it (and the directories) before any path is joined.

Sandboxing (`sandbox`, for native engines): SANDBOX below; docs/engine_units.md says what each
directive is for and why PrivateDevices and MemoryDenyWriteExecute are not among them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import UNIT_OPTIONS, default

SYSTEMCTL = "/usr/bin/systemctl"
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# systemd's unit-name rules (unit_name_is_valid): ASCII letters, digits and `:-_.\\`, at most one
# `@` (a template or instance), then the type suffix; at most 255 characters (UNIT_NAME_MAX).
_UNIT_NAME_RE = re.compile(r"^[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]*)?\.service$")
_UNIT_NAME_MAX = 255
# A directive name as systemd's parser takes it: letters and digits, starting with a letter.
_DIRECTIVE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# Inside double quotes both systemd's EnvironmentFile parser and a POSIX shell unescape exactly
# these four after a backslash, and leave every other character literal.
_ENV_NEED_ESCAPE = '"\\`$'
_SAFE_ARG_RE = re.compile(r"^[A-Za-z0-9_@%$+=:,./-]+$")


class UnitError(ValueError):
    """A unit or environment that cannot be rendered safely; names the field."""


# Sandboxing for a native engine. Not here, on purpose: PrivateDevices (it hides /dev/kfd, /dev/dri
# and /dev/nvidia*) and MemoryDenyWriteExecute (GPU runtimes JIT kernels into writable+executable
# memory). ProtectClock implies `DeviceAllow=char-rtc r`, and any DeviceAllow closes every device
# not listed, so the GPU device groups are listed (globs over /proc/devices).
SANDBOX: tuple[tuple[str, str], ...] = (
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    # Models may live under /home: readable, never writable.
    ("ProtectHome", "read-only"),
    ("PrivateTmp", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("ProtectProc", "invisible"),
    ("RestrictSUIDSGID", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictNamespaces", "yes"),
    ("LockPersonality", "yes"),
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"),
    ("SystemCallArchitectures", "native"),
    # @system-service holds ioctl, mmap/mprotect, mbind and memfd_create that GPU runtimes use;
    # EPERM instead of a kill, so a call outside it fails softly.
    ("SystemCallFilter", "@system-service"),
    ("SystemCallErrorNumber", "EPERM"),
    ("CapabilityBoundingSet", ""),
    ("UMask", "0077"),
    ("DevicePolicy", "closed"),
    ("DeviceAllow", "char-drm rw"),
    ("DeviceAllow", "char-kfd rw"),
    ("DeviceAllow", "char-nvidia* rw"),
)


def check_text(value: object, field_name: str, show: bool = True) -> str:
    """A single-line unit value: no control character (systemd ends a line at \\n, \\r and NUL)
    and no trailing backslash (it joins the next line). `show=False` keeps the value out of the
    error, for values that may be secrets."""
    text = value if isinstance(value, str) else str(value)
    seen = f" ({text!r})" if show else ""
    if _CONTROL_RE.search(text):
        raise UnitError(f"{field_name}: control characters (newline, carriage return, NUL, ...) are refused{seen}")
    if text.endswith("\\"):
        raise UnitError(f"{field_name}: a trailing backslash is refused (systemd joins it to the next line){seen}")
    return text


def check_unit_name(name: object) -> str:
    """A service unit name by systemd's rules; never a path (no `/`, no `..`)."""
    if not isinstance(name, str) or not name:
        raise UnitError("name: give the unit name, ending in .service")
    if "/" in name or ".." in name or _CONTROL_RE.search(name):
        raise UnitError(f"name: {name!r} must be a plain unit name (no '/', no '..', no control characters), ending in .service")
    if len(name) > _UNIT_NAME_MAX or not _UNIT_NAME_RE.match(name) or name.startswith((".", "@")):
        raise UnitError(f"name: {name!r} must be a unit name ending in .service (letters, digits, ':-_.\\', one '@'; at most {_UNIT_NAME_MAX} characters)")
    return name


def check_absolute_dir(path: object, field_name: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
        raise UnitError(f"{field_name}: give an absolute directory without '..', got {path!r}")
    return check_text(path, field_name)


def unit_paths(name: object, unit_dir: object, env_dir: object) -> tuple[str, str]:
    """(unit file, EnvironmentFile) for a unit: the one place a caller's unit name meets a
    directory, so every state, check mode and diff reads and writes only these two paths."""
    checked = check_unit_name(name)
    units = check_absolute_dir(unit_dir, "unit_dir")
    envs = check_absolute_dir(env_dir, "env_dir")
    return os.path.join(units, checked), os.path.join(envs, checked.rsplit(".", 1)[0] + ".env")


def quote_exec_arg(arg: str, field_name: str = "command") -> str:
    """One argv element in systemd's command-line syntax."""
    if not isinstance(arg, str):
        raise UnitError(f"{field_name}: every argument must be a string, got {type(arg).__name__}")
    if _CONTROL_RE.search(arg):
        raise UnitError(f"{field_name}: argument {arg!r} contains a control character (newline, carriage return, NUL, ...)")
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
    # Commands the collection itself runs before every start with full privileges (systemd's `+`):
    # the endpoint's nftables table, which a sandboxed unit (no capabilities, its own user) could
    # not load. Never from the inventory: the argv is the collection's own.
    privileged_pre_start: list[list[str]] = field(default_factory=list)
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
    sandbox: bool = default(UNIT_OPTIONS, "sandbox")
    read_write_paths: list[str] = field(default_factory=lambda: default(UNIT_OPTIONS, "read_write_paths"))

    def validate(self) -> None:
        check_unit_name(self.name)
        for field_name in ("description", "user", "group", "environment_file", "working_directory", "kill_mode", "limit_memlock"):
            check_text(getattr(self, field_name), field_name)
        for field_name in ("after", "wants"):
            for index, unit in enumerate(getattr(self, field_name)):
                check_text(unit, f"{field_name}[{index}]")
        for field_name in ("pre_start", "privileged_pre_start"):
            for index, argv in enumerate(getattr(self, field_name)):
                if not isinstance(argv, list):
                    raise UnitError(f"{field_name}[{index}]: give each command as an argv list, got {type(argv).__name__}")
        for index, path in enumerate(self.read_write_paths):
            if not isinstance(path, str) or not path.startswith("/") or any(char.isspace() for char in path):
                raise UnitError(f"read_write_paths[{index}]: give an absolute path without whitespace, got {path!r}")
            check_text(path, f"read_write_paths[{index}]")
        for key, value in self.extra_service.items():
            if not isinstance(key, str) or not _DIRECTIVE_RE.match(key):
                raise UnitError(f"extra_service: {key!r} is not a directive name (letters and digits, starting with a letter)")
            check_text(value, f"extra_service.{key}")

    def service_hardening(self) -> list[str]:
        """The sandbox's lines, then ReadWritePaths; a directive that extra_service names is left
        to extra_service (all of its lines: DeviceAllow given there replaces the GPU list)."""
        lines = [f"{key}={value}" for key, value in SANDBOX if self.sandbox and key not in self.extra_service]
        # `-`: a path that does not exist (yet) is skipped instead of failing the start (226/NAMESPACE).
        lines += [f"ReadWritePaths=-{path.replace('%', '%%')}" for path in self.read_write_paths]
        return lines


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
    for index, argv in enumerate(spec.privileged_pre_start):
        lines.append(f"ExecStartPre=+{render_exec(argv, f'privileged_pre_start[{index}]')}")
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
    lines += spec.service_hardening()
    for key in sorted(spec.extra_service):
        lines.append(f"{key}={spec.extra_service[key]}")
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


# --- what changed, and who else changes the unit ----------------------------------------------

# Lines that document a unit without changing how it runs: a change to them alone rewrites the file
# and reloads systemd, but never restarts a serving engine (the seeds: "Comment-only: no restart needed.").
_COSMETIC_KEYS = ("Description=", "Documentation=")
# Every directory systemd's system manager reads units and drop-ins from, highest priority first
# (systemd 252, lookup_paths_init): `systemctl set-property` writes /etc/systemd/system.control
# (persistent) or /run/systemd/system.control (--runtime), `systemd-run` /run/systemd/transient,
# generators the three generator directories at every daemon-reload, administrators /etc and /run,
# packages /usr/local/lib, /usr/lib and /lib.
UNIT_SEARCH_PATH = (
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
    "/etc/systemd/system",
    "/etc/systemd/system.attached",
    "/run/systemd/system",
    "/run/systemd/system.attached",
    "/run/systemd/generator",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
    "/run/systemd/generator.late",
)
# Kept for callers of the old name: the drop-in roots are the whole search path.
DROPIN_ROOTS = UNIT_SEARCH_PATH
# systemd's own answer to "which drop-ins and which unit file did you load" (the unit name follows).
DROPIN_QUERY = (SYSTEMCTL, "show", "--property=DropInPaths", "--property=FragmentPath")
_VENDOR_ROOTS = ("/usr/local/lib/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
_TYPE_DIR_RE = re.compile(r"^[a-z]+\.d$")
# What put a drop-in where it is, and how the operator takes it away (or keeps it); by its root.
_ORIGINS = {
    "/etc/systemd/system.control": "written by `systemctl set-property`: `systemctl revert {unit}` removes it",
    "/run/systemd/system.control": "written by `systemctl set-property --runtime`: `systemctl revert {unit}` removes it",
    "/run/systemd/transient": "a transient unit's (`systemd-run`): it goes at the next reboot, or remove it",
    "/run/systemd/generator.early": "made by a systemd generator at every daemon-reload: list it in dropins to keep it",
    "/run/systemd/generator": "made by a systemd generator at every daemon-reload: list it in dropins to keep it",
    "/run/systemd/generator.late": "made by a systemd generator at every daemon-reload: list it in dropins to keep it",
    "/etc/systemd/system": "an administrator's drop-in: remove it",
    "/etc/systemd/system.attached": "a portable service's (`portablectl attach`): detach it",
    "/run/systemd/system": "a runtime drop-in: remove it (it goes at the next reboot)",
    "/run/systemd/system.attached": "a portable service's (`portablectl attach --runtime`): detach it",
}


def dropin_dir_names(name: str) -> list[str]:
    """The drop-in directories systemd reads for a unit name, most specific first: NAME.d, for a
    template instance its template's (`x@.service.d`), each dash-truncated prefix (`frank-.service.d`
    for frank-primary.service) and the type's own (`service.d`: every service)."""
    stem, _dot, suffix = name.rpartition(".")
    names = [f"{name}.d"]
    if "@" in stem:
        names.append(f"{stem.split('@', 1)[0]}@.{suffix}.d")
    parts = stem.split("@", 1)[0].split("-")
    for count in range(len(parts) - 1, 0, -1):
        names.append("-".join(parts[:count]) + f"-.{suffix}.d")
    names.append(f"{suffix}.d")
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class DropIn:
    path: str  # where it is (under the system root)
    root: str  # the search-path directory it is under, as systemd names it ("" when off the path)
    origin: str  # what put it there, and the fix

    @property
    def type_wide(self) -> bool:
        """A drop-in for every unit of its type (`service.d/`), not for this unit's name."""
        return bool(_TYPE_DIR_RE.match(os.path.basename(os.path.dirname(self.path))))

    @property
    def reported_only(self) -> bool:
        """A package's drop-in for every service (Fedora's service.d/10-timeout-abort.conf): not
        this deploy's to refuse, but named. Every other drop-in is refused."""
        return self.root in _VENDOR_ROOTS and self.type_wide


def _systemd_view(name: str, query: Callable[[list[str]], tuple[int, str, str]] | None) -> tuple[list[str], str]:
    """(DropInPaths, FragmentPath) as systemd itself reports them for the unit: what it loaded at
    the last daemon-reload. Nothing when systemctl cannot say (no systemd, a fake host)."""
    if query is None:
        return [], ""
    rc, out, _err = query([*DROPIN_QUERY, name])
    if rc != 0:
        return [], ""
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return props.get("DropInPaths", "").split(), props.get("FragmentPath", "").strip()


def _root_of(path: str, sysroot: str) -> str:
    """The search-path directory a drop-in's directory sits in, as systemd names it."""
    directory = os.path.dirname(os.path.dirname(path))
    for root in UNIT_SEARCH_PATH:
        if directory == _under(sysroot, root):
            return root
    return ""


def _under(sysroot: str, path: str) -> str:
    return os.path.normpath(os.path.join(sysroot, path.lstrip("/")))


def unit_overrides(
    name: str,
    unit_dir: str,
    allowed: list[str],
    query: Callable[[list[str]], tuple[int, str, str]] | None = None,
    sysroot: str = "/",
) -> tuple[list[DropIn], list[DropIn], list[str]]:
    """What changes the unit behind the module's back: (refused drop-ins, reported drop-ins,
    shadowing unit files).

    Drop-ins come from systemd's own `DropInPaths` (what it loaded) and from every drop-in
    directory of the unit's name, its dash prefixes and its type (dropin_dir_names) in `unit_dir`
    and on the whole search path (what the next daemon-reload loads). A file the inventory lists,
    by file name or full path, is neither refused nor reported. A unit file of this name in a
    directory systemd prefers to `unit_dir` (a transient unit, a control directory), or a
    `FragmentPath` there, shadows the deploy's: systemd would run that file instead. `sysroot`
    re-roots the search path (a test's made-up tree)."""
    loaded, fragment = _systemd_view(name, query)
    candidates = list(loaded)
    for root in dict.fromkeys((os.path.normpath(unit_dir), *(_under(sysroot, r) for r in UNIT_SEARCH_PATH))):
        for directory in (os.path.join(root, sub) for sub in dropin_dir_names(name)):
            try:
                entries = sorted(os.listdir(directory))
            except OSError:
                continue
            candidates += [os.path.join(directory, entry) for entry in entries if entry.endswith(".conf")]
    refused: list[DropIn] = []
    reported: list[DropIn] = []
    for path in dict.fromkeys(candidates):
        if os.path.basename(path) in allowed or path in allowed or os.path.realpath(path) == "/dev/null":
            continue  # listed; or masked, which changes nothing
        root = _root_of(path, sysroot)
        origin = _ORIGINS.get(root, "a package's drop-in: list it in dropins to keep it" if root else "remove it, or list it in dropins")
        dropin = DropIn(path, root, origin.format(unit=name))
        (reported if dropin.reported_only else refused).append(dropin)
    return refused, reported, _shadows(name, unit_dir, fragment, sysroot)


def _shadows(name: str, unit_dir: str, fragment: str, sysroot: str) -> list[str]:
    """Unit files of this name that systemd loads instead of unit_dir's."""
    ranked = [_under(sysroot, root) for root in UNIT_SEARCH_PATH]
    unit_dir = os.path.normpath(unit_dir)
    # A unit directory off the search path (a test's) ranks as /etc/systemd/system.
    rank = ranked.index(unit_dir) if unit_dir in ranked else UNIT_SEARCH_PATH.index("/etc/systemd/system")
    found = [os.path.join(root, name) for root in ranked[:rank] if os.path.lexists(os.path.join(root, name))]
    if fragment and fragment != os.path.join(unit_dir, name) and os.path.dirname(_under(sysroot, fragment)) in ranked[:rank]:
        found.append(_under(sysroot, fragment))
    return [path for path in dict.fromkeys(found) if os.path.realpath(path) != "/dev/null"]


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


def foreign_dropins(
    name: str, unit_dir: str, allowed: list[str], query: Callable[[list[str]], tuple[int, str, str]] | None = None, sysroot: str = "/"
) -> list[str]:
    """The paths of the drop-ins a deploy refuses (unit_overrides). The seeds' story: a forgotten
    bench.conf drop-in "made every frank-primary deploy since 2026-10-08 04:09 restart the staging
    worktree behind a green health gate"."""
    return [dropin.path for dropin in unit_overrides(name, unit_dir, allowed, query, sysroot)[0]]
