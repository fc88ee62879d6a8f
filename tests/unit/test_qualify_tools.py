"""The speculative A/B's judgement and the sweep's table (plugins/module_utils/qualify/spec_ab.py, sweep.py): identical greedy text
passes, a difference names the configuration, the shape and the first differing character, an
empty answer fails loudly (seed 003: the identity check "compared '' to ''"), and a configuration
that did not boot is not a silent pass. Texts written by hand."""

from __future__ import annotations

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify import spec_ab


def run(name: str, texts: dict[str, str], **extra) -> dict:
    return {"name": name, "booted": True, "answers": [{"shape": shape, "text": text, "completion_tokens": 5, **extra} for shape, text in texts.items()]}


TEXTS = {"prose": "A record per shape.", "echo": "\n".join(spec_ab.PASSAGE), "structured": "id: 1, name: endpoint-1"}


def test_identical_text_passes_with_the_figures_in_the_table():
    failures, table = spec_ab.compare([run("none", TEXTS), run("draft", TEXTS, draft_n=10, draft_accepted=4, decode_tps=31.5)])
    assert failures == []
    lines = table.splitlines()
    assert len(lines) == 7
    assert lines[4].split()[:5] == ["draft", "prose", "5", "31.5", "40%"] and lines[4].split()[-1] == "yes"


def test_a_difference_names_the_configuration_the_shape_and_where():
    failures, _table = spec_ab.compare([run("none", TEXTS), run("sampled", {**TEXTS, "prose": "A record per slot."})])  # "sh" vs "sl": index 14
    assert failures == ["sampled prose: the greedy text differs from none's at character 14"]


def test_empty_answers_and_configurations_that_did_not_boot_fail():
    failures, _table = spec_ab.compare([run("none", {**TEXTS, "echo": ""}), {"name": "ngram", "booted": False, "why": "health gate timed out"}])
    assert failures == [
        "none echo: EMPTY answer (an empty text proves nothing; give the shape more max_tokens or switch thinking off)",
        "ngram: did not boot (health gate timed out)",
    ]


def test_the_copy_ratio_counts_passage_lines():
    assert spec_ab.copy_ratio("\n".join(spec_ab.PASSAGE[:2]) + "\nsomething else\n\n") == 0.667
    assert spec_ab.copy_ratio("") == 0.0


def test_the_sweep_table_keeps_a_refused_cell_with_its_reason():
    from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify import sweep

    cells = [
        {"cell": {"ubatch": 128}, "verdict": "measured", "why": "median of 2", "prefill_tps": 812.25, "decode_tps": 40.0, "free_at_boot": {"host": 2 << 30}},
        {"cell": {"batch": 65536, "ubatch": 65536}, "verdict": "refused", "why": "over by 2,417.4 MiB at term 'compute'"},
    ]
    lines = sweep.table(cells).splitlines()
    assert lines[1].split()[:5] == ["ubatch=128", "measured", "812.2", "40.0", "host=2,048"]
    assert lines[2].split()[:3] == ["batch=65536", "ubatch=65536", "refused"] and lines[2].endswith("at term 'compute'")


def test_the_quality_gate_refuses_a_lost_needle_and_a_divergence_past_the_threshold():
    from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify import quality

    salt = "abc123def"
    assert quality.needle_code(salt) == "VIOLET-ABC123"
    prompt = quality.needle_prompt(salt, 400, 0.5)
    assert prompt.index("VIOLET-ABC123") in range(190, 230) and prompt.endswith("Answer with the code only.")
    assert quality.divergence("abcd", "abXY") == 0.5 and quality.divergence("same", "same") == 0.0

    def battery(name, short, needle):
        answers = [{"shape": key, "text": short} for key in quality.BATTERY] + [{"shape": "needle", "text": needle}]
        return {"name": name, "booted": True, "answers": answers}

    base = battery("baseline", "Paris is the capital.", "VIOLET-ABC123")
    refusals, figures, _table = quality.judge(base, battery("candidate", "Paris is the capital.", "VIOLET-ABC123"), salt)
    assert refusals == [] and figures["mean_divergence"] == 0.0
    # "Paris is the capital." vs "Paris is a city....": 9 of 21 characters in common.
    refusals, figures, table = quality.judge(base, battery("candidate", "Paris is a city......", "I do not know"), salt)
    assert figures["mean_divergence"] == 0.571
    assert refusals == [
        "candidate lost the needle baseline found (the code at depth)",
        "candidate diverges from baseline by 0.571 on the short battery, past the threshold 0.25",
    ]
    assert table.splitlines()[1].split() == ["needle", "found", "missed", "-"]


