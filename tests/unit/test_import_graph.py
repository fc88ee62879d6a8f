"""The collection's own import graph, read with ast from every .py under plugins/.

- no circle among the collection's modules; imports inside functions (lazy ones) and under
  `if TYPE_CHECKING:` count like any other;
- module_utils never imports plugin_utils: modules run on the managed host, where plugin_utils is
  not shipped;
- module_utils imports nothing of Ansible but ansible.module_utils (only module_entry.py, the
  modules' entry point, imports it: the core runs under pytest without Ansible);
- every import of the collection names a module or package that exists;
- module_utils is built in layers (LAYERS): an import goes to its own layer or a lower one, never
  up.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "plugins"
PREFIX = "ansible_collections.frank.llm_fleet."
MODULE_UTILS = PREFIX + "plugins.module_utils"
PLUGIN_UTILS = PREFIX + "plugins.plugin_utils"

# module_utils' packages and ground modules by layer, lowest first: an import may go to its own
# layer or a lower one, never up. A name here that does not exist yet holds its place (runtimes:
# the runtime drivers, above what they build on and below the host steps that call them).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("sizes", "files", "host_runner", "step_error", "module_entry", "devices"),
    ("shape",),
    ("budget", "payload", "relay", "clients", "browser"),
    ("runtimes",),
    ("measure",),
    ("host",),
    # qualify: the ladder above everything a rung uses (pricing, boot, probe, the host steps).
    ("qualify",),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return PREFIX + ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imported_names(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every import in the file, nested ones included;
    relative imports are made absolute."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    here = module_name(path)
    package = here if is_package(path) else here.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((module, [alias.name for alias in node.names], node.lineno))
    return found


def collection_files() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PLUGINS.rglob("*.py"))}


def resolve(module: str, names: list[str], known: dict[str, Path]) -> list[str]:
    """The collection modules an import loads: `from pkg import mod` loads pkg.mod, `from mod
    import name` loads mod. Packages that are namespaces (no __init__.py) load nothing."""
    targets = []
    for name in names or [""]:
        candidate = f"{module}.{name}" if name else module
        if candidate in known:
            targets.append(candidate)
        elif module in known:
            targets.append(module)
    return sorted(set(targets))


def build_graph() -> tuple[dict[str, set[str]], list[str]]:
    """Edges among the collection's modules, and the imports of the collection that name nothing."""
    known = collection_files()
    graph: dict[str, set[str]] = {name: set() for name in known}
    unresolved = []
    for name, path in known.items():
        for module, names, line in imported_names(path):
            if not module.startswith(PREFIX):
                continue
            targets = resolve(module, names, known)
            if not targets and not (PLUGINS / Path(*module[len(PREFIX) :].split(".")[1:])).is_dir():
                unresolved.append(f"{path.relative_to(ROOT)}:{line}: {module}")
            graph[name].update(targets)
    return graph, unresolved


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One concrete circle (first node repeated at the end) per strongly connected component that
    has one (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    components.append(sorted(component))
    return [_circle(graph, component) for component in components]


def _circle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest path from the component's first node back to itself, inside the component."""
    start = component[0]
    members = set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node]):
            if child == start:
                return paths[node] + [start]
            if child in members and child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    raise AssertionError(f"no circle found in {component}")


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def short(name: str) -> str:
    return name.removeprefix(PREFIX + "plugins.")


def test_the_graph_is_read():
    graph, unresolved = build_graph()
    assert not unresolved, "imports of the collection that name no module or package:\n" + "\n".join(unresolved)
    edges = sum(len(targets) for targets in graph.values())
    utils = [name for name in graph if name.startswith((MODULE_UTILS, PLUGIN_UTILS))]
    assert len(utils) > 20 and edges > 40, f"only {edges} edges among {len(graph)} files: is the parser reading the imports?"


def test_no_import_circle():
    graph, _unresolved = build_graph()
    circles = find_cycles(graph)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(short(n) for n in circle) for circle in circles)


def test_the_circle_finder_names_the_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_module_utils_never_imports_plugin_utils_or_ansible_beyond_module_utils():
    problems = []
    for name, path in collection_files().items():
        if not name.startswith(MODULE_UTILS):
            continue
        for module, names, line in imported_names(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            # `from a import b` may load the module a.b: judge what each name can load.
            loaded = [f"{module}.{n}" for n in names] or [module]
            if any(under(m, PLUGIN_UTILS) for m in loaded):
                problems.append(f"{where}: imports {module} (plugin_utils is controller-only)")
            if any(under(m, "ansible") and not under(m, "ansible.module_utils") for m in loaded):
                problems.append(f"{where}: imports {module} (module_utils may use ansible.module_utils only)")
    assert not problems, "\n".join(problems)


def unit_of(module: str) -> str:
    """The package or ground module of module_utils a module belongs to: `host` for host.probe."""
    return module[len(MODULE_UTILS) + 1 :].split(".")[0]


def layer_of(unit: str) -> int | None:
    return next((number for number, members in enumerate(LAYERS) if unit in members), None)


def upward_imports(imports: list[tuple[str, str, str]]) -> list[str]:
    """(importing module, imported module, file:line) -> one line per import that climbs a layer,
    naming the place and the two packages."""
    problems = []
    for source, target, where in imports:
        low, high = layer_of(unit_of(target)), layer_of(unit_of(source))
        if low is not None and high is not None and low > high:
            problems.append(f"{where}: {unit_of(source)} (layer {high}) imports {unit_of(target)} (layer {low}), a higher layer")
    return problems


def module_utils_imports() -> list[tuple[str, str, str]]:
    """Every import from one module_utils module to another, lazy ones included."""
    known = collection_files()
    found = []
    for name, path in known.items():
        if not under(name, MODULE_UTILS):
            continue
        for module, names, line in imported_names(path):
            found += [(name, target, f"{path.relative_to(ROOT)}:{line}") for target in resolve(module, names, known) if under(target, MODULE_UTILS)]
    return found


def test_every_module_utils_package_has_a_layer():
    units = {unit_of(name) for name in collection_files() if name.startswith(MODULE_UTILS + ".")}
    missing = sorted(unit for unit in units if layer_of(unit) is None)
    assert not missing, f"module_utils packages or modules in no layer of LAYERS (place each in the lowest layer its imports allow): {missing}"
    named = [unit for members in LAYERS for unit in members]
    assert len(named) == len(set(named)), f"a name in two layers: {named}"


def test_imports_never_climb_a_layer():
    imports = module_utils_imports()
    assert len(imports) > 40, f"only {len(imports)} imports inside module_utils: is the parser reading them?"
    problems = upward_imports(imports)
    assert not problems, "imports that climb a layer (LAYERS, lowest first):\n" + "\n".join(problems)


def test_the_layer_check_names_the_file_and_both_packages():
    mu = MODULE_UTILS + "."
    imports = [
        (mu + "payload.generations", mu + "host.records", "plugins/module_utils/payload/generations.py:33"),
        (mu + "host.records", mu + "payload.generations", "plugins/module_utils/host/records.py:15"),
        (mu + "budget.ledger", mu + "payload.manifest", "plugins/module_utils/budget/ledger.py:9"),
        (mu + "shape.model", mu + "sizes", "plugins/module_utils/shape/model.py:20"),
    ]
    assert upward_imports(imports) == ["plugins/module_utils/payload/generations.py:33: payload (layer 2) imports host (layer 5), a higher layer"]
