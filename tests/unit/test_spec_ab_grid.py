"""The speculative-decoding A/B's grid (qualify/spec_ab.py grid_configs), each expected list typed by hand."""

from __future__ import annotations

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.spec_ab import GridError, grid_configs

DRAFT = {"name": "draft", "shape": {"spec_type": "draft-simple", "drafter": "tiny-draft.gguf"}}
NGRAM = {"name": "ngram", "shape": {"spec_type": "ngram-mod"}}


def test_none_each_drafter_at_each_depth_and_the_chains():
    configs = grid_configs({"drafters": [DRAFT, NGRAM], "depths": [2, 4], "chains": True})
    assert [c["name"] for c in configs] == ["none", "draft-d2", "draft-d4", "ngram", "draft+ngram-d2", "draft+ngram-d4"]
    assert configs[0] == {"name": "none"}
    assert configs[2]["shape"] == {"spec_type": "draft-simple", "drafter": "tiny-draft.gguf", "draft_max": 4}
    assert configs[3]["shape"] == {"spec_type": "ngram-mod"}  # a draftless type takes no depth
    assert configs[5]["shape"] == {"spec_type": "draft-simple,ngram-mod", "drafter": "tiny-draft.gguf", "draft_max": 4}


def test_without_chains_no_chain_and_two_model_backed_drafters_are_never_chained():
    mtp = {"name": "mtp", "shape": {"spec_type": "draft-mtp"}}
    configs = grid_configs({"drafters": [DRAFT, mtp, NGRAM], "depths": [3], "chains": True})
    assert [c["name"] for c in configs] == ["none", "draft-d3", "mtp-d3", "ngram", "draft+ngram-d3", "mtp+ngram-d3"]
    assert [c["name"] for c in grid_configs({"drafters": [DRAFT], "depths": [3]})] == ["none", "draft-d3"]


@pytest.mark.parametrize(
    ("grid", "words"),
    [
        ({"drafters": [DRAFT]}, "qualify_spec_grid.depths: the model-backed drafters need"),
        ({"drafters": [DRAFT], "depths": [0]}, "qualify_spec_grid.depths: a list of draft depths from 1 to 64"),
        ({"drafters": [], "depths": [2]}, "qualify_spec_grid.drafters: give at least one drafter"),
        ({"drafters": [{"name": "x", "shape": {"spec_type": "draft-simple,ngram-mod"}}], "depths": [2]}, "drafters[0].shape.spec_type: one type"),
        ({"drafters": [{"name": "x", "shape": {"spec_type": "eagle"}}]}, "drafters[0].shape.spec_type: one type, draft-* (model-backed) or ngram-*"),
        ({"drafters": [{"name": "x"}]}, "drafters[0]: expected {name: NAME, shape:"),
        ({"drafters": [NGRAM, NGRAM]}, "names must differ; ngram comes out twice"),
        ({"drafters": [NGRAM], "depth": [2]}, "unknown key(s) depth"),
        (["ngram"], "expected a mapping"),
    ],
)
def test_a_grid_that_cannot_be_expanded_names_the_field(grid, words):
    with pytest.raises(GridError) as raised:
        grid_configs(grid)
    assert words in str(raised.value)
