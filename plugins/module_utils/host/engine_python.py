# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Python the collection runs inside an engine (vLLM's key guard): written root-owned and
read-only to ENGINE_PYTHON_DIR on the host, mounted read-only at the same path into a container,
and found through PYTHONPATH, which the runtime's driver sets to that directory. A step installs
the files only for an engine whose environment names the directory, so other engines get
neither the files nor the mount."""

from __future__ import annotations

import hashlib
import importlib
import os

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes import vllm_key_guard

ENGINE_PYTHON_DIR = "/usr/local/lib/llm-fleet/engine-python"
# The file name in ENGINE_PYTHON_DIR (the module name vLLM imports) -> the collection's source.
ENGINE_PYTHON_FILES = {"llm_fleet_vllm_key_guard.py": vllm_key_guard.__name__}


def wants_engine_python(environment: dict[str, str], directory: str = ENGINE_PYTHON_DIR) -> bool:
    return environment.get("PYTHONPATH") == directory


def engine_python_source(module: str) -> str:
    """The module's source text, from a file or from the zip a module runs from."""
    imported = importlib.import_module(module)
    loader = getattr(imported.__spec__, "loader", None)
    source = loader.get_source(module) if loader is not None and hasattr(loader, "get_source") else None
    if source is None:
        with open(str(imported.__file__), encoding="utf-8") as handle:
            source = handle.read()
    return source


def engine_python_digest() -> str:
    """SHA-256 over the files' names and sources: what a container's config hash includes."""
    digest = hashlib.sha256()
    for file_name, module in sorted(ENGINE_PYTHON_FILES.items()):
        digest.update(f"{file_name}\0{engine_python_source(module)}\0".encode())
    return digest.hexdigest()


def ensure_engine_python(host: Host, directory: str = ENGINE_PYTHON_DIR) -> bool:
    """Write each file whose bytes differ (mode 0644, the directory 0755); True when any did."""
    changed = False
    for file_name, module in ENGINE_PYTHON_FILES.items():
        path = f"{directory}/{file_name}"
        source = engine_python_source(module)
        if read_text(path) != source or _mode(path) != 0o644:
            host.write(path, source, 0o644)
            changed = True
    return changed


def _mode(path: str) -> int | None:
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None
