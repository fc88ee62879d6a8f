"""The documentation a user installs (the built tarball): every relative link resolves inside it,
every collection path it names in backticks is in it, the development tree it cannot hold is
named no more often than today (a ratchet: the maintainers' pages may describe it), the metadata
points nowhere invented, and the licence is the one galaxy.yml declares."""

import os
import re
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A path of the collection named in backticks: it must be in the tarball.
SHIPPED_PATH = re.compile(r"`((?:plugins|roles|docs|playbooks|inventories/example|bin|meta|observability)/[A-Za-z0-9_./-]*)`")
# The development tree, which the tarball does not hold (galaxy.yml build_ignore).
DEV_TREE = "lab|tests|scripts|benchmarks|molecule|inventories/production|inventories/lab|docs/fleet|changelogs/fragments"
DEV_PATH = re.compile(rf"(?<![\w/.-])(?:{DEV_TREE})/[A-Za-z0-9_./-]*")
# Named in the docs though not shipped, and why.
NOT_SHIPPED = {
    ("docs/qualify.md", "playbooks/qualify.yml"): "the page names it as not written yet",
    ("docs/migration.md", "playbooks/deploy-primary.yml"): "the checkout's links for the old paths",
    ("docs/migration.md", "playbooks/deploy-fleet.yml"): "the checkout's links for the old paths",
    ("docs/roles.md", "playbooks/deploy-primary.yml"): "the checkout's links for the old paths",
    ("docs/roles.md", "playbooks/lab-check.yml"): "the lab's own check, in a checkout",
    ("README.md", "docs/fleet"): "the maintainers' fleet pages, named as the source tree's",
    ("docs/architecture.md", "docs/fleet"): "the maintainers' fleet pages, named as the source tree's",
    ("docs/observability.md", "docs/fleet"): "the maintainers' fleet pages, named as the source tree's",
}
# Today's references to the development tree per page; a page may only lose them. The user's pages
# (the README's user path, shape, plugins, roles) carry none. The pages of measurement on the lab
# (lab, bench, vram_budget, qualify) name the lab's scripts by design and are not counted.
LAB_PAGES = {"docs/lab.md", "docs/bench.md", "docs/vram_budget.md", "docs/qualify.md"}
DEV_REFERENCES = {
    "README.md": 16,
    "docs/architecture.md": 14,
    # The page documents building and checking this tree's EE (make ee, make ee-check): its scripts.
    "docs/awx.md": 15,
    "docs/browser_gate.md": 2,
    "docs/companions.md": 7,
    "docs/engine_units.md": 8,
    "docs/gpu_facts.md": 2,
    "docs/hf_payload_gate.md": 10,
    "docs/migration.md": 4,
    "docs/observability.md": 3,
    "docs/openwebui.md": 3,
    "docs/plugins/browser_gate.md": 1,
    "docs/roles.md": 8,
    "docs/security.md": 5,
    "roles/webhook_relay/README.md": 1,
}
# Module documentation this check may not reach yet, and why.
INVENTED_URL_PENDING: dict[str, str] = {}


@pytest.fixture(scope="module")
def shipped(collection_tarball, tmp_path_factory):
    out = tmp_path_factory.mktemp("shipped")
    with tarfile.open(collection_tarball) as tar:
        tar.extractall(out, filter="data")
    return out


def pages(root: Path) -> dict[str, str]:
    """Each shipped Markdown page (CHANGELOG aside: history), HTML comments removed (not shown)."""
    return {
        path.relative_to(root).as_posix(): re.sub(r"<!--.*?-->", "", path.read_text(), flags=re.S)
        for path in sorted(root.rglob("*.md"))
        if path.name != "CHANGELOG.md"
    }


def test_every_relative_link_in_the_shipped_docs_resolves_inside_the_tarball(shipped):
    broken = []
    for page, text in pages(shipped).items():
        for target in LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            resolved = os.path.normpath(shipped / Path(page).parent / target.split("#", 1)[0])
            if not resolved.startswith(str(shipped)) or not os.path.exists(resolved):
                broken.append(f"{page}: ({target})")
    assert broken == []


def test_every_collection_path_the_docs_name_is_shipped(shipped):
    missing = []
    for page, text in pages(shipped).items():
        for named in SHIPPED_PATH.findall(text):
            path = named.rstrip("/.")
            if re.search(r"\b[A-Z]{3,}\b", path):
                continue  # a pattern (observability/exported/NAME.metrics), not a path
            candidates = [path, f"{path}.py", f"{path}.yml"]
            if (page, path) in NOT_SHIPPED or any((shipped / candidate).exists() for candidate in candidates):
                continue
            missing.append(f"{page}: `{named}`")
    assert missing == [], "ship it, name it as the source tree's, or add it to NOT_SHIPPED with why"


def test_the_development_tree_is_named_no_more_than_before(shipped):
    counts = {page: len(DEV_PATH.findall(text)) for page, text in pages(shipped).items() if page not in LAB_PAGES}
    grown = {page: (count, DEV_REFERENCES.get(page, 0)) for page, count in counts.items() if count > DEV_REFERENCES.get(page, 0)}
    assert grown == {}, "a user cannot open these (page: (now, allowed)); name the rule, not the source file"
    for page in ("docs/shape.md", "docs/index.md", "inventories/example/README.md"):
        assert counts.get(page, 0) == 0, page


def test_the_readme_puts_the_users_path_right_after_its_two_commands(shipped):
    readme = (shipped / "README.md").read_text()
    headings = re.findall(r"^## (.+)$", readme, re.M)
    assert headings[0] == "Install from the tarball", headings
    section = readme.split("## Install from the tarball\n", 1)[1].split("\n## ", 1)[0]
    assert "bin/llm-fleet" in section and "PYTHONPATH" not in section
    assert "callbacks_enabled = frank.llm_fleet.deploy_plan" in section


def test_no_invented_url_and_a_licence_matching_galaxy_yml(shipped):
    invented = []
    for path in sorted(shipped.rglob("*")):
        relative = path.relative_to(shipped).as_posix()
        if not path.is_file() or relative.startswith("inventories/example/") or relative in INVENTED_URL_PENDING:
            continue
        text = path.read_text(errors="replace")
        if re.search(r"https?://[^\s\"')]*example\.invalid", text):
            invented.append(relative)
    assert invented == []
    manifest = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert "example.invalid" not in str({key: manifest.get(key) for key in ("repository", "documentation", "homepage", "issues")})
    assert manifest["license"] == ["GPL-3.0-or-later"]
    licence = (shipped / "LICENSE").read_text()
    assert "GNU GENERAL PUBLIC LICENSE" in licence and "Version 3, 29 June 2007" in licence


def test_execution_environment_builders_find_the_collections_dependencies(shipped):
    spec = yaml.safe_load((shipped / "meta" / "execution-environment.yml").read_text())
    assert spec["version"] == 1
    python = (shipped / spec["dependencies"]["python"]).read_text()
    # What the controller side imports outside the standard library and ansible-core.
    for package in ("pyyaml", "jinja2", "matplotlib", "playwright"):
        assert re.search(rf"^{package}\b", python, re.M), package
    assert "chromium" in (shipped / spec["dependencies"]["system"]).read_text()
