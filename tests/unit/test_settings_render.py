"""SearXNG's settings: secrets filled only from the allowlist, a loud failure naming every unresolved
placeholder and the file, 0600 owned by the service user, idempotent; the kagi engine as the
seeds set it."""

import os
import stat
from pathlib import Path

import jinja2
import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.settings_render import RenderError, ensure_rendered, render_placeholders
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = ("KAGI_API_KEY", "SEARXNG_SECRET", "SEARXNG_BASE_URL")
SECRETS = {"SEARXNG_SECRET": "lab-secret-3f9a1c", "KAGI_API_KEY": "kagi-lab-key-77e2", "SEARXNG_BASE_URL": "https://search.frank.invalid/"}


def role_template(**overrides) -> str:
    """The searxng role's settings.yml.j2 with its defaults, rendered as the controller renders it."""
    defaults = yaml.safe_load((ROOT / "roles" / "searxng" / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(keep_trailing_newline=True)
    env.filters["to_json"] = lambda value: yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    env.filters["to_nice_yaml"] = lambda value, indent=2: yaml.safe_dump(value, indent=indent, default_flow_style=False, sort_keys=False)
    template = env.from_string((ROOT / "roles" / "searxng" / "templates" / "settings.yml.j2").read_text())
    return template.render(ansible_managed="managed", **{**defaults, **overrides})


def test_the_placeholder_that_searxng_left_literal_is_filled():
    # Seed 001: "SearXNG does not expand env vars in settings.yml (the live secret_key literally was
    # '${SEARXNG_SECRET}' until now - the app tolerated the placeholder string silently)".
    text = render_placeholders(role_template(), SECRETS, ALLOWED, "/opt/searxng/config/settings.yml")
    settings = yaml.safe_load(text)
    assert settings["server"]["secret_key"] == "lab-secret-3f9a1c"
    assert settings["server"]["base_url"] == "https://search.frank.invalid/"
    assert "${" not in text


def test_every_unresolved_placeholder_and_the_file_are_named():
    # Seed 001: the renderer is "allowlisted to KAGI_API_KEY/SEARXNG_SECRET/SEARXNG_BASE_URL, fails
    # the deploy loudly on an unresolvable placeholder".
    template = 'a: "${SEARXNG_SECRET}"\nb: "${HOME}"\nc: "${KAGI_API_KEY}"\nd: "${HOME}"\n'
    with pytest.raises(RenderError) as error:
        render_placeholders(template, {"SEARXNG_SECRET": "s"}, ALLOWED, "/opt/searxng/config/settings.yml")
    assert str(error.value) == (
        "/opt/searxng/config/settings.yml: unresolved placeholders: ${HOME} (not on the allowlist KAGI_API_KEY, SEARXNG_SECRET, "
        "SEARXNG_BASE_URL); ${KAGI_API_KEY} (no value: set it from Ansible Vault)"
    )


def test_values_off_the_allowlist_and_values_that_break_yaml_are_refused_without_showing_them():
    with pytest.raises(RenderError, match=r"values for PATH, which are not on the allowlist"):
        render_placeholders('a: "${SEARXNG_SECRET}"', {"SEARXNG_SECRET": "s", "PATH": "/bin"}, ALLOWED, "f")
    with pytest.raises(RenderError) as error:
        render_placeholders('a: "${SEARXNG_SECRET}"', {"SEARXNG_SECRET": 'x"\nadmin: true'}, ALLOWED, "f")
    assert "${SEARXNG_SECRET} holds a quote" in str(error.value) and "admin" not in str(error.value)


def test_the_kagi_engine_is_bounded_as_the_seed_sets_it():
    # Seed 001: "kagi engine enabled (weight 2, kg shortcut, paging off so exactly one API credit per
    # aggregated query, timeout 8.0 vs 5.0 scrapers so a slow paid query is not a wasted credit);
    # api_key stays ${KAGI_API_KEY}."
    settings = yaml.safe_load(role_template())
    (kagi,) = [engine for engine in settings["engines"] if engine["name"] == "kagi"]
    expected = {"name": "kagi", "engine": "kagi", "shortcut": "kg", "api_key": "${KAGI_API_KEY}", "weight": 2, "paging": False, "timeout": 8.0}
    assert kagi == {**expected, "disabled": False}
    assert settings["outgoing"]["request_timeout"] == 5.0
    stub = {"name": "lab stub", "engine": "json_engine", "shortcut": "ls", "search_url": "http://127.0.0.1:1/?q={query}"}
    with_stub = yaml.safe_load(role_template(searxng_extra_engines=[stub], searxng_kagi_enabled=False))
    assert with_stub["engines"] == [stub]


def test_the_file_is_0600_owned_by_the_service_user_and_a_rerun_changes_nothing(tmp_path):
    dest = tmp_path / "settings.yml"
    content = 'server:\n  secret_key: "${SEARXNG_SECRET}"\n'
    params = {"content": content, "dest": str(dest), "values": SECRETS, "allowed": ALLOWED, "owner": "nobody", "group": "nogroup"}
    first = ensure_rendered(params, Host(lambda argv: (0, "", "")))
    assert first == {"changed": True, "content_changed": True, "dest": str(dest), "placeholders": ["SEARXNG_SECRET"]}
    info = os.stat(dest)
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 65534
    assert "lab-secret-3f9a1c" not in repr(first)
    assert ensure_rendered(params, Host(lambda argv: (0, "", ""))) == {**first, "changed": False, "content_changed": False}
    # A mode drift is fixed without a restart: the content did not change.
    os.chmod(dest, 0o644)
    fixed = ensure_rendered(params, Host(lambda argv: (0, "", "")))
    assert fixed["changed"] and not fixed["content_changed"] and stat.S_IMODE(os.stat(dest).st_mode) == 0o600


def test_an_unresolved_placeholder_fails_the_step_and_leaves_the_file(tmp_path):
    dest = tmp_path / "settings.yml"
    dest.write_text("old\n")
    params = {"content": 'a: "${KAGI_API_KEY}"\n', "dest": str(dest), "values": {}, "allowed": ALLOWED, "owner": "", "group": ""}
    with pytest.raises(StepError, match=r"settings.yml: unresolved placeholders: \$\{KAGI_API_KEY\} \(no value"):
        ensure_rendered(params, Host(lambda argv: (0, "", "")))
    assert dest.read_text() == "old\n"
