"""The lab's real llama-server (engine image, podman): capture a boot log, or serve on loopback."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / ".lab" / "models"
CONTAINERS_CONF = ROOT / "lab" / "containers.conf"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def engine_image() -> str | None:
    """The lab engine image reference, or None when podman or the image is not here."""
    if shutil.which("podman") is None:
        return None
    ref = subprocess.run([str(ROOT / "lab" / "lab.sh"), "image-ref", "engine-llamacpp"], capture_output=True, text=True, check=True).stdout.strip()
    exists = subprocess.run(["podman", "image", "exists", ref], env=_env(), check=False)
    return ref if exists.returncode == 0 else None


def boot_log(image: str, model: str, args: list[str], until: str = "llama_kv_cache: size", timeout: float = 60) -> str:
    """Start llama-server on `model` with `args`, return its log once `until` has been printed."""
    name = f"llm-fleet-kvprobe-{uuid.uuid4().hex[:8]}"
    argv = [
        "podman", "run", "--rm", "--name", name, "--network", "none",
        "-v", f"{MODELS}:/models:ro", image,
        "-m", f"/models/{model}", "--port", "18999", "-lv", "4", *args,
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if until in line or time.monotonic() > deadline:
                break
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, env=_env(), check=False)
        proc.communicate(timeout=30)  # drain: a verbose engine blocks on a full pipe and never exits
    return "".join(lines)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving(image: str, model: str, args: list[str], timeout: float = 60) -> Iterator[str]:
    """llama-server on `model` with `args`, on a free loopback port; yields its base URL once
    /health answers 200, and removes the container afterwards."""
    name = f"llm-fleet-serve-{uuid.uuid4().hex[:8]}"
    port = free_port()
    argv = [
        "podman", "run", "-d", "--rm", "--name", name, "--network", "host",
        "-v", f"{MODELS}:/models:ro", image,
        "-m", f"/models/{model}", "--host", "127.0.0.1", "--port", str(port), "--metrics", *args,
    ]  # fmt: skip
    subprocess.run(argv, capture_output=True, text=True, env=_env(), check=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True, env=_env(), check=False)
                raise RuntimeError(f"llama-server did not become healthy:\n{logs.stdout[-2000:]}{logs.stderr[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, env=_env(), check=False)
