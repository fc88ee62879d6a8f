"""plan_table_from_facts: the fleet plan's table from the facts each endpoint carries after the
plan (playbooks/plan.yml prints it when the deploy_plan callback is not enabled)."""

from ansible_collections.frank.llm_fleet.plugins.plugin_utils.deploy_plan import plan_table_from_facts

MIB = 1024 * 1024


def test_each_endpoint_reads_as_refused_fits_or_not_priced():
    facts = {
        "a": {"__fleet_failure": "Price per device - a: over by 12.0 MiB at term 'kv'\n  (rolled back)"},
        "b": {
            "__endpoint_budget": {
                "fits": True,
                "ledger": [
                    {"device": "gpu0", "used_bytes": 1000 * MIB, "capacity_bytes": 4000 * MIB, "free_bytes": 3000 * MIB},
                    {"device": "gpu1", "used_bytes": 3500 * MIB, "capacity_bytes": 4000 * MIB, "free_bytes": 500 * MIB},
                ],
                "payload_identity": {"checked": True},
            }
        },
        "c": {},
    }
    table = plan_table_from_facts(["a", "b", "c"], facts).splitlines()
    assert table[0] == "Fleet plan (priced only: nothing was changed)"
    rows = {line.split()[0]: line for line in table[3:6]}
    assert " refused by a gate " in rows["a"]
    assert rows["a"].endswith("Price per device - a: over by 12.0 MiB at term 'kv' (rolled back)")
    # The tightest device is the one named.
    assert rows["b"].endswith("gpu1: 3,500.0 of 4,000.0 MiB, 500.0 free; payload identity checked")
    assert " not reached " in rows["c"] and rows["c"].endswith("not priced in this run")
    assert table[-1] == "1 refused by a gate, 1 fits, 1 not reached"
