"""openwebui_rekey against hostile input: ids that would break a line or a query, a database path
that points elsewhere, tables and values past the bounds. Each case runs on a copy of the real
migrated OpenWebUI database (scripts/openwebui_db.sh)."""

from __future__ import annotations

import hashlib
import sqlite3
import time
import uuid

import pytest
from openwebui_db import config_value, rows, seed_config, seed_connections, seed_model

from ansible_collections.frank.llm_fleet.plugins.module_utils.clients import openwebui
from ansible_collections.frank.llm_fleet.plugins.module_utils.clients.openwebui import (
    MAX_CONFIG_BYTES,
    MAX_ROWS,
    RekeyError,
    Rename,
    apply_rekey,
    parse_renames,
)

NEW = "frank-dragoon"


def fingerprint(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("bad", ["frank\nlarge", "frank\rlarge", "frank\x00large", "frank\x1b[31mlarge", "frank\x7flarge"])
def test_an_id_with_a_control_character_is_refused_naming_the_field(bad):
    with pytest.raises(RekeyError, match=r"renames\[0\]\.to: control characters"):
        parse_renames([{"from": "frank-large", "to": bad}])
    with pytest.raises(RekeyError, match=r"renames\[0\]\.from: control characters"):
        parse_renames([{"from": bad, "to": NEW}])


@pytest.mark.parametrize("quoted", ["frank'large", 'frank"large', "frank'); DROP TABLE model; --", "frank-%_large"])
def test_quotes_and_sql_in_an_id_are_data(openwebui_db, quoted):
    # The ids are bound parameters: quotes and SQL move as text, and LIKE wildcards match nothing else.
    seed_model(openwebui_db, quoted, grants=(("user", "*", "read"),))
    seed_model(openwebui_db, "frank-xx-large")  # what `%_` would match were it a pattern
    seed_connections(openwebui_db, [quoted, "frank-xx-large"])
    result = apply_rekey(str(openwebui_db), parse_renames([{"from": quoted, "to": NEW}]))
    assert result.changed
    assert sorted(rows(openwebui_db, "SELECT id FROM model")) == [("frank-dragoon",), ("frank-xx-large",)]
    assert rows(openwebui_db, "SELECT resource_id FROM access_grant") == [(NEW,)]
    assert config_value(openwebui_db, "openai.api_configs")["0"]["model_ids"] == [NEW, "frank-xx-large"]


def test_a_database_path_that_is_a_symlink_is_refused_and_its_target_untouched(openwebui_db, tmp_path):
    seed_model(openwebui_db, "frank-large")
    link = tmp_path / "elsewhere" / "webui.db"
    link.parent.mkdir()
    link.symlink_to(openwebui_db)
    before = fingerprint(openwebui_db)
    with pytest.raises(RekeyError) as refused:
        apply_rekey(str(link), (Rename("frank-large", NEW),))
    assert f"{str(link)!r} is a symlink (to {str(openwebui_db)!r}); give the database's real path" in str(refused.value)
    assert fingerprint(openwebui_db) == before
    assert list(link.parent.iterdir()) == [link] and list(openwebui_db.parent.glob("*.bak-*")) == []


def test_a_link_planted_at_the_backup_name_is_never_followed(openwebui_db, tmp_path):
    seed_model(openwebui_db, "frank-large")
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    planted = openwebui.backup_path(openwebui_db, 1_792_000_000.0)
    planted.symlink_to(victim)
    with pytest.raises(RekeyError, match="already exists"):
        apply_rekey(str(openwebui_db), (Rename("frank-large", NEW),), clock=lambda: 1_792_000_000.0)
    assert victim.read_text() == "keep me"
    assert rows(openwebui_db, "SELECT id FROM model") == [("frank-large",)]  # nothing written either


@pytest.mark.parametrize("path", ["relative/webui.db", "/nonexistent/webui.db"])
def test_a_path_that_is_not_an_existing_absolute_file_is_refused(path):
    with pytest.raises(RekeyError, match="db: "):
        apply_rekey(path, (Rename("frank-large", NEW),))


def test_a_file_that_is_not_sqlite_is_refused(tmp_path):
    fake = tmp_path / "webui.db"
    fake.write_bytes(b"not a database" * 100)
    with pytest.raises(RekeyError, match="is not a SQLite database"):
        apply_rekey(str(fake), (Rename("frank-large", NEW),))
    assert fake.read_bytes() == b"not a database" * 100


def test_a_huge_table_of_other_rows_is_re_keyed_quickly(openwebui_db):
    # 100,000 grants of other models: the re-key reads only the rows of the ids it moves.
    seed_model(openwebui_db, "frank-large", grants=(("user", "*", "read"),))
    with sqlite3.connect(openwebui_db) as conn:
        conn.executemany(
            "INSERT INTO access_grant (id, resource_type, resource_id, principal_type, principal_id, permission, created_at)"
            " VALUES (?, 'model', ?, 'user', ?, 'read', 0)",
            ((f"grant-{i}", f"other-{i % 500}", f"user-{i}") for i in range(100_000)),
        )
    started = time.monotonic()
    result = apply_rekey(str(openwebui_db), (Rename("frank-large", NEW),))
    elapsed = time.monotonic() - started
    assert result.changed and rows(openwebui_db, "SELECT count(*) FROM access_grant WHERE resource_id = ?", (NEW,)) == [(1,)]
    assert elapsed < 10, f"re-key with a 100,000-row access_grant took {elapsed:.1f} s"


def test_an_id_holding_more_rows_than_the_bound_is_refused_naming_the_table(openwebui_db):
    seed_model(openwebui_db, "frank-large")
    with sqlite3.connect(openwebui_db) as conn:
        conn.executemany(
            "INSERT INTO access_grant (id, resource_type, resource_id, principal_type, principal_id, permission, created_at)"
            " VALUES (?, 'model', 'frank-large', 'user', ?, 'read', 0)",
            ((str(uuid.uuid4()), f"user-{i}") for i in range(MAX_ROWS + 1)),
        )
    before = fingerprint(openwebui_db)
    with pytest.raises(RekeyError, match=f"access_grant.resource_id: more than {MAX_ROWS} rows hold one id"):
        apply_rekey(str(openwebui_db), (Rename("frank-large", NEW),))
    assert fingerprint(openwebui_db) == before


def test_a_config_value_over_the_bound_is_refused_unread(openwebui_db):
    seed_model(openwebui_db, "frank-large")
    seed_config(openwebui_db, "ui.model_order_list", ["x" * 1000] * (MAX_CONFIG_BYTES // 1000))
    with pytest.raises(RekeyError, match=r"config\['ui.model_order_list'\]: the value is \d+ bytes, over the"):
        apply_rekey(str(openwebui_db), (Rename("frank-large", NEW),))


def test_a_config_value_that_is_not_json_is_refused_naming_the_key(openwebui_db):
    seed_model(openwebui_db, "frank-large")
    with sqlite3.connect(openwebui_db) as conn:
        conn.execute("INSERT INTO config (\"key\", value, updated_at) VALUES ('openai.api_configs', '{not json', 0)")
    with pytest.raises(RekeyError, match=r"config\['openai.api_configs'\]: the value is not JSON"):
        apply_rekey(str(openwebui_db), (Rename("frank-large", NEW),))


@pytest.mark.parametrize("depth", [100, 200_000])
def test_a_deeply_nested_config_value_is_refused_naming_the_key(openwebui_db, depth):
    # 200,000 levels was a RecursionError in json.loads; 100 decodes, and is still refused.
    seed_model(openwebui_db, "frank-large")
    with sqlite3.connect(openwebui_db) as conn:
        conn.execute("INSERT INTO config (\"key\", value, updated_at) VALUES ('ui.model_order_list', ?, 0)", ("[" * depth + "]" * depth,))
    before = fingerprint(openwebui_db)
    with pytest.raises(RekeyError, match=r"^config\['ui.model_order_list'\]: the value is nested more than 32 levels deep.*inspect it"):
        apply_rekey(str(openwebui_db), (Rename("frank-large", NEW),))
    assert fingerprint(openwebui_db) == before


def test_a_database_held_by_another_writer_is_refused_after_the_wait(openwebui_db, monkeypatch):
    # OpenWebUI writing at the same moment: the re-key waits BUSY_TIMEOUT_S for the write lock,
    # then fails naming the lock; nothing is half-written.
    seed_model(openwebui_db, "frank-large")
    monkeypatch.setattr(openwebui, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(openwebui_db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(RekeyError, match="stayed locked by another writer"):
            apply_rekey(str(openwebui_db), (Rename("frank-large", NEW),))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert rows(openwebui_db, "SELECT id FROM model") == [("frank-large",)]
    assert list(openwebui_db.parent.glob("*.bak-*")) == []


def test_a_backup_that_fails_midway_leaves_no_partial_copy_and_no_row_moved(openwebui_db, monkeypatch):
    # A full disk during the copy: the half-written file is removed (it must never pass for a
    # backup) and the re-key rolls back.
    seed_model(openwebui_db, "frank-large")
    real_connect = openwebui.connect

    class FailingSource:
        def __init__(self, conn):
            self.conn = conn

        def backup(self, dest):
            dest.execute("CREATE TABLE partial (x)")
            raise sqlite3.OperationalError("database or disk is full")

        def __getattr__(self, name):  # the read-only plan reads through it as usual
            return getattr(self.conn, name)

    monkeypatch.setattr(
        openwebui, "connect", lambda db, read_only: FailingSource(real_connect(db, read_only=True)) if read_only else real_connect(db, read_only=False)
    )
    with pytest.raises(sqlite3.OperationalError, match="disk is full"):
        apply_rekey(str(openwebui_db), (Rename("frank-large", NEW),))
    assert list(openwebui_db.parent.glob("*.bak-*")) == []
    assert rows(openwebui_db, "SELECT id FROM model") == [("frank-large",)]
