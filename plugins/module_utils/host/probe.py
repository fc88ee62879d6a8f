# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The smoke probe a deploy runs after the health gate (endpoint_deploy) and endpoint_probe runs on
demand: a chat completion with at least one token, and, where the shape enables them, a required
tool call and an image read."""

from __future__ import annotations

from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import PROBE_OPTIONS, with_defaults
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError, Endpoint, reasoning_fields, reasoning_text, request_json
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import DRIVERS
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

# A 1x1 PNG, for the image probe of shapes with a vision projector.
PROBE_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
PROBE_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Return the current time.", "parameters": {"type": "object", "properties": {}}},
}


def _chat(endpoint: Endpoint, payload: dict[str, Any], what: str, timeout: float) -> dict[str, Any]:
    try:
        answer = request_json(endpoint, "POST", "/v1/chat/completions", payload, timeout)
    except ApiError as exc:
        raise StepError(f"{what}: {exc}", {}) from None
    try:
        answer["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise StepError(f"{what}: the answer is not a chat completion", {}) from None
    return answer


def chat_probe(
    host: str,
    port: int,
    served_id: str,
    prompt: str,
    max_tokens: int,
    tools: bool = False,
    image: bool = False,
    timeout: float = 120.0,
    api_key: str = "",
    runtime: str = "",
) -> str:
    """Smoke probes: a chat completion must answer with at least one token; where the shape
    enables them, a required tool call must come back as a tool call, and an image must be read.

    The runtime's driver says where the answer may be: an engine that answers in its reasoning
    field (radiance: reasoning_content) leaves content empty under a small budget on a healthy
    server, so the reasoning counts as the answer. The served id is never judged from a chat
    answer (an engine that echoes the requested name would pass any rename): the health gate
    judges it on /v1/models."""
    driver = DRIVERS.get(runtime)
    fields = (driver.reasoning_field,) if driver is not None else reasoning_fields()
    endpoint = Endpoint(f"http://{host}:{port}", api_key or None)
    base = {"model": served_id, "max_tokens": max_tokens, "temperature": 0}
    answer = _chat(endpoint, {**base, "messages": [{"role": "user", "content": prompt}]}, "smoke probe", timeout)
    if int(answer.get("usage", {}).get("completion_tokens", 0)) <= 0:
        raise StepError("smoke probe: the completion is empty (0 completion tokens)", {})
    message = answer["choices"][0]["message"]
    content = message.get("content") or reasoning_text(message, fields)
    if tools:
        payload = {**base, "max_tokens": max(max_tokens, 64), "tools": [PROBE_TOOL], "tool_choice": "required"}
        payload["messages"] = [{"role": "user", "content": "What time is it? Use the get_time tool."}]
        calls = _chat(endpoint, payload, "tool-call probe", timeout)["choices"][0]["message"].get("tool_calls") or []
        names = [call.get("function", {}).get("name") for call in calls]
        if "get_time" not in names:
            raise StepError(f"tool-call probe: a required tool call came back as {names or 'plain text'}; check the tool parser", {})
    if image:
        parts = [{"type": "text", "text": "What colour is this image?"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PROBE_PNG}"}}]
        seen = _chat(endpoint, {**base, "messages": [{"role": "user", "content": parts}]}, "image probe", timeout)
        if int(seen.get("usage", {}).get("completion_tokens", 0)) <= 0:
            raise StepError("image probe: no completion for an image (is the projector loaded?)", {})
    return content


def run_probe(params: dict[str, Any]) -> str:
    """The smoke probes as the `probe` options (host/specs.py PROBE_OPTIONS) describe them."""
    probe = with_defaults(PROBE_OPTIONS, params)
    return chat_probe(
        probe["host"],
        int(probe["port"]),
        probe["served_id"],
        probe["prompt"],
        int(probe["max_tokens"]),
        tools=bool(probe["tools"]),
        image=bool(probe["image"]),
        timeout=float(probe["timeout"]),
        api_key=str(probe["api_key"] or ""),
        runtime=str(probe.get("runtime") or ""),
    )
