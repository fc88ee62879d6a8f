# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The harness contract (compaction-gap law).

The client estimates tokens as chars/4 (under-counting the rendered prompt by ~3%), compacts at
85% of its window, and clamps max_tokens to min(maxTokens, contextWindow - estimate - 4096). So the
window it is told must sit a gap below the engine ceiling, or requests near the compaction point
are guaranteed 400s (the engine refuses prompts larger than its window before prefill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import REASONING_EFFORTS, Shape

DEFAULT_GAP = 45_056
COMPACTION_FRACTION = 0.85
ESTIMATE_UNDERCOUNT = 0.03
CLAMP_RESERVE = 4096


@dataclass(frozen=True)
class ClientWindow:
    ceiling: int
    context_window: int
    max_tokens: int
    compaction_at: int
    worst_case_tokens: int  # the largest real request the client can send

    @property
    def safe(self) -> bool:
        return self.worst_case_tokens <= self.ceiling

    def as_dict(self) -> dict[str, int | bool]:
        return {
            "ceiling": self.ceiling,
            "context_window": self.context_window,
            "max_tokens": self.max_tokens,
            "compaction_at": self.compaction_at,
            "worst_case_tokens": self.worst_case_tokens,
            "safe": self.safe,
        }


def default_gap(ceiling: int) -> int:
    """45,056 for production-size windows; for small windows the same 22.4% share, in 256s."""
    if ceiling > 2 * DEFAULT_GAP:
        return DEFAULT_GAP
    return ceiling * DEFAULT_GAP // 200_704 // 256 * 256


def worst_case_request(context_window: int, max_tokens: int) -> int:
    """Largest prompt-plus-completion the client can send, over every estimate up to compaction.

    real(e) = (1 + undercount) * e + min(max_tokens, window - e - reserve): piecewise linear in the
    estimate e, so its maximum is at an end of the range or at the clamp's kink.
    """
    top = int(context_window * COMPACTION_FRACTION)
    kink = context_window - CLAMP_RESERVE - max_tokens
    candidates = {0, top, min(max(kink, 0), top)}
    worst = 0
    for estimate in candidates:
        completion = max(min(max_tokens, context_window - estimate - CLAMP_RESERVE), 0)
        worst = max(worst, int(estimate * (1 + ESTIMATE_UNDERCOUNT)) + completion)
    return worst


def client_window(ceiling: int, gap: int | None = None, max_tokens: int | None = None) -> ClientWindow:
    """contextWindow = ceiling - gap, maxTokens = gap (unless given), compaction at 85% of the window."""
    if ceiling <= 0:
        raise ValueError(f"ceiling: must be positive, got {ceiling}")
    if gap is None:
        gap = default_gap(ceiling)
    if not 0 <= gap < ceiling:
        raise ValueError(f"client_gap: must be between 0 and the ceiling {ceiling}, got {gap}")
    window = ceiling - gap
    max_tokens = gap if max_tokens is None else max_tokens
    return ClientWindow(
        ceiling=ceiling,
        context_window=window,
        max_tokens=max_tokens,
        compaction_at=int(window * COMPACTION_FRACTION),
        worst_case_tokens=worst_case_request(window, max_tokens),
    )


# How a chat template switches reasoning -> the request fields each harness effort maps to.
REASONING_MAPS: dict[str, dict[str, dict[str, Any]]] = {
    "enable_thinking": {
        "none": {"chat_template_kwargs": {"enable_thinking": False}},
        "low": {"chat_template_kwargs": {"enable_thinking": True}},
        "medium": {"chat_template_kwargs": {"enable_thinking": True}},
        "high": {"chat_template_kwargs": {"enable_thinking": True}},
    },
    "reasoning_effort": {
        # Such templates cannot switch reasoning off; the lowest effort is the closest.
        "none": {"reasoning_effort": "low"},
        "low": {"reasoning_effort": "low"},
        "medium": {"reasoning_effort": "medium"},
        "high": {"reasoning_effort": "high"},
    },
    "none": {},
}


def engine_ceiling(shape: Shape) -> int:
    """The most tokens one request may hold, as the engine will enforce it (the runtime's shape
    class answers: llama.cpp pads the context and divides it over the slots; vLLM's is
    max_model_len)."""
    return shape.request_ceiling


def reasoning_control(shape: Shape) -> str:
    """How the template switches reasoning: the shape says so, else a reasoning parser implies
    enable_thinking (the shape parser has already checked the choice)."""
    reasoning_parser = getattr(shape, "reasoning_parser", None)
    return shape.reasoning_control or ("enable_thinking" if reasoning_parser else "none")


def reasoning_map(shape: Shape) -> dict[str, dict[str, Any]]:
    """Harness effort -> request fields. Where the shape lists the efforts its template accepts
    (reasoning_efforts), each harness effort maps to the lowest accepted one at or above it, else
    the highest: the Qwen3.8 template answers 500 on 'high' and 200 on low/medium/xhigh (seed 003),
    so 'high' must be sent as 'xhigh'."""
    control = reasoning_control(shape)
    accepted = [effort for effort in REASONING_EFFORTS if effort in shape.reasoning_efforts]
    if control != "reasoning_effort" or not accepted:
        return REASONING_MAPS[control]
    out = {}
    for wanted in REASONING_MAPS[control]:
        rank = REASONING_EFFORTS.index(wanted)
        chosen = next((effort for effort in accepted if REASONING_EFFORTS.index(effort) >= rank), accepted[-1])
        out[wanted] = {"reasoning_effort": chosen}
    return out


def models_entry(shape: Shape, base_url: str) -> dict[str, Any]:
    """The harness's models.yml entry for one endpoint, derived from the shape alone."""
    window = client_window(engine_ceiling(shape), shape.client_gap, shape.client_max_tokens)
    efforts = reasoning_map(shape)
    entry: dict[str, Any] = {
        "id": shape.served_id,
        "baseUrl": base_url,
        "contextWindow": window.context_window,
        "maxTokens": window.max_tokens,
        # Image input only where the engine loads a projector; text always.
        "input": ["text", "image"] if shape.has_projector else ["text"],
        "reasoning": bool(efforts),
    }
    if efforts:
        entry["reasoningEffort"] = efforts
    if shape.client_sampler:
        # The server's default stays greedy; the recipe rides the request (seed 000: "greedy server
        # default with Qwen-recommended sampling riding compat.extraBody").
        entry["compat"] = {"extraBody": dict(shape.client_sampler)}
    return entry
