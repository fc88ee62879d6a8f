"""The bench and the capacity probe against the lab's real llama-server."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lab_engine import MODELS, engine_image, serving
from PIL import Image

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import geometry_from_header, llamacpp_kv
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import check_parallel, find_refusal_boundary
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import Endpoint

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
IMAGE = engine_image()
if IMAGE is None:
    pytest.skip("the lab engine image is not built here (run `make lab-up`); CI builds it", allow_module_level=True)

MODEL = "tiny-llama-h4kv2d32.gguf"
CTX, PARALLEL = 8192, 2  # the lab shape of frank-secondary
EXTRA = '{"ignore_eos": true}'  # random weights: end-of-sequence may come first


@pytest.fixture(scope="module")
def lab_url():
    with serving(IMAGE, MODEL, ["-c", str(CTX), "--parallel", str(PARALLEL), "--jinja"]) as url:
        yield url


def cli(*argv):
    return subprocess.run([sys.executable, str(ROOT / "bin" / "llm-fleet"), *argv], capture_output=True, text=True, check=False)


def test_bench_writes_json_table_and_a_plot_that_decodes(lab_url, tmp_path):
    proc = cli(
        "bench", "--arm", f"a={lab_url}", "--arm", f"b={lab_url},thinking=off", "--max-tokens", "24", "--burst", "2", "-o", str(tmp_path), "--extra-body", EXTRA
    )
    assert proc.returncode == 0, proc.stderr
    [result] = tmp_path.glob("bench-*.json")
    report = json.loads(result.read_text())
    assert {arm["name"] for arm in report["arms"]} == {"a", "b"}
    assert len(report["jobs"]) == 2 * 5 and all(job["ok"] for job in report["jobs"])
    # Token counts come from each job's own streamed usage; salts keep prefix caches cold.
    assert all(job["completion_tokens"] == 24 and job["prompt_tokens"] > 0 for job in report["jobs"])
    assert len({job["salt"] for job in report["jobs"]}) == len(report["jobs"])
    # At most the chat template's fixed preamble before the salt is ever reused from cache.
    assert all((job["cached_tokens"] or 0) <= 16 for job in report["jobs"]), [job["cached_tokens"] for job in report["jobs"]]
    assert all(job["ttft_s"] > 0 and job["decode_tps"] > 0 for job in report["jobs"])
    assert len(report["bursts"]) == 2 * 5 and all(b["ok"] == 2 for b in report["bursts"])
    table = result.with_suffix(".txt").read_text()
    assert "median decode tok/s" in table and "WARNING" not in table
    with Image.open(result.with_suffix(".png")) as image:
        image.load()
        assert image.format == "PNG" and image.size == (1000, 600)
        rgb = image.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 16) or []
    # Bars are drawn: the two arms' fill colours cover a real share of the picture.
    blue = sum(n for n, c in colours if c == (31, 119, 180))
    orange = sum(n for n, c in colours if c == (255, 127, 14))
    assert blue > 5000 and orange > 5000, (blue, orange)


def test_probe_finds_the_per_slot_window_from_the_engines_refusal(lab_url):
    boundary = find_refusal_boundary(Endpoint(lab_url), "x")
    law = llamacpp_kv(geometry_from_header(read_model(MODELS / MODEL)), CTX, PARALLEL)
    assert boundary.window == law.per_slot_window == 4096
    assert str(boundary.window) in boundary.message  # the number is the engine's own
    assert boundary.prompt_tokens > boundary.window


def test_parallel_check_sees_slots_serve_together_and_a_third_request_queue(lab_url):
    # Judged by the engine's own /slots, the streams started one after another: a machine too
    # busy to start the second before the first ends makes a longer retry, never a "queued".
    together = check_parallel(Endpoint(lab_url), "x", 2, max_tokens=512)
    assert together.max_decoding_at_once == 2, together.as_dict()
    assert together.verdict == "the engine reported all 2 streams busy at once" and together.source == "/slots"
    queued = check_parallel(Endpoint(lab_url), "x", 3, max_tokens=512)
    assert queued.max_decoding_at_once == 2 and queued.verdict == "stream 3 was held back while the engine served 2 of its 2 slots", queued.as_dict()
    print(f"parallel check tries: {together.attempts} / {queued.attempts}")


def test_probe_cli_reports_boundary_parallel_and_depths(lab_url):
    proc = cli("probe", "--url", lab_url, "--parallel", "2", "--depth", "256", "--depth", "2048", "--depth", "9000", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["boundary"]["window"] == 4096
    assert report["parallel"]["parallel"] is True, report["parallel"]
    assert report["parallel"]["verdict"] == "the engine reported all 2 streams busy at once"
    measured = {row["depth"]: row for row in report["depths"]}
    assert measured[2048]["prompt_tokens"] > measured[256]["prompt_tokens"] > 0
    assert measured[2048]["decode_tps"] > 0
    assert "exceeds the window" in measured[9000]["skipped"]
    assert "refusal boundary: sending" in proc.stderr  # progress for long probes
