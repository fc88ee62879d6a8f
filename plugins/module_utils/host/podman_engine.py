# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An engine container, described once, turned into the argv a root unit runs.

- The image is pinned by digest: the local image's RepoDigests (or its own digest) must match.
- `podman run` stays in the foreground (a crashed engine makes ExecStart fail and the unit
  restarts it), clears its own name first (`--replace`: a unit restart that SIGKILLed conmon left
  the name registered), and removes the container on exit (`--rm`).
- A persistent cache directory is mounted and HOME points there (compile caches turn a 184 s
  start into 4 s; a root-owned HOME broke cache writes). The model directory is read-only.
- Least privilege by default: the engine runs as a non-root UID:GID with every capability
  dropped, no-new-privileges, a read-only root, and only the cache mount and a tmpfs /tmp
  writable; each option (user, cap_add, read_only, no_new_privileges, seccomp_unconfined)
  relaxes one of these where the inventory says so.
- GPUs: AMD (/dev/kfd, /dev/dri, the host's video and render GIDs) or NVIDIA (CDI devices).
- Runtime knobs that differ per host (runtime, cgroups mode, ulimits) are parameters.
- A label carries a keyed hash (HMAC-SHA256, a per-host key) of the whole configuration, so a
  change is visible on the container and the label reveals nothing about secret values.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.engine_python import ENGINE_PYTHON_DIR, wants_engine_python
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import ENGINE_OPTIONS, default

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# Digests an inventory writes to mark "pin this later": one hex digit repeated, or a short run
# repeated (0123456789abcdef..., deadbeef...). No image has one; refused before the host changes.
_PLACEHOLDER_DIGEST_RE = re.compile(r"^sha256:(?:([0-9a-f])\1{63}|(?:0123456789abcdef){4}|(?:deadbeef){8})$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_USER_RE = re.compile(r"^([0-9]+):([0-9]+)$")
_CAP_RE = re.compile(r"^(CAP_)?[A-Z][A-Z0-9_]*$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
LABEL_PREFIX = "io.frank.llm-fleet"
# /tmp is the only writable place besides the cache mount; compilers (torch inductor, g++) put
# their intermediates there, so it stays exec-able.
TMPFS_TMP = "/tmp:rw,nosuid,nodev,mode=1777"
# Flags that would undo a privilege default from extra_args: each has its own option (or none,
# for what the collection never grants).
_PRIVILEGE_FLAGS = {
    "--privileged": "the collection never runs a privileged engine",
    "--cap-add": "use cap_add",
    "--cap-drop": "every capability is dropped; use cap_add for the ones the engine needs",
    "--security-opt": "use no_new_privileges or seccomp_unconfined",
    "--user": "use user",
    "--group-add": "GPU groups come from gpu_vendor",
    "--read-only": "use read_only",
    "--read-only-tmpfs": "use read_only",
    "--userns": "the engine runs in the host's user namespace as a non-root user (see user)",
    "--pid": "the engine keeps its own PID namespace",
    "--uts": "the engine keeps its own UTS namespace",
    "--cgroupns": "the engine keeps its own cgroup namespace",
}
# `podman run` flags extra_args may carry: an allowlist, as a denylist of the dangerous ones was
# bypassed by every flag it did not know (`--volume=/:/host:U`, `--mount=type=bind,src=/,...`,
# `--device=/dev/sda`, `--annotation=...`). Each is resource limits, logging or process
# behaviour; nothing here adds a mount, a device, a namespace, a network, a privilege or an
# annotation: those have typed options (model_dir, cache_dir, gpu_devices, network, publish,
# user, cap_add, ...). True: the flag takes a value (`--flag=value` or `--flag value`).
ALLOWED_EXTRA_FLAGS: dict[str, bool] = {
    "--log-level": True,
    "--log-driver": True,
    "--log-opt": True,
    "--tz": True,
    "--init": False,
    "--memory": True,
    "--memory-reservation": True,
    "--memory-swap": True,
    "--memory-swappiness": True,
    "--cpus": True,
    "--cpuset-cpus": True,
    "--cpuset-mems": True,
    "--cpu-shares": True,
    "--pids-limit": True,
    "--stop-signal": True,
    "--workdir": True,
    "--hostname": True,
}
# podman 4.3 reads an env file with bufio.Scanner, whose longest line is 64 KiB with its newline.
ENV_LINE_MAX_BYTES = 64 * 1024 - 1


# Each engine's own UID (and GID), when the inventory gives none: one per container name, the same
# on every host and every deploy, in a range of its own (above the host's login users, below
# systemd's dynamic users at 61184). Engines sharing one UID could read each other's
# /proc/PID/environ (the API key) and caches.
ENGINE_UID_BASE = 30000
ENGINE_UID_SPAN = 20000


def engine_uid(name: str) -> int:
    """ENGINE_UID_BASE + the first 8 bytes of sha256(name) modulo ENGINE_UID_SPAN."""
    return ENGINE_UID_BASE + int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") % ENGINE_UID_SPAN


def engine_uid_of(name: str, user: str = "") -> int | None:
    """The UID an engine container runs as: its `user` (numeric UID:GID), else engine_uid(name);
    None for a user that is not numeric (refused elsewhere)."""
    if not user:
        return engine_uid(name)
    match = _USER_RE.match(user)
    return int(match.group(1)) if match else None


def uid_collisions(engines: dict[str, str]) -> list[tuple[str, str, int]]:
    """(name, other name, UID) for every two engines of one host that would share a UID: by their
    `user`, or by engine_uid's hash (20,000 UIDs: with a few dozen engines on one host, two can
    draw the same one). `engines` maps each container name to its `user` ("" for the default)."""
    seen: dict[int, str] = {}
    clashes = []
    for name in sorted(engines):
        uid = engine_uid_of(name, engines[name])
        if uid is None:
            continue
        if uid in seen:
            clashes.append((seen[uid], name, uid))
        else:
            seen[uid] = name
    return clashes


def free_engine_uid(taken: set[int], name: str) -> int:
    """A UID in the engines' range that none of `taken` uses, near the one the name hashes to."""
    start = engine_uid(name) - ENGINE_UID_BASE
    candidates = (ENGINE_UID_BASE + (start + step) % ENGINE_UID_SPAN for step in range(ENGINE_UID_SPAN))
    return next(uid for uid in candidates if uid not in taken)


class EngineError(ValueError):
    """An engine description that cannot be run safely; names the field."""


def control_character_problem(value: str) -> str | None:
    """Where a control character sits in `value` (the value itself is never quoted)."""
    match = _CONTROL_RE.search(value)
    return f"control character {match.group()!r} at offset {match.start()} is refused" if match else None


def check_path(name: str, value: str) -> None:
    """An absolute, normalised path without control characters; `name` is the field."""
    problem = control_character_problem(value)
    if problem:
        raise EngineError(f"{name}: {problem}")
    if not os.path.isabs(value) or ".." in value.split("/"):
        raise EngineError(f"{name}: give an absolute path without '..', not {value!r}")


@dataclass
class EngineContainer:
    name: str
    image: str  # repository[:tag], without the digest
    digest: str  # sha256:...
    command: list[str] = field(default_factory=lambda: default(ENGINE_OPTIONS, "command"))  # arguments after the image
    entrypoint: str | None = None
    model_dir: str = ""
    model_mount: str = default(ENGINE_OPTIONS, "model_mount")
    cache_dir: str = ""
    cache_mount: str = default(ENGINE_OPTIONS, "cache_mount")
    gpu_vendor: str = default(ENGINE_OPTIONS, "gpu_vendor")  # amd | nvidia | none
    gpu_devices: list[str] = field(default_factory=lambda: default(ENGINE_OPTIONS, "gpu_devices"))  # NVIDIA CDI names or extra device paths
    network: str = default(ENGINE_OPTIONS, "network")
    publish: list[str] = field(default_factory=lambda: default(ENGINE_OPTIONS, "publish"))
    ipc: str = default(ENGINE_OPTIONS, "ipc")
    shm_size: str = default(ENGINE_OPTIONS, "shm_size")
    ulimits: list[str] = field(default_factory=lambda: default(ENGINE_OPTIONS, "ulimits"))
    environment: dict[str, str] = field(default_factory=lambda: default(ENGINE_OPTIONS, "environment"))
    runtime: str = default(ENGINE_OPTIONS, "runtime")
    cgroups: str = default(ENGINE_OPTIONS, "cgroups")
    stop_timeout: int = default(ENGINE_OPTIONS, "stop_timeout")
    extra_args: list[str] = field(default_factory=lambda: default(ENGINE_OPTIONS, "extra_args"))
    labels: dict[str, str] = field(default_factory=lambda: default(ENGINE_OPTIONS, "labels"))
    user: str = default(ENGINE_OPTIONS, "user")
    cap_add: list[str] = field(default_factory=lambda: default(ENGINE_OPTIONS, "cap_add"))
    read_only: bool = default(ENGINE_OPTIONS, "read_only")
    no_new_privileges: bool = default(ENGINE_OPTIONS, "no_new_privileges")
    seccomp_unconfined: bool = default(ENGINE_OPTIONS, "seccomp_unconfined")
    # Not an option: the host's numeric video and render GIDs (AMD), which ensure_engine looks up.
    # Rootful podman keeps the host's GIDs on device nodes, while --group-add NAME would resolve
    # the name in the image's /etc/group (a different GID, or none).
    gpu_gids: list[int] = field(default_factory=list)
    # Not an option: the digest of the collection's engine-side Python the container mounts
    # (engine_python.py); in the config hash, so a new key guard restarts the engine.
    engine_python_digest: str = ""

    def validate(self) -> None:
        self._refuse_control_characters()
        if not _NAME_RE.match(self.name):
            raise EngineError(f"name: {self.name!r} is not a valid container name")
        if "@" in self.image:
            raise EngineError("image: give the repository (and tag) without '@'; the digest goes in digest")
        if not _IMAGE_RE.match(self.image):
            raise EngineError(f"image: {self.image!r} is not a repository[:tag]")
        if not _DIGEST_RE.match(self.digest):
            raise EngineError(f"digest: expected sha256:<64 hex>, got {self.digest!r}")
        if _PLACEHOLDER_DIGEST_RE.match(self.digest):
            raise EngineError(
                f"digest: {self.digest} is a placeholder, not the digest of {self.image}: pin the deployed image's digest "
                f"(podman image inspect {self.image} --format '{{{{.Digest}}}}' on the host) in endpoint_image_digest"
            )
        for key in ("model_dir", "model_mount", "cache_dir", "cache_mount"):
            value = getattr(self, key)
            if value:
                check_path(key, value)
                if ":" in value or "," in value:
                    raise EngineError(f"{key}: ':' and ',' are refused (they separate --volume fields), in {value!r}")
        if self.shm_size and self.ipc == "host":
            raise EngineError(
                "shm_size: podman cannot size /dev/shm in the host's IPC namespace (ipc host, the default): "
                "drop shm_size (the engine then shares the host's /dev/shm) or set ipc to private"
            )
        if self.gpu_vendor not in ("amd", "nvidia", "none"):
            raise EngineError(f"gpu_vendor: amd, nvidia or none, not {self.gpu_vendor!r}")
        for key in self.environment:
            if not _ENV_KEY_RE.match(key):
                raise EngineError(f"environment: {key!r} is not a valid variable name")
        for index, arg in enumerate(self.command + self.extra_args):
            if not isinstance(arg, str):
                raise EngineError(f"command[{index}]: every argument must be a string")
        check_extra_args(self.extra_args)
        for key in self.labels:
            if "=" in key or not key:
                raise EngineError(f"labels: {key!r} is not a label name")
        self.uid_gid()
        for index, cap in enumerate(self.cap_add):
            if cap.upper() in ("ALL", "CAP_ALL") or not _CAP_RE.match(cap.upper()):
                raise EngineError(f"cap_add[{index}]: name one capability (such as SYS_NICE), not {cap!r}")

    def _refuse_control_characters(self) -> None:
        """No control character reaches argv: each field is named, with its index or key."""
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "environment":
                continue  # render_podman_env_file checks values (naming the key, never the value)
            if isinstance(value, str):
                named = [(item.name, value)]
            elif isinstance(value, list):
                named = [(f"{item.name}[{index}]", str(element)) for index, element in enumerate(value)]
            elif isinstance(value, dict):
                named = [(f"{item.name}.{key}", f"{key}{element}") for key, element in value.items()]
            else:
                continue
            for name, text in named:
                problem = control_character_problem(text)
                if problem:
                    raise EngineError(f"{name}: {problem}")

    def uid_gid(self) -> tuple[int, int]:
        """The numeric UID and GID the engine runs as (the cache directory is owned by them): the
        given `user`, or (empty) one of this engine's own, derived from its name (engine_uid)."""
        if not self.user:
            uid = engine_uid(self.name)
            return uid, uid
        match = _USER_RE.match(self.user)
        if not match:
            raise EngineError(f"user: give a numeric UID:GID such as 10001:10001 (the host's cache directory is chowned to it), not {self.user!r}")
        return int(match.group(1)), int(match.group(2))

    @property
    def image_ref(self) -> str:
        """Run by digest: a retag on the host cannot swap the engine under the unit."""
        repository = self.image.rsplit(":", 1)[0] if ":" in self.image.rsplit("/", 1)[-1] else self.image
        return f"{repository}@{self.digest}"

    def config_hash(self, key: bytes) -> str:
        """Keyed hash of everything that shapes the container. Environment values are included
        so a changed value changes ExecStart and restarts the unit; the key (root-only, per
        host) keeps a value from being recovered by hashing guesses against the label."""
        fields_ = asdict(self)
        if not fields_["engine_python_digest"]:
            del fields_["engine_python_digest"]  # an engine without it keeps the hash it had
        data = json.dumps(fields_, sort_keys=True).encode()
        return hmac.new(key, data, hashlib.sha256).hexdigest()[:32]

    def run_argv(self, hash_key: bytes, env_file: str | None = None) -> list[str]:
        """The foreground `podman run` a root unit's ExecStart runs."""
        self.validate()
        argv = ["/usr/bin/podman", "run", "--rm", "--replace", "--name", self.name]
        if self.runtime:
            argv += ["--runtime", self.runtime]
        if self.cgroups:
            argv += [f"--cgroups={self.cgroups}"]
        argv += self._privilege_args()
        argv += [f"--network={self.network}"]
        for port in self.publish:
            argv += ["--publish", port]
        if self.ipc:
            argv += [f"--ipc={self.ipc}"]
        if self.shm_size:
            argv += [f"--shm-size={self.shm_size}"]
        for limit in self.ulimits:
            argv += ["--ulimit", limit]
        if self.model_dir:
            argv += ["--volume", f"{self.model_dir}:{self.model_mount}:ro"]
        if self.cache_dir:
            argv += ["--volume", f"{self.cache_dir}:{self.cache_mount}:rw", "--env", f"HOME={self.cache_mount}"]
            argv += ["--env", f"XDG_CACHE_HOME={self.cache_mount}"]
        if wants_engine_python(self.environment):
            # The collection's engine-side Python (vLLM's key guard), read-only at the same path.
            argv += ["--volume", f"{ENGINE_PYTHON_DIR}:{ENGINE_PYTHON_DIR}:ro"]
        argv += self._gpu_args()
        if env_file:
            # Values live in a root-only file, not on the command line (ps would show them).
            argv += ["--env-file", env_file]
        labels = {f"{LABEL_PREFIX}.engine": self.name, f"{LABEL_PREFIX}.config-hash": self.config_hash(hash_key), **self.labels}
        for key in sorted(labels):
            argv += ["--label", f"{key}={labels[key]}"]
        argv += [f"--stop-timeout={self.stop_timeout}"]
        if self.entrypoint:
            argv += ["--entrypoint", self.entrypoint]
        argv += self.extra_args
        argv.append(self.image_ref)
        argv += self.command
        return argv

    def _privilege_args(self) -> list[str]:
        uid, gid = self.uid_gid()
        argv = [f"--user={uid}:{gid}", "--cap-drop=all"]
        argv += [f"--cap-add={cap.upper()}" for cap in self.cap_add]
        if self.no_new_privileges:
            argv += ["--security-opt=no-new-privileges"]
        if self.seccomp_unconfined:
            argv += ["--security-opt=seccomp=unconfined"]
        if self.read_only:
            # podman's --read-only alone would also leave /run, /var/tmp and /dev writable.
            argv += ["--read-only", "--read-only-tmpfs=false", f"--tmpfs={TMPFS_TMP}"]
        return argv

    def _gpu_args(self) -> list[str]:
        argv: list[str] = []
        if self.gpu_vendor == "amd":
            argv += ["--device", "/dev/kfd", "--device", "/dev/dri"]
            argv += [f"--group-add={gid}" for gid in self.gpu_gids]
        elif self.gpu_vendor == "nvidia":
            for device in self.gpu_devices or ["nvidia.com/gpu=all"]:
                argv += ["--device", device]
            return argv
        for device in self.gpu_devices:
            argv += ["--device", device]
        return argv

    def stop_argv(self) -> list[str]:
        return ["/usr/bin/podman", "stop", "--ignore", "-t", str(self.stop_timeout), self.name]

    def cleanup_argv(self) -> list[str]:
        """Remove exactly this container name (a stale registration), nothing else."""
        return ["/usr/bin/podman", "rm", "--force", "--ignore", "--time", "0", self.name]


def check_extra_args(extra_args: list[str]) -> None:
    """Every element of extra_args is an allowed flag (ALLOWED_EXTRA_FLAGS) or the value of the one
    before it; anything else is refused, naming the element and the option to use instead."""
    index = 0
    allowed = ", ".join(sorted(ALLOWED_EXTRA_FLAGS))
    while index < len(extra_args):
        arg = extra_args[index]
        flag, has_value, _value = arg.partition("=")
        why = _PRIVILEGE_FLAGS.get(flag) or (_PRIVILEGE_FLAGS["--user"] if re.match(r"^-u", arg) else None)
        if why:
            raise EngineError(f"extra_args[{index}]: {flag} is refused here: {why}")
        if flag not in ALLOWED_EXTRA_FLAGS:
            what = "a bare value (it would be read as the image)" if not arg.startswith("-") else f"{flag} is not an allowed podman flag"
            raise EngineError(
                f"extra_args[{index}]: {what}; extra_args takes only {allowed} (mounts, devices, ports, networks, users and "
                "capabilities come from their own options: model_dir, cache_dir, gpu_devices, publish, network, user, cap_add)"
            )
        takes_value = ALLOWED_EXTRA_FLAGS[flag]
        if has_value and not takes_value:
            raise EngineError(f"extra_args[{index}]: {flag} takes no value")
        if takes_value and not has_value:
            if index + 1 >= len(extra_args):
                raise EngineError(f"extra_args[{index}]: {flag} needs a value (give {flag}=VALUE)")
            index += 1
        index += 1


def digest_verdict(inspect: list[dict[str, Any]] | None, image: str, pinned: str) -> tuple[bool, str]:
    """Does the local image match the pinned digest? (ok, message naming expected and actual)."""
    if not inspect:
        return False, f"image {image} is not present locally (expected digest {pinned}); load or pull it first"
    record = inspect[0]
    digests = [d.split("@", 1)[1] for d in record.get("RepoDigests") or [] if "@" in d]
    own = record.get("Digest")
    candidates = digests + ([own] if own else [])
    if pinned in candidates:
        return True, f"image {image} matches {pinned}"
    return False, f"image {image} has digest {', '.join(candidates) or 'none'}; expected {pinned}"


def env_value_problem(value: str) -> str | None:
    """Why podman versions would read `KEY=value` differently, or None when every version reads
    the value byte for byte. podman 4.3 (the lab's) and every release but one take everything
    after the first '=' literally; 4.7.0 alone parsed dotenv-style (containers/podman 170a78631b,
    reverted in 4.7.1 by 297a66c303): there an empty value passes the host's variable
    through, '#' starts a comment, and a value opening with a quote may run on over the next
    lines. tests/hostile/test_engine_hostile.py ports both parsers and checks the rule."""
    if value == "":
        return "an empty value is refused (podman 4.7.0 reads KEY= as 'pass the host's KEY through'); leave the key out"
    problem = control_character_problem(value)
    if problem:
        return f"{problem} (an env file line cannot carry it)"
    if "#" in value:
        return "'#' is refused (podman 4.7.0 ends the value there; 4.3 keeps it)"
    if value.lstrip(" ")[:1] in ('"', "'", "`"):
        return "a value opening with a quote is refused (podman 4.7.0 strips the quotes or reads on over the next lines; 4.3 keeps them)"
    return None


def render_podman_env_file(environment: dict[str, str]) -> str:
    """One `KEY=value` line per variable, written so that every podman version reads each value
    byte for byte (env_value_problem); a value they would read differently is refused, naming
    its key and never the value."""
    lines = []
    for key in sorted(environment):
        value = environment[key]
        if not _ENV_KEY_RE.match(key):
            raise EngineError(f"environment: {key!r} is not a valid variable name")
        problem = env_value_problem(value)
        if problem:
            raise EngineError(f"environment.{key}: {problem}")
        line = f"{key}={value}"
        if len(line.encode("utf-8")) > ENV_LINE_MAX_BYTES:
            raise EngineError(f"environment.{key}: the line is longer than {ENV_LINE_MAX_BYTES} bytes (podman 4.3 cannot read it)")
        lines.append(line)
    return "\n".join(lines) + "\n"
