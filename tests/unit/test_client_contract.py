from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.client_contract import client_window, worst_case_request


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
