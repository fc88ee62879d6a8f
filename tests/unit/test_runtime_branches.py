"""Nothing outside runtimes/ branches on a runtime's name or its shape class.

A runtime is one driver in plugins/module_utils/runtimes/ (registry.py names them); every other
file reaches a runtime's knowledge through the driver's interface. This test reads every Python
file under plugins/ (and the roles' and playbooks' YAML and template files) and fails on:
- a string literal equal to a registered runtime's name (a comparison, a table key, a loop), or
  one of its metric namespace (`llamacpp:...`: the driver names its series),
- a reference to a runtime's shape class or driver class by name,
- a role or playbook expression comparing `runtime` with a literal.
Help texts and docstrings are prose, not branches: only whole-string literals count.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import DRIVERS

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "plugins"
RUNTIMES_DIR = PLUGINS / "module_utils" / "runtimes"


def runtime_names() -> set[str]:
    return set(DRIVERS)


def runtime_class_names() -> set[str]:
    names = set()
    for runtime in DRIVERS.values():
        names.add(type(runtime).__name__)
        names.add(runtime.shape_class.__name__)
    return names


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if ROOT in path.parents else path.name


def branches_in_python(path: Path, names: set[str], classes: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"{shown(path)}:{node.lineno}: the runtime name {node.value!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and any(node.value.startswith(f"{name}:") for name in names):
            found.append(f"{shown(path)}:{node.lineno}: a series of a runtime's metric namespace {node.value!r}")
        elif isinstance(node, ast.Name) and node.id in classes:
            found.append(f"{shown(path)}:{node.lineno}: {node.id}")
        elif isinstance(node, ast.alias) and node.name in classes:
            found.append(f"{shown(path)}: imports {node.name}")
    return found


_ROLE_BRANCH = re.compile(r"runtime\s*(?:\|\s*default\([^)]*\)\s*)?(?:==|!=|\bin\b)\s*['\"\[]")


def branches_in_roles(names: set[str]) -> list[str]:
    found = []
    for path in sorted([*(ROOT / "roles").rglob("*"), *(ROOT / "playbooks").rglob("*")]):
        if not path.is_file() or path.suffix not in (".yml", ".yaml", ".j2"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            if _ROLE_BRANCH.search(line) or any(re.search(rf"['\"]{re.escape(name)}['\"]", line) for name in names):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_branch_on_a_runtime_outside_its_driver():
    names, classes = runtime_names(), runtime_class_names()
    found = []
    for path in sorted(PLUGINS.rglob("*.py")):
        if RUNTIMES_DIR in path.parents:
            continue
        found += branches_in_python(path, names, classes)
    found += branches_in_roles(names)
    assert not found, "runtime knowledge outside plugins/module_utils/runtimes/ (move it into the driver):\n" + "\n".join(found)


def test_the_branch_finder_finds_branches(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from x import LlamaCppShape\n"
        "def f(shape):\n"
        "    if shape.runtime == 'llamacpp':\n"
        "        return isinstance(shape, VllmShape)\n"
        "    return {'vllm': 1, 'x': 'vllm:num_requests_running'}\n"
        '"""llamacpp in prose is fine"""\n',
        encoding="utf-8",
    )
    found = branches_in_python(sample, {"llamacpp", "vllm"}, {"LlamaCppShape", "VllmShape"})
    tails = [line.split(": ", 1)[1] for line in found]
    assert sorted(tails) == sorted(
        [
            "imports LlamaCppShape",
            "the runtime name 'llamacpp'",
            "VllmShape",
            "the runtime name 'vllm'",
            "a series of a runtime's metric namespace 'vllm:num_requests_running'",
        ]
    )
    assert _ROLE_BRANCH.search("if __endpoint_shape.runtime == 'llamacpp'")
    assert _ROLE_BRANCH.search("endpoint_shape.runtime | default('') == 'vllm'")
    assert not _ROLE_BRANCH.search("{{ __endpoint_shape.runtime }}")


def test_every_driver_declares_its_contract():
    for name, runtime in DRIVERS.items():
        assert name == runtime.name
        assert name == runtime.shape_class.RUNTIME
        assert runtime.api_key_env and runtime.in_flight_gauges and runtime.refusal.window, name
        assert all(gauge.startswith(f"{name}:") for gauge in runtime.in_flight_gauges), name
