"""The qualification's picture (plugins/plugin_utils/plots.py render_qualify_png) drawn from a
results document the qualify code's own writer stored, decoded back, drawn by the report task
through Ansible, and the CLI naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from local_playbook import run_local_playbook
from matplotlib.image import imread

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify import results
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.plots import render_qualify_png

ROOT = Path(__file__).resolve().parents[2]
LADDER = {"key": "context", "ceiling": 81920, "floor": 8192, "step": 16384, "bonus": 4096, "align": 2048}
SHAPE = {"runtime": "llamacpp", "model_file": "tiny.gguf", "ctx_size": 8192}
PROBE = {
    "slots": 2,
    "answered": 2,
    "past_window_refused": True,
    "streams": 2,
    "decoding_together": 2,
    "tokens": 65536,
    "decode_tps": 88.5,
    "free_at_boot": {"gpu0": 3 << 30, "gpu1": 5 << 30},
    "free_under_probe": {"gpu0": 2 << 30, "gpu1": 4 << 30},
}


def stored(results_dir: Path) -> dict:
    """Three rungs: 81920 refused by the gate, 65536 passes, 69632 fails to boot."""
    rungs = results.step(LADDER, [], {"value": 81920, "fits": False, "why": "kv over gpu0 by 12 MiB"})["rungs"]
    rungs = results.step(LADDER, rungs, {"value": 65536, "fits": True, "booted": True, "probe": PROBE})["rungs"]
    rungs = results.step(LADDER, rungs, {"value": 69632, "fits": True, "booted": False, "why": "health gate timed out"})["rungs"]
    return results.write(str(results_dir), "frank-secondary", LADDER, SHAPE, rungs, {"restore_s": 3.2})


def test_the_picture_is_drawn_beside_the_table_and_decodes(tmp_path):
    out = stored(tmp_path)
    picture = out["paths"]["picture"]
    assert picture == str(tmp_path / "frank-secondary.qualify.png")
    document = json.loads((tmp_path / "frank-secondary.qualify.json").read_text())
    render_qualify_png(document, picture)
    raw = Path(picture).read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
    assert (int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")) == (1000, 800)
    assert imread(picture).shape[:2] == (800, 1000)
    assert results.read(str(tmp_path), "frank-secondary")["picture"] == picture


def test_the_cli_view_names_the_picture(tmp_path):
    out = stored(tmp_path)
    command = [sys.executable, str(ROOT / "bin" / "llm-fleet"), "qualify", "frank-secondary", "--dir", str(tmp_path)]
    before = subprocess.run(command, capture_output=True, text=True, check=False)
    assert before.returncode == 0, before.stderr
    assert "no picture stored (frank-secondary.qualify.png is drawn by playbooks/qualify.yml)" in before.stdout
    render_qualify_png(json.loads((tmp_path / "frank-secondary.qualify.json").read_text()), out["paths"]["picture"])
    after = subprocess.run(command, capture_output=True, text=True, check=False)
    assert f"picture: {tmp_path}/frank-secondary.qualify.png" in after.stdout


def test_a_document_without_its_figures_is_refused_naming_the_rung_and_the_fix(tmp_path):
    stored(tmp_path)
    source = str(tmp_path / "frank-secondary.qualify.json")
    document = json.loads(Path(source).read_text())
    del document["rungs"][1]["verdict"]
    with pytest.raises(ValueError, match=r"frank-secondary.qualify.json: rung 2 has no field 'verdict'; run playbooks/qualify.yml again"):
        render_qualify_png(document, str(tmp_path / "x.png"), source)
    with pytest.raises(ValueError, match=r"field 'rungs' is missing or empty"):
        render_qualify_png({"format": 1, "endpoint": "frank-secondary"}, str(tmp_path / "x.png"), source)
    assert not (tmp_path / "x.png").exists()


def test_the_report_task_draws_the_picture_on_the_controller(tmp_path):
    """qualify_report as roles/qualify runs it (on the controller): the module's files, then the picture."""
    rungs = results.step(LADDER, [], {"value": 81920, "fits": False, "why": "kv over gpu0 by 12 MiB"})["rungs"]
    rungs = results.step(LADDER, rungs, {"value": 65536, "fits": True, "booted": True, "probe": PROBE})["rungs"]
    args = {"results_dir": str(tmp_path / "q"), "endpoint": "frank-secondary", "settings": LADDER, "shape": SHAPE, "rungs": rungs}
    proc, tasks = run_local_playbook(tmp_path, {"tasks": [{"frank.llm_fleet.qualify_report": args}]})
    assert proc.returncode == 0, proc.stdout[-2000:]
    reported = tasks[0]["hosts"]["localhost"]
    assert reported["picture"] == str(tmp_path / "q" / "frank-secondary.qualify.png")
    assert imread(reported["picture"]).shape[:2] == (800, 1000)
    proc, tasks = run_local_playbook(tmp_path, {"tasks": [{"frank.llm_fleet.qualify_report": {**args, "results_dir": str(tmp_path / "dry")}}]}, ["--check"])
    assert proc.returncode == 0 and "picture" not in tasks[0]["hosts"]["localhost"] and not (tmp_path / "dry").exists()
