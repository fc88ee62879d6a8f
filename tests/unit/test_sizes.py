import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, MIB, SizeError, human, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("31.86 GiB", round(31.86 * GIB)),
        ("12,544 MiB", 12_544 * MIB),
        ("7.2e9", 7_200_000_000),
        (3_150_000_000, 3_150_000_000),
        ("3.15e9", 3_150_000_000),
        ("8,311,013,376", 8_311_013_376),
        ("1.5GiB", 3 * GIB // 2),
        ("2 GB", 2_000_000_000),
        (0, 0),
    ],
)
def test_accepts_the_forms_engines_and_operators_write(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["-1 GiB", -5, "lots", "12 parsecs", "", None, True, float("nan"), float("inf"), [1]])
def test_refuses_bad_sizes_naming_the_field(bad):
    with pytest.raises(SizeError, match="kv_cache_memory_bytes"):
        parse_size(bad, "kv_cache_memory_bytes")


def test_human_rendering_uses_binary_units():
    assert human(1536 * MIB) == "1.50 GiB"
    assert human(-2 * MIB) == "-2.00 MiB"
    assert human(12) == "12 B"
