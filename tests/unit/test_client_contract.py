import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.client_contract import client_window, models_entry, worst_case_request
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError


def test_production_ceiling_gives_the_measured_client_window():
    window = client_window(200_704)
    assert window.context_window == 155_648
    assert window.max_tokens == 45_056
    assert window.compaction_at == int(155_648 * 0.85)
    assert window.safe


def test_window_equal_to_ceiling_is_a_guaranteed_400_zone():
    # The client once advertised the full ceiling with maxTokens 45,056: requests estimated in the
    # ~146k-184k zone overflowed the engine.
    worst = worst_case_request(200_704, 45_056)
    assert worst > 200_704
    assert not client_window(200_704, gap=0, max_tokens=45_056).safe


def test_small_windows_get_a_proportional_gap():
    window = client_window(4096)
    assert 0 < window.context_window < 4096
    assert window.safe


def test_reasoning_efforts_fold_the_harness_high_onto_the_templates_xhigh():
    # Seed 003: "Qwen3.8's template answers 500 on 'high' -- verified against the live endpoint,
    # low/medium/xhigh answer 200."
    shape = parse_shape({"runtime": "llamacpp", "ctx_size": 200_000, "reasoning_control": "reasoning_effort", "reasoning_efforts": ["low", "medium", "xhigh"]})
    efforts = models_entry(shape, "http://h:7770/v1")["reasoningEffort"]
    assert efforts == {
        "none": {"reasoning_effort": "low"},
        "low": {"reasoning_effort": "low"},
        "medium": {"reasoning_effort": "medium"},
        "high": {"reasoning_effort": "xhigh"},
    }
    # Without the list the template is assumed to take the harness's own names.
    plain = parse_shape({"runtime": "llamacpp", "ctx_size": 200_000, "reasoning_control": "reasoning_effort"})
    assert models_entry(plain, "http://h:7770/v1")["reasoningEffort"]["high"] == {"reasoning_effort": "high"}


def test_an_effort_no_template_knows_is_refused_with_the_choices():
    with pytest.raises(ShapeError, match="^reasoning_efforts\\[1\\]: 'hihg' is not an effort; use none, minimal, low, medium, high, xhigh"):
        parse_shape({"runtime": "llamacpp", "ctx_size": 4096, "reasoning_efforts": ["low", "hihg"]})