def tokens(*pieces: tuple[str, str, float]) -> list[list]:
    """[chosen, runner-up, margin] per token, as `token_choices` stores them (bytes as hex)."""
    return [[chosen.encode().hex(), runner_up.encode().hex(), margin] for chosen, runner_up, margin in pieces]


def greedy_run(name: str, prose: str, prose_tokens: list[list]) -> dict:
    answer = {"shape": "prose", "text": prose, "completion_tokens": len(prose_tokens), "tokens": prose_tokens}
    return {"name": name, "booted": True, "answers": [answer]}


# The baseline's "shape" had "slot" 0.004 nats behind it: a tie; "." after "per" was 2.1 nats ahead of "!".
BASELINE = greedy_run(
    "none", "A record per shape.", tokens(("A", "The", 0.8), (" record", " list", 1.3), (" per", " of", 0.6), (" shape", " slot", 0.004), (".", "!", 2.1))
)


def test_a_divergence_at_a_near_tie_taking_the_runner_up_is_a_tie_not_a_failure():
    drafted = greedy_run(
        "draft", "A record per slot.", tokens(("A", "The", 0.8), (" record", " list", 1.3), (" per", " of", 0.6), (" slot", " shape", 0.003), (".", "!", 2.0))
    )
    failures, table = spec_ab.compare([BASELINE, drafted])
    assert failures == []
    assert table.splitlines()[2].split()[0] == "draft" and table.splitlines()[2].endswith("tie@14 (0.0040 nats)")
    # Strict comparison (tie_margin 0) fails it, naming the character.
    failures, _table = spec_ab.compare([BASELINE, drafted], tie_margin=0.0)
    assert failures == ["draft prose: the greedy text differs from none's at character 14"]


def test_a_divergence_where_the_baseline_was_sure_or_that_took_another_token_fails():
    # At "." the baseline led by 2.1 nats: a drafter that ends with "!" is wrong, not rounding.
    sure = greedy_run(
        "draft", "A record per shape!", tokens(("A", "The", 0.8), (" record", " list", 1.3), (" per", " of", 0.6), (" shape", " slot", 0.004), ("!", ".", 0.1))
    )
    # At " shape" the tie was with " slot"; " state" is neither of the baseline's top two.
    other = greedy_run(
        "ngram", "A record per state.", tokens(("A", "The", 0.8), (" record", " list", 1.3), (" per", " of", 0.6), (" state", " shape", 0.001), (".", "!", 2.0))
    )
    failures, _table = spec_ab.compare([BASELINE, sure, other])
    assert failures == [
        "draft prose: the greedy text differs from none's at character 18",
        "ngram prose: the greedy text differs from none's at character 14",
    ]


def test_without_token_log_probabilities_or_with_tokens_that_do_not_spell_the_text_any_difference_fails():
    untokenized = {"name": "draft", "booted": True, "answers": [{"shape": "prose", "text": "A record per slot.", "completion_tokens": 5}]}
    misspelt = greedy_run(
        "chain", "A record per slot.", tokens(("A", "The", 0.8), (" record", " list", 1.3), (" per", " of", 0.6), (" slot", " shape", 0.003))
    )  # no "."
    failures, _table = spec_ab.compare([BASELINE, untokenized, misspelt])
    assert failures == [
        "draft prose: the greedy text differs from none's at character 14",
        "chain prose: the greedy text differs from none's at character 14",
    ]


def test_token_choices_read_the_openai_logprobs_fields_and_a_token_split_inside_a_character():
    answer = {
        "choices": [
            {
                "logprobs": {
                    "content": [
                        {
                            "token": "A",
                            "logprob": -0.5,
                            "bytes": [65],
                            "top_logprobs": [{"token": "A", "logprob": -0.5, "bytes": [65]}, {"token": "B", "logprob": -0.75, "bytes": [66]}],
                        },
                        # "é" (c3 a9) as two byte tokens: the token text is not valid UTF-8 alone.
                        {"token": "\ufffd", "logprob": -1.0, "bytes": [0xC3], "top_logprobs": [{"token": "\ufffd", "logprob": -1.0, "bytes": [0xC3]}]},
                        {"token": "\ufffd", "logprob": -0.1, "bytes": [0xA9], "top_logprobs": []},
                    ]
                }
            }
        ]
    }
    assert spec_ab.token_choices(answer) == [["41", "42", 0.25], ["c3", "", None], ["a9", "", None]]
    assert spec_ab.token_choices({"choices": [{"message": {"content": "A"}}]}) is None
