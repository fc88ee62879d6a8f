# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's homepage, generated from the inventory that deploys the endpoints: the services
list (services.json), the user and admin pages with their cards, and the user docs at /docs whose
model guide (#models) describes each endpoint as its clients see it. The model facts come from
the same entry the harness's models.yml fragment is written from (EndpointFacts.client_entry), so
a card cannot say another window, id or modality than the clients are given.

The output is deterministic (no timestamps, sorted where the inventory has no order): a rerun
with the same shapes writes the same bytes, so the role reports changed only when a shape or a
listed service changed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from html import escape
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.client_contract import reasoning_control
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.fleet_artifacts import GENERATED, EndpointFacts

AUDIENCES = ("user", "admin")
MAX_SERVICES = 200  # a homepage, not a directory: more than this is an inventory mistake
MAX_TEXT = 500  # a card's description is a sentence or two
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# A card's link: an http(s) URL without credentials in it (they would be published), or a path on
# this site; "//host" and "/\\host" are other sites to a browser, not paths.
_SCHEME_URL = re.compile(r"^https?://[^\s/?#@]+(?:[/?#][^\s]*)?$")
_SITE_PATH = re.compile(r"^/(?![/\\])[^\s]*$")

# The browser gate's contract (plugins/module_utils/browser): every card is an `a.card`, the docs
# page is linked as `a.docs-link`, and each model card links to its row in the docs' model guide.
CARD_CLASS = "card"
DOCS_LINK_CLASS = "docs-link"
DOCS_PATH = "/docs"


class HomepageError(ValueError):
    """Bad homepage input: the message names the field and the fix."""


@dataclass(frozen=True)
class Card:
    title: str
    href: str
    audience: str
    description: str
    kind: str  # "model" or "service"

    def as_dict(self) -> dict[str, str]:
        return {"title": self.title, "href": self.href, "audience": self.audience, "description": self.description, "kind": self.kind}


def _text(value: Any, field: str, required: bool = True) -> str:
    if value is None or value == "":
        if required:
            raise HomepageError(f"{field}: is required")
        return ""
    if not isinstance(value, str):
        raise HomepageError(f"{field}: must be a string, got {type(value).__name__}")
    if _CONTROL.search(value):
        raise HomepageError(f"{field}: contains a control character; write it on one line without tabs")
    if len(value) > MAX_TEXT:
        raise HomepageError(f"{field}: is {len(value)} characters; keep it under {MAX_TEXT}")
    return value


def service_cards(services: list[dict[str, Any]] | None) -> list[Card]:
    """The inventory's companion services (homepage_services), validated: name, url, audience."""
    services = services or []
    if not isinstance(services, list):
        raise HomepageError("homepage_services: must be a list of {name, url, audience, description}")
    if len(services) > MAX_SERVICES:
        raise HomepageError(f"homepage_services: {len(services)} entries; at most {MAX_SERVICES}")
    cards = []
    for index, service in enumerate(services):
        field = f"homepage_services[{index}]"
        if not isinstance(service, dict):
            raise HomepageError(f"{field}: must be a mapping with name, url, audience and description")
        unknown = sorted(set(service) - {"name", "url", "audience", "description"})
        if unknown:
            raise HomepageError(f"{field}: unknown key(s) {', '.join(unknown)}; the keys are name, url, audience, description")
        url = _text(service.get("url"), f"{field}.url")
        if "@" in url.split("/", 3)[2 if "://" in url else 0]:
            # Not echoed: it may hold a password.
            raise HomepageError(f"{field}.url: holds credentials (user:password@host); a card is published, so link without them")
        if not (_SCHEME_URL.match(url) or _SITE_PATH.match(url)):
            raise HomepageError(f"{field}.url: {url!r} is neither an http(s) URL nor a path on this site (starting with /)")
        audience = service.get("audience", "user")
        if audience not in AUDIENCES:
            raise HomepageError(f"{field}.audience: {audience!r}; use one of {', '.join(AUDIENCES)}")
        description = _text(service.get("description"), f"{field}.description", False)
        cards.append(Card(_text(service.get("name"), f"{field}.name"), url, audience, description, "service"))
    return cards


def model_anchor(served_id: str) -> str:
    return f"model-{served_id}"


def model_rows(endpoints: list[EndpointFacts]) -> list[dict[str, Any]]:
    """One row per endpoint for the docs' model guide, from the clients' own entry."""
    rows = []
    for facts in sorted(endpoints, key=lambda f: f.name):
        entry = facts.client_entry
        # How a request switches reasoning, as the clients' reasoning map sends it.
        control = reasoning_control(facts.typed)
        if control == "reasoning_effort":
            accepted = sorted({fields["reasoning_effort"] for fields in (entry.get("reasoningEffort") or {}).values()})
            reasoning = "reasoning_effort: " + ", ".join(accepted)
        elif control == "enable_thinking":
            reasoning = "chat_template_kwargs.enable_thinking: true or false"
        else:
            reasoning = "none"
        rows.append(
            {
                "endpoint": facts.name,
                "served_id": entry["id"],
                "base_url": entry["baseUrl"],
                "context_window": entry["contextWindow"],
                "max_tokens": entry["maxTokens"],
                "input": list(entry["input"]),
                "reasoning": reasoning,
                "runtime": facts.runtime,
                "key_env": facts.api_key_env,
                "description": facts.description,
            }
        )
    return rows


def model_cards(rows: list[dict[str, Any]]) -> list[Card]:
    cards = []
    for row in rows:
        modality = " + ".join(row["input"])
        summary = f"{row['context_window']:,} tokens of context, {modality} input, {row['runtime']}"
        description = f"{row['description']} ({summary})" if row["description"] else summary
        cards.append(Card(row["served_id"], f"{DOCS_PATH}#{model_anchor(row['served_id'])}", "user", description, "model"))
    return cards


def _page(title: str, heading: str, body: list[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f"<!-- {escape(GENERATED)} -->",
            f"<title>{escape(heading)} - {escape(title)}</title>",
            "<style>body{font-family:sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}"
            ".cards{display:flex;flex-wrap:wrap;gap:1rem;list-style:none;padding:0}"
            ".card{display:block;border:1px solid #ccc;border-radius:6px;padding:1rem;width:16rem;color:inherit;text-decoration:none}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3rem .6rem;text-align:left}</style>",
            "</head>",
            "<body>",
            f"<h1>{escape(heading)}</h1>",
            *body,
            f'<footer><p><a class="{DOCS_LINK_CLASS}" href="{DOCS_PATH}">User documentation</a></p></footer>',
            "</body>",
            "</html>",
            "",
        ]
    )


def _card_list(cards: list[Card]) -> list[str]:
    if not cards:
        return ["<p>Nothing is listed here.</p>"]
    lines = ['<ul class="cards">']
    for card in cards:
        lines.append(
            f'<li><a class="{CARD_CLASS}" data-kind="{card.kind}" href="{escape(card.href)}">'
            f"<strong>{escape(card.title)}</strong><br><span>{escape(card.description)}</span></a></li>"
        )
    lines.append("</ul>")
    return lines


def _docs(title: str, rows: list[dict[str, Any]]) -> str:
    body = [
        '<h2 id="access">Access</h2>',
        "<p>Every model speaks the OpenAI API (<code>/v1/chat/completions</code>, <code>/v1/models</code>) at the base URL below. "
        "A keyed endpoint takes its key as a bearer token; your client reads it from the variable named in the guide, never from this page.</p>",
        '<h2 id="models">Model guide</h2>',
        "<table>",
        "<tr><th>Model id</th><th>Base URL</th><th>Context window</th><th>Max output</th><th>Input</th><th>Reasoning control</th><th>Key variable</th></tr>",
    ]
    for row in rows:
        body.append(
            f'<tr id="{escape(model_anchor(row["served_id"]))}"><td><code>{escape(row["served_id"])}</code></td>'
            f"<td><code>{escape(row['base_url'])}</code></td><td>{row['context_window']:,}</td><td>{row['max_tokens']:,}</td>"
            f"<td>{escape(' + '.join(row['input']))}</td><td>{escape(row['reasoning'])}</td>"
            f"<td>{escape(row['key_env']) if row['key_env'] else 'none'}</td></tr>"
        )
    body += [
        "</table>",
        "<p>The context window is what a client may send and receive in one request; the engine's own ceiling is larger by the "
        "compaction gap. Verify a model id on <code>/v1/models</code>: some engines echo whatever model name a chat request names.</p>",
        '<h2 id="troubleshooting">Troubleshooting</h2>',
        "<ul><li>401: the key is missing or wrong; check the key variable.</li>"
        "<li>400 naming the context length: the request is past the window above; shorten it or lower max_tokens.</li>"
        "<li>Connection refused: the endpoint is restarting after a deploy; retry after a minute.</li></ul>",
        '<p><a href="/">Back to the homepage</a></p>',
    ]
    return _page(title, "User documentation", body)


def site_files(endpoints: list[EndpointFacts], services: list[dict[str, Any]] | None, title: str = "frank fleet") -> dict[str, str]:
    """Every file of the site, by its path under the site root."""
    title = _text(title, "homepage_title")
    rows = model_rows(endpoints)
    ids = [row["served_id"] for row in rows]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise HomepageError(f"endpoint_shape.served_id: {', '.join(duplicated)} is served by more than one endpoint; one id per model")
    cards = model_cards(rows) + service_cards(services)
    by_audience = {audience: [c for c in cards if c.audience == audience] for audience in AUDIENCES}
    services_json = {"generated_by": GENERATED, **{audience: [c.as_dict() for c in listed] for audience, listed in by_audience.items()}, "models": rows}
    return {
        "index.html": _page(title, title, _card_list(by_audience["user"]) + ['<p><a href="/admin">Administration</a></p>']),
        "admin.html": _page(title, f"{title}: administration", _card_list(by_audience["admin"]) + ['<p><a href="/">Back to the homepage</a></p>']),
        "docs.html": _docs(title, rows),
        "services.json": json.dumps(services_json, indent=2, sort_keys=False) + "\n",
    }
