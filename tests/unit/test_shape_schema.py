"""One declaration of the shape's keys: the role's argument_specs (entry point preflight, the keys
the preflight checks with the parser), docs/shape.md and the parser agree."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import SHAPE_FIELDS, parse_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = {"llamacpp": {"runtime": "llamacpp", "ctx_size": 4096}, "vllm": {"runtime": "vllm", "max_model_len": 4096}}
SAMPLE = {"int": 2, "size": "1 GiB", "float": 0.5, "bool": True, "str": "x", "args": ["--a"], "split": [1, 1], "overrides": {"exps": "CPU"}}
# Keys whose value has a grammar of its own, and keys that only make sense beside another.
KEY_SAMPLE = {"spec_type": "draft-mtp", "type_k": "q8_0", "type_v": "q8_0", "drafter_type_k": "q8_0", "drafter_type_v": "q8_0", "kv_cache_dtype": "fp8"}
COMPANIONS = {
    "draft_max": {"spec_type": "draft-mtp"},
    "drafter_type_k": {"spec_type": "draft-mtp"},
    "drafter_type_v": {"spec_type": "draft-mtp"},
    "expert_precise_memory": {"expert_offload": True},
}


def spec_keys() -> dict:
    specs = yaml.safe_load((ROOT / "roles" / "endpoint" / "meta" / "argument_specs.yml").read_text())
    return specs["argument_specs"]["preflight"]["options"]["endpoint_shape"]["options"]


def doc_keys() -> list[str]:
    return re.findall(r"^\| `([a-z_]+)` \|", (ROOT / "docs" / "shape.md").read_text(), re.MULTILINE)


def test_the_generated_files_are_current():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_role_specs.py"), "--check"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_specs_docs_and_parser_name_the_same_keys():
    assert list(spec_keys()) == list(SHAPE_FIELDS)
    assert doc_keys() == list(SHAPE_FIELDS)
    for key, spec in spec_keys().items():
        assert spec.get("choices") == (list(SHAPE_FIELDS[key].choices) if SHAPE_FIELDS[key].choices else None), key


@pytest.mark.parametrize("key", list(SHAPE_FIELDS))
def test_the_parser_takes_every_declared_key_for_its_runtimes(key):
    spec = SHAPE_FIELDS[key]
    value = spec.choices[-1] if spec.choices else KEY_SAMPLE.get(key, SAMPLE.get(spec.kind, {"mapping": {"a": 1}, "list": [], "sizes": "1 MiB"}.get(spec.kind)))
    for runtime, minimal in MINIMAL.items():
        companions = COMPANIONS.get(key, {}) if runtime in spec.runtimes else {}
        raw = {**minimal, **companions, key: value} if key != "runtime" else minimal
        if runtime in spec.runtimes:
            parse_shape(raw)
        else:
            with pytest.raises(ShapeError, match=f"^{key}: not a {runtime} key"):
                parse_shape(raw)


def test_a_key_nobody_declared_is_refused_everywhere():
    assert "ctx_length" not in spec_keys()
    with pytest.raises(ShapeError, match="ctx_length: unknown shape key"):
        parse_shape({**MINIMAL["llamacpp"], "ctx_length": 4096})
