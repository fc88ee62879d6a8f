# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An engine container, described once, turned into the argv a root unit runs.

- The image is pinned by digest: the local image's RepoDigests (or its own digest) must match.
- `podman run` stays in the foreground (a crashed engine makes ExecStart fail and the unit
  restarts it), clears its own name first (`--replace`: a unit restart that SIGKILLed conmon left
  the name registered), and removes the container on exit (`--rm`).
- A persistent cache directory is mounted and HOME points there (compile caches turn a 184 s
  start into 4 s; a root-owned HOME broke cache writes). The model directory is read-only.
- GPUs: AMD (/dev/kfd, /dev/dri, groups video and render) or NVIDIA (CDI devices).
- Runtime knobs that differ per host (runtime, cgroups mode, ulimits) are parameters.
- A label carries the hash of the whole configuration, so a change is visible on the container.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import ENGINE_OPTIONS, default

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
LABEL_PREFIX = "io.frank.llm-fleet"


class EngineError(ValueError):
    """An engine description that cannot be run safely; names the field."""


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

    def validate(self) -> None:
        if not _NAME_RE.match(self.name):
            raise EngineError(f"name: {self.name!r} is not a valid container name")
        if "@" in self.image:
            raise EngineError("image: give the repository (and tag) without '@'; the digest goes in digest")
        if not _DIGEST_RE.match(self.digest):
            raise EngineError(f"digest: expected sha256:<64 hex>, got {self.digest!r}")
        if self.shm_size and self.ipc == "host":
            raise EngineError(
                "shm_size: podman cannot size /dev/shm in the host's IPC namespace (ipc host, the default): "
                "drop shm_size (the engine then shares the host's /dev/shm) or set ipc to private"
            )
        if self.gpu_vendor not in ("amd", "nvidia", "none"):
            raise EngineError(f"gpu_vendor: amd, nvidia or none, not {self.gpu_vendor!r}")
        for key in self.environment:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise EngineError(f"environment: {key!r} is not a valid variable name")
        for index, arg in enumerate(self.command + self.extra_args):
            if not isinstance(arg, str):
                raise EngineError(f"command[{index}]: every argument must be a string")

    @property
    def image_ref(self) -> str:
        """Run by digest: a retag on the host cannot swap the engine under the unit."""
        repository = self.image.rsplit(":", 1)[0] if ":" in self.image.rsplit("/", 1)[-1] else self.image
        return f"{repository}@{self.digest}"

    def config_hash(self) -> str:
        """Hash of everything that shapes the container. Environment values are included so a
        changed value changes ExecStart and restarts the unit; only 16 hex digits of a sha256 over
        the whole configuration are exposed."""
        data = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(data).hexdigest()[:16]

    def run_argv(self, env_file: str | None = None) -> list[str]:
        """The foreground `podman run` a root unit's ExecStart runs."""
        self.validate()
        argv = ["/usr/bin/podman", "run", "--rm", "--replace", "--name", self.name]
        if self.runtime:
            argv += ["--runtime", self.runtime]
        if self.cgroups:
            argv += [f"--cgroups={self.cgroups}"]
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
        argv += self._gpu_args()
        if env_file:
            # Values live in a root-only file, not on the command line (ps would show them).
            argv += ["--env-file", env_file]
        labels = {f"{LABEL_PREFIX}.engine": self.name, f"{LABEL_PREFIX}.config-hash": self.config_hash(), **self.labels}
        for key in sorted(labels):
            argv += ["--label", f"{key}={labels[key]}"]
        argv += [f"--stop-timeout={self.stop_timeout}"]
        if self.entrypoint:
            argv += ["--entrypoint", self.entrypoint]
        argv += self.extra_args
        argv.append(self.image_ref)
        argv += self.command
        return argv

    def _gpu_args(self) -> list[str]:
        argv: list[str] = []
        if self.gpu_vendor == "amd":
            argv += ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video", "--group-add", "render"]
            argv += ["--security-opt", "seccomp=unconfined"]
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


def render_podman_env_file(environment: dict[str, str]) -> str:
    """podman's --env-file takes each line's value literally (no quotes, no expansion)."""
    lines = []
    for key in sorted(environment):
        value = environment[key]
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise EngineError(f"environment: {key!r} is not a valid variable name")
        if "\n" in value or "\r" in value or "\0" in value:
            raise EngineError(f"environment.{key}: newlines and NUL are refused (an env file line cannot carry them)")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"
