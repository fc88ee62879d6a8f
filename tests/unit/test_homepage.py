"""The homepage generated from the shapes: the cards and the model guide say what the clients'
models.yml fragments say, bad service entries are refused naming the field, and the output is
deterministic (a rerun of the role changes nothing)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.filter.fleet_site import fleet_endpoints, homepage_site, models_fragments, served_id_renames
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.fleet_artifacts import EndpointFacts
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.homepage import HomepageError, service_cards, site_files

# frank-secondary as the seeds' 004 era served it: 2 x 131,072 on llama-server with a projector
# (the vision path); the client window is ceiling - 45,056 (seed 004: "contextWindow 217088 ->
# 155648 = ceiling - 45056").
SECONDARY = {
    "runtime": "llamacpp",
    "model_file": "model.gguf",
    "projector": "mmproj.gguf",
    "ctx_size": 262144,
    "parallel": 2,
    "port": 7780,
    "served_id": "frank-zealot",
}
PRIMARY = {"runtime": "vllm", "model_file": "primary", "max_model_len": 200704, "max_num_seqs": 3, "port": 7770, "served_id": "frank-archon"}


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cards: list[str] = []
        self.docs_links: list[str] = []
        self.ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a" and "card" in (a.get("class") or "").split():
            self.cards.append(a["href"])
        if tag == "a" and "docs-link" in (a.get("class") or "").split():
            self.docs_links.append(a["href"])
        if a.get("id"):
            self.ids.append(a["id"])


def _hostvars(**hosts):
    return {name: {"ansible_host": "dankserver", **hv} for name, hv in hosts.items()}


def _site(services=None):
    hv = _hostvars(**{"frank-secondary": {"endpoint_shape": SECONDARY, "endpoint_api_key": "vaulted"}, "frank-primary": {"endpoint_shape": PRIMARY}})
    endpoints = fleet_endpoints(["frank-secondary", "frank-primary"], hv)
    return endpoints, homepage_site(endpoints, services, "frank fleet")


def test_cards_and_guide_follow_the_clients_fragments():
    endpoints, site = _site()
    fragments = {name: yaml.safe_load(text)["models"][0] for name, text in models_fragments(endpoints).items()}
    zealot = fragments["frank-secondary.models.yml"]
    archon = fragments["frank-primary.models.yml"]
    # The window the clients see: 131,072 per slot minus the 45,056 gap = 86,016; vLLM: 200,704 - 45,056.
    assert zealot["contextWindow"] == 131072 - 45056
    assert archon["contextWindow"] == 200704 - 45056
    docs = site["docs.html"]
    for entry in (zealot, archon):
        row = re.search(rf'<tr id="model-{entry["id"]}">(.*?)</tr>', docs).group(1)
        assert f"{entry['contextWindow']:,}" in row
        assert f"{entry['maxTokens']:,}" in row
        assert entry["baseUrl"] in row
    assert "text + image" in re.search(r'<tr id="model-frank-zealot">(.*?)</tr>', docs).group(1)
    assert "text + image" not in re.search(r'<tr id="model-frank-archon">(.*?)</tr>', docs).group(1)
    # A keyed endpoint names the variable, never the key.
    assert "FRANK_SECONDARY_API_KEY" in docs and "vaulted" not in json.dumps(site)


def test_every_card_links_somewhere_the_site_has():
    site = _site([{"name": "Search", "url": "https://search.example/", "audience": "user"}, {"name": "Grafana", "url": "/grafana/", "audience": "admin"}])[1]
    index, docs, admin = _Links(), _Links(), _Links()
    index.feed(site["index.html"])
    docs.feed(site["docs.html"])
    admin.feed(site["admin.html"])
    assert sorted(index.cards) == ["/docs#model-frank-archon", "/docs#model-frank-zealot", "https://search.example/"]
    assert admin.cards == ["/grafana/"]
    assert index.docs_links == ["/docs"] and admin.docs_links == ["/docs"]
    for href in index.cards:
        if href.startswith("/docs#"):
            assert href.split("#", 1)[1] in docs.ids
    assert "models" in docs.ids
    listed = json.loads(site["services.json"])
    assert [c["title"] for c in listed["admin"]] == ["Grafana"]
    assert {m["served_id"] for m in listed["models"]} == {"frank-zealot", "frank-archon"}


def test_output_is_deterministic_and_changes_with_the_shape():
    first = _site()[1]
    again = _site()[1]
    assert first == again
    hv = _hostvars(**{"frank-secondary": {"endpoint_shape": {**SECONDARY, "ctx_size": 196608}}, "frank-primary": {"endpoint_shape": PRIMARY}})
    changed = homepage_site(fleet_endpoints(["frank-secondary", "frank-primary"], hv))
    assert changed["docs.html"] != first["docs.html"]
    assert f"{98304 - 45056:,}" in changed["docs.html"]


def test_markup_in_a_description_is_escaped():
    site = _site([{"name": "<script>alert(1)</script>", "url": "/x", "description": '"><img src=x>'}])[1]
    assert "<script>alert" not in site["index.html"] and "&lt;script&gt;" in site["index.html"]
    assert "<img src=x>" not in site["index.html"]


@pytest.mark.parametrize(
    ("service", "field"),
    [
        ({"url": "/x"}, r"homepage_services\[0\]\.name: is required"),
        ({"name": "x"}, r"homepage_services\[0\]\.url: is required"),
        ({"name": "x", "url": "javascript:alert(1)"}, r"homepage_services\[0\]\.url: .* neither an http\(s\) URL nor a path"),
        ({"name": "x", "url": "//evil.example/"}, r"homepage_services\[0\]\.url: .* neither an http\(s\) URL nor a path"),
        ({"name": "x", "url": "/\\evil.example/"}, r"homepage_services\[0\]\.url: .* neither an http\(s\) URL nor a path"),
        ({"name": "x", "url": "https://admin:hunter2@grafana.example/"}, r"homepage_services\[0\]\.url: holds credentials \(user:password@host\);"),
        ({"name": "x", "url": "/x", "audience": "everyone"}, r"homepage_services\[0\]\.audience: 'everyone'; use one of user, admin"),
        ({"name": "x\ny", "url": "/x"}, r"homepage_services\[0\]\.name: contains a control character"),
        ({"name": "x", "url": "/x", "colour": "red"}, r"homepage_services\[0\]: unknown key\(s\) colour"),
    ],
)
def test_bad_service_entries_name_the_field(service, field):
    with pytest.raises(HomepageError, match=field):
        service_cards([service])


def test_one_id_per_model():
    facts = [EndpointFacts(name=n, host=n, address="h", shape={**SECONDARY, "port": p, "served_id": "same"}) for n, p in (("a", 1), ("b", 2))]
    with pytest.raises(HomepageError, match="endpoint_shape.served_id: same is served by more than one endpoint"):
        site_files(facts, [])


def test_renames_come_from_the_kept_records():
    hv = _hostvars(
        **{
            "frank-secondary": {
                "endpoint_shape": SECONDARY,
                "__endpoint_deploy": {"generations": [{"served_id": "frank-zealot"}, {"served_id": "frank-secondary"}, {"served_id": "frank-small"}]},
            },
            # frank-primary took frank-small's old id: it is not renamed away from it.
            "frank-primary": {"endpoint_shape": {**PRIMARY, "served_id": "frank-small"}},
        }
    )
    renames = served_id_renames(fleet_endpoints(["frank-secondary", "frank-primary"], hv))
    assert renames == [{"from": "frank-secondary", "to": "frank-zealot"}]


def _ensure(dest, files, check=False, diff=False):
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host.site_files import ensure_site
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host

    return ensure_site({"dest": str(dest), "files": files, "mode": "0644"}, Host(lambda argv: (0, "", ""), check), diff)


def test_site_files_write_once_and_only_what_changed(tmp_path):
    site = tmp_path / "site"
    first = _ensure(site, {"index.html": "a", "docs.html": "b"})
    assert first["changed"] and first["written"] == ["docs.html", "index.html"]
    assert _ensure(site, {"index.html": "a", "docs.html": "b"})["changed"] is False
    (site / "docs.html").chmod(0o600)
    assert _ensure(site, {"index.html": "a", "docs.html": "b"})["written"] == ["docs.html"]
    planned = _ensure(site, {"index.html": "A", "docs.html": "b"}, check=True, diff=True)
    assert planned["written"] == ["index.html"] and planned["diff"][0]["after"] == "A"
    assert (site / "index.html").read_text() == "a"  # check mode wrote nothing


@pytest.mark.parametrize("name", ["../escape.html", "sub/page.html", ".hidden", "a b.html", ""])
def test_site_files_refuse_names_that_are_not_plain(tmp_path, name):
    from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

    with pytest.raises(StepError, match="not a plain file name"):
        _ensure(tmp_path, {name: "x"})


def test_site_files_refuse_a_planted_symlink(tmp_path):
    from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

    target = tmp_path / "elsewhere"
    target.write_text("keep")
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").symlink_to(target)
    with pytest.raises(StepError, match="is a symlink"):
        _ensure(site, {"index.html": "x"})
    assert target.read_text() == "keep"


def test_an_endpoint_renamed_twice_names_both_old_ids_and_extra_renames_win():
    hv = _hostvars(
        **{
            "frank-secondary": {
                "endpoint_shape": SECONDARY,
                "__endpoint_deploy": {"generations": [{"served_id": "frank-zealot"}, {"served_id": "frank-stalker"}, {"served_id": "frank-secondary"}]},
            },
            "frank-primary": {"endpoint_shape": PRIMARY},
        }
    )
    endpoints = fleet_endpoints(["frank-secondary", "frank-primary"], hv)
    assert served_id_renames(endpoints) == [{"from": "frank-stalker", "to": "frank-zealot"}, {"from": "frank-secondary", "to": "frank-zealot"}]
    extra = [{"from": "frank-secondary", "to": "frank-archon-legacy"}]
    assert served_id_renames(endpoints, extra) == [*extra, {"from": "frank-stalker", "to": "frank-zealot"}]


def test_an_old_id_two_endpoints_served_is_refused_naming_the_variable():
    from ansible.errors import AnsibleFilterError

    hv = _hostvars(
        **{
            "frank-secondary": {"endpoint_shape": SECONDARY, "__endpoint_deploy": {"generations": [{"served_id": "frank-small"}]}},
            "frank-primary": {"endpoint_shape": PRIMARY, "__endpoint_deploy": {"generations": [{"served_id": "frank-small"}]}},
        }
    )
    endpoints = fleet_endpoints(["frank-secondary", "frank-primary"], hv)
    with pytest.raises(AnsibleFilterError, match="frank-small was served by more than one .*openwebui_extra_renames"):
        served_id_renames(endpoints)
    assert served_id_renames(endpoints, [{"from": "frank-small", "to": "frank-zealot"}]) == [{"from": "frank-small", "to": "frank-zealot"}]
