"""Served-id re-keying of OpenWebUI against a real database: open-webui's own migrations
(scripts/openwebui_db.sh), rows seeded the way OpenWebUI writes them (tests/unit/openwebui_db.py).

The law (seeds/004_b3255cfc2200b40a.txt): "OpenWebUI.md: the id-keyed trio (model row,
access_grant, api_configs" / "model_ids) is a foreign-key set — re-key it in the same deploy";
and the live re-key it replaces was done after a backup: "webui.db.bak-20261017b"."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from openwebui_db import CONNECTION_KEY, config_value, openwebui_reads, rows, seed_config, seed_connections, seed_model
from test_modules_through_ansible import play

from ansible_collections.frank.llm_fleet.plugins.module_utils.clients.openwebui import (
    SCHEMA_VERSION,
    RekeyError,
    Rename,
    apply_rekey,
    parse_renames,
    plan_rekey,
)

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT.parent / "shared" / "seeds" / "004_b3255cfc2200b40a.txt"
OLD, NEW = "frank-large", "frank-dragoon"
RENAME = (Rename(OLD, NEW),)
CLOCK = 1_792_000_000.0  # 2026-10-14T17:46:40Z: the backup's name comes from it
GRANTS = (("user", "*", "read"), ("group", "ops-group-id", "write"))


def seeded_fleet(db: Path) -> None:
    """The fleet's OpenWebUI before a rename: the served model with two grants, a preset built
    on it, a second endpoint, both on one connection, the served model as the default and the
    task model, and a chat message answered by it (history)."""
    seed_model(db, OLD, grants=GRANTS)
    seed_model(db, "frank-large-terse", base_model_id=OLD, grants=(("user", "*", "read"),))
    seed_model(db, "frank-zealot", grants=(("user", "*", "read"),))
    seed_connections(db, ["frank-zealot", OLD], [])
    seed_config(db, "ui.default_models", f"{OLD},frank-zealot")
    seed_config(db, "ui.model_order_list", ["frank-zealot", OLD])
    seed_config(db, "task.model.default", OLD)
    seed_config(db, "ui.default_pinned_models", "frank-zealot")
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO chat (id, user_id, title, chat, created_at, updated_at) VALUES ('chat-1', 'u', 't', '{}', 0, 0)")
        conn.execute("INSERT INTO chat_message (id, chat_id, role, model_id) VALUES ('m-1', 'chat-1', 'assistant', ?)", (OLD,))


def fingerprint(db: Path) -> str:
    return hashlib.sha256(db.read_bytes()).hexdigest()


def backups(db: Path) -> list[Path]:
    return sorted(db.parent.glob(f"{db.name}.bak-*"))


def test_the_seed_states_the_law_this_file_proves():
    if not SEED.exists():
        pytest.skip(f"the fleet's seeds are not beside this checkout ({SEED})")
    text = SEED.read_text(encoding="utf-8")
    assert "OpenWebUI.md: the id-keyed trio (model row, access_grant, api_configs" in text
    assert "model_ids) is a foreign-key set — re-key it in the same deploy" in text
    assert "webui.db.bak-20261017b" in text


def test_the_migrated_database_is_open_webuis_own(openwebui_schema_db):
    # The build ran the pinned release's migrations to their head (alembic_version), not a hand schema.
    assert openwebui_schema_db.parent.name == SCHEMA_VERSION
    assert rows(openwebui_schema_db, "SELECT version_num FROM alembic_version") == [("0bd252b206fb",)]


def test_the_trio_and_the_rest_of_the_set_move_in_one_run(openwebui_db):
    seeded_fleet(openwebui_db)
    result = apply_rekey(str(openwebui_db), RENAME, clock=lambda: CLOCK)
    assert result.changed
    # The trio.
    assert rows(openwebui_db, "SELECT id FROM model WHERE id IN (?, ?)", (OLD, NEW)) == [(NEW,)]
    grants = rows(openwebui_db, "SELECT principal_type, principal_id, permission FROM access_grant WHERE resource_type = 'model' AND resource_id = ?", (NEW,))
    assert sorted(grants) == sorted(GRANTS)
    assert rows(openwebui_db, "SELECT count(*) FROM access_grant WHERE resource_id = ?", (OLD,)) == [(0,)]
    connections = config_value(openwebui_db, "openai.api_configs")
    assert connections["0"]["model_ids"] == ["frank-zealot", NEW] and connections["1"]["model_ids"] == []
    assert connections["0"]["key"] == CONNECTION_KEY  # the rest of the connection is kept as it was
    # The rest of the set: the preset, the history the row points into, the settings.
    assert rows(openwebui_db, "SELECT base_model_id FROM model WHERE id = 'frank-large-terse'") == [(NEW,)]
    (version_id,) = rows(openwebui_db, "SELECT version_id FROM model WHERE id = ?", (NEW,))[0]
    assert rows(openwebui_db, "SELECT model_id FROM model_history WHERE id = ?", (version_id,)) == [(NEW,)]
    assert config_value(openwebui_db, "ui.default_models") == f"{NEW},frank-zealot"
    assert config_value(openwebui_db, "ui.model_order_list") == ["frank-zealot", NEW]
    assert config_value(openwebui_db, "task.model.default") == NEW
    assert config_value(openwebui_db, "ui.default_pinned_models") == "frank-zealot"
    # History stays: the message answered by the old id keeps it.
    assert rows(openwebui_db, "SELECT model_id FROM chat_message WHERE id = 'm-1'") == [(OLD,)]
    # The other endpoint is untouched.
    assert rows(openwebui_db, "SELECT count(*) FROM access_grant WHERE resource_id = 'frank-zealot'") == [(1,)]
    [entry] = result.renames
    assert entry["status"] == "move" and entry["from"] == OLD and entry["to"] == NEW
    assert "model['frank-large'].id" in entry["moved"]
    assert "config['openai.api_configs'].value[0].model_ids" in entry["moved"]
    assert len([ref for ref in entry["moved"] if ref.startswith("access_grant[")]) == 2
    assert CONNECTION_KEY not in repr(result)


def test_openwebui_itself_reads_the_re_keyed_model_under_the_new_id(openwebui_db):
    # The proof that counts: OpenWebUI's own models/access_grants/model_history/config code, run
    # from the pinned package, finds everything under the new id and nothing under the old one.
    seeded_fleet(openwebui_db)
    seen_before = openwebui_reads(openwebui_db, OLD, NEW, "frank-large-terse")
    apply_rekey(str(openwebui_db), RENAME)
    seen = openwebui_reads(openwebui_db, OLD, NEW, "frank-large-terse")
    assert seen["models"][NEW] == seen_before["models"][OLD]
    assert seen["models"][NEW]["found"] and seen["models"][NEW]["version_in_history"]
    assert seen["models"][NEW]["grants"] == sorted(list(grant) for grant in GRANTS)
    assert seen["models"][NEW]["description"] == f"{OLD} on the fleet"  # the row's content came along
    assert seen["models"][OLD] == {"found": False, "description": None, "base_model_id": None, "version_in_history": False, "grants": []}
    assert seen["models"]["frank-large-terse"]["base_model_id"] == NEW
    assert seen["config"]["openai.api_configs"]["0"]["model_ids"] == ["frank-zealot", NEW]
    assert seen["config"]["ui.default_models"] == f"{NEW},frank-zealot"
    assert seen["config"]["ui.model_order_list"] == ["frank-zealot", NEW]
    assert seen["config"]["task.model.default"] == NEW


def test_the_backup_is_taken_first_beside_the_database_root_only_and_opens(openwebui_db):
    seeded_fleet(openwebui_db)
    result = apply_rekey(str(openwebui_db), RENAME, clock=lambda: CLOCK)
    [backup] = backups(openwebui_db)
    assert result.backup == str(backup)
    assert backup.name == "webui.db.bak-20261014T174640Z"  # `date -u -d @1792000000`
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600  # it holds the connection keys
    # It opens, and it holds the state before the re-key.
    assert rows(backup, "SELECT id FROM model WHERE id IN (?, ?)", (OLD, NEW)) == [(OLD,)]
    assert rows(backup, "SELECT count(*) FROM access_grant WHERE resource_id = ?", (OLD,)) == [(2,)]
    assert rows(backup, "PRAGMA integrity_check") == [("ok",)]


def test_a_rerun_is_a_no_op(openwebui_db):
    seeded_fleet(openwebui_db)
    apply_rekey(str(openwebui_db), RENAME, clock=lambda: CLOCK)
    before = fingerprint(openwebui_db)
    again = apply_rekey(str(openwebui_db), RENAME, clock=lambda: CLOCK + 60)
    assert not again.changed and again.backup is None and again.diff == {}
    assert again.renames[0]["status"] == "done"
    assert fingerprint(openwebui_db) == before
    assert len(backups(openwebui_db)) == 1


def test_neither_id_present_changes_nothing_and_says_so(openwebui_db):
    seed_model(openwebui_db, "frank-zealot")
    before = fingerprint(openwebui_db)
    result = apply_rekey(str(openwebui_db), RENAME)
    assert not result.changed and result.renames[0]["status"] == "absent"
    assert fingerprint(openwebui_db) == before and backups(openwebui_db) == []


def test_a_new_id_that_exists_is_refused_naming_its_rows_and_nothing_is_written(openwebui_db):
    seeded_fleet(openwebui_db)
    seed_model(openwebui_db, NEW, grants=(("user", "*", "read"),))
    before = fingerprint(openwebui_db)
    with pytest.raises(RekeyError) as refused:
        apply_rekey(str(openwebui_db), RENAME)
    message = str(refused.value)
    assert f"{OLD!r} -> {NEW!r}" in message
    assert f"model['{NEW}'].id" in message and "model_history[" in message and "access_grant[" in message
    assert "nothing was changed" in message
    assert fingerprint(openwebui_db) == before and backups(openwebui_db) == []


def test_a_new_id_already_in_a_connection_list_is_a_conflict_too(openwebui_db):
    seed_model(openwebui_db, OLD)
    seed_connections(openwebui_db, [OLD, NEW])
    with pytest.raises(RekeyError, match=r"config\['openai.api_configs'\].value\[0\].model_ids"):
        apply_rekey(str(openwebui_db), RENAME)


def test_check_mode_touches_nothing_and_the_diff_lists_the_rows_that_move(openwebui_db):
    seeded_fleet(openwebui_db)
    before = fingerprint(openwebui_db)
    mtime = openwebui_db.stat().st_mtime_ns
    result = apply_rekey(str(openwebui_db), RENAME, check_mode=True)
    assert result.changed and result.backup is None
    assert fingerprint(openwebui_db) == before and openwebui_db.stat().st_mtime_ns == mtime and backups(openwebui_db) == []
    assert f"model['{OLD}'].id: {OLD}\n" in result.diff["before"]
    assert f"model['{OLD}'].id: {NEW}\n" in result.diff["after"]
    assert f"model['frank-large-terse'].base_model_id: {NEW}\n" in result.diff["after"]
    assert CONNECTION_KEY not in result.diff["before"] + result.diff["after"]
    # The plan agrees with what the run then moves.
    moved = apply_rekey(str(openwebui_db), RENAME).renames[0]["moved"]
    assert moved == result.renames[0]["moved"]
    assert plan_rekey(str(openwebui_db), RENAME).renames[0].status == "done"


@pytest.mark.parametrize("table", ["access_grant", "model_history", "model", "config"])
def test_a_database_without_a_table_of_the_set_is_refused_naming_it(openwebui_db, table):
    with sqlite3.connect(openwebui_db) as conn:
        conn.execute(f'DROP TABLE "{table}"')
    with pytest.raises(RekeyError) as refused:
        apply_rekey(str(openwebui_db), RENAME)
    assert f"lacks the table(s) {table} " in str(refused.value)
    assert f"open-webui {SCHEMA_VERSION}" in str(refused.value)


def test_without_backup_nothing_is_written_beside_the_database(openwebui_db):
    seeded_fleet(openwebui_db)
    result = apply_rekey(str(openwebui_db), RENAME, backup=False)
    assert result.changed and result.backup is None and backups(openwebui_db) == []


def test_two_renames_move_in_one_transaction(openwebui_db):
    seeded_fleet(openwebui_db)
    renames = parse_renames([{"from": OLD, "to": NEW}, {"from": "frank-zealot", "to": "frank-archon"}])
    apply_rekey(str(openwebui_db), renames)
    assert config_value(openwebui_db, "openai.api_configs")["0"]["model_ids"] == ["frank-archon", NEW]
    assert config_value(openwebui_db, "ui.default_models") == f"{NEW},frank-archon"


def test_an_endpoint_renamed_twice_moves_the_id_that_holds_rows(openwebui_db):
    """frank-large -> frank-dragoon -> frank-goliath: the kept records name both old ids, and the
    rows sit under the newest of them; the older one is absent and not a conflict."""
    seed_model(openwebui_db, NEW, grants=GRANTS)
    seed_connections(openwebui_db, [NEW], [])
    renames = parse_renames([{"from": OLD, "to": "frank-goliath"}, {"from": NEW, "to": "frank-goliath"}])
    result = apply_rekey(str(openwebui_db), renames)
    assert result.changed
    assert rows(openwebui_db, "SELECT id FROM model") == [("frank-goliath",)]
    assert config_value(openwebui_db, "openai.api_configs")["0"]["model_ids"] == ["frank-goliath"]
    again = apply_rekey(str(openwebui_db), renames)
    assert not again.changed and backups(openwebui_db) == [Path(result.backup)]


def test_two_old_ids_holding_rows_for_one_new_id_are_refused_naming_both(openwebui_db):
    seed_model(openwebui_db, OLD)
    seed_model(openwebui_db, NEW)
    before = fingerprint(openwebui_db)
    renames = parse_renames([{"from": OLD, "to": "frank-goliath"}, {"from": NEW, "to": "frank-goliath"}])
    with pytest.raises(RekeyError, match="'frank-large' .*'frank-dragoon' .*would all become 'frank-goliath', merging models"):
        apply_rekey(str(openwebui_db), renames)
    assert fingerprint(openwebui_db) == before and backups(openwebui_db) == []


def test_a_failure_inside_the_transaction_leaves_every_row_as_it_was(openwebui_db, monkeypatch):
    seeded_fleet(openwebui_db)
    from ansible_collections.frank.llm_fleet.plugins.module_utils.clients import openwebui

    real = openwebui._config_ids
    calls = []

    def fail_on_the_config(kind, value, ident, new):  # the table rows are written by then
        if ident != new:
            calls.append(kind)
            raise sqlite3.OperationalError("disk I/O error")
        return real(kind, value, ident, new)

    monkeypatch.setattr(openwebui, "_config_ids", fail_on_the_config)
    with pytest.raises(sqlite3.OperationalError):
        apply_rekey(str(openwebui_db), RENAME, backup=False)
    assert calls  # the failure came after the UPDATEs of the tables
    assert rows(openwebui_db, "SELECT id FROM model WHERE id IN (?, ?)", (OLD, NEW)) == [(OLD,)]
    assert rows(openwebui_db, "SELECT count(*) FROM access_grant WHERE resource_id = ?", (OLD,)) == [(2,)]


@pytest.mark.parametrize(
    ("renames", "field"),
    [
        ([{"from": OLD, "to": OLD}], "renames[0]: from and to are the same"),
        ([{"from": OLD}], "renames[0]: expected exactly the keys from and to"),
        ([{"from": OLD, "to": "a,b"}], "renames[0].to: a served id cannot hold a comma"),
        ([{"from": "", "to": NEW}], "renames[0].from: a served id must be non-empty"),
        ([{"from": OLD, "to": NEW}, {"from": OLD, "to": "frank-archon"}], "appear twice as from"),
        ([{"from": OLD, "to": NEW}, {"from": NEW, "to": "frank-archon"}], "both a from and a to"),
        ({"from": OLD, "to": NEW}, "renames: expected a list"),
    ],
)
def test_bad_renames_are_refused_naming_the_field(renames, field):
    with pytest.raises(RekeyError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_renames(renames)


@pytest.mark.slow
def test_the_role_rekeys_in_check_mode_then_for_real(openwebui_db, tmp_path):
    seeded_fleet(openwebui_db)
    role = {"ansible.builtin.include_role": {"name": "frank.llm_fleet.openwebui_models"}}
    variables = {"openwebui_models_db_path": str(openwebui_db), "openwebui_models_renames": [{"from": OLD, "to": NEW}]}
    tasks = [{"ansible.builtin.set_fact": variables}, role]
    before = fingerprint(openwebui_db)
    proc, results = play(tmp_path, tasks, check=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert any(result.get("changed") for result in results) and fingerprint(openwebui_db) == before
    proc, results = play(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert fingerprint(openwebui_db) != before and len(backups(openwebui_db)) == 1
    assert rows(openwebui_db, "SELECT id FROM model WHERE id = ?", (NEW,)) == [(NEW,)]
    proc, results = play(tmp_path, tasks)
    assert proc.returncode == 0 and not any(result.get("changed") for result in results)
    assert CONNECTION_KEY not in proc.stdout
    assert os.path.exists(openwebui_db)
