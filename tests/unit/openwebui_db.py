"""A real OpenWebUI database for the re-key tests, and rows seeded the way OpenWebUI writes them.

scripts/openwebui_db.sh runs open-webui's own alembic migrations (the version pinned in
scripts/openwebui_db.requirements.txt) into an empty SQLite file, once (cached under .cache/);
each test gets its own copy. Shared with tests/hostile."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "openwebui_db.sh"
NOW = 1_792_000_000  # a fixed epoch second (2026-10-14) for created_at/updated_at
# A connection key in the api_configs value: it must never reach a result, a diff or an error.
CONNECTION_KEY = "sk-openwebui-connection-key-never-shown"


@pytest.fixture(scope="session")
def openwebui_schema_db() -> Path:
    """The migrated, empty database (built on first use; a cached rerun is instant)."""
    proc = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def openwebui_db(openwebui_schema_db, tmp_path) -> Path:
    """A copy of the migrated database in the test's own directory."""
    db = tmp_path / "data" / "webui.db"
    db.parent.mkdir()
    shutil.copyfile(openwebui_schema_db, db)
    return db


def _dumps(value) -> str:
    # OpenWebUI's JSON columns are written by json.dumps(value, ensure_ascii=False)
    # (open_webui/internal/db.py, the engine's json_serializer with ENABLE_ORJSON off).
    return json.dumps(value, ensure_ascii=False)


def seed_model(db: Path, model_id: str, *, base_model_id: str | None = None, grants: tuple[tuple[str, str, str], ...] = ()) -> None:
    """A model row as Models.insert_new_model writes it (models/models.py): the row, its first
    configuration history entry (model.version_id -> model_history.id, migration e7b9d4a023bc),
    and its access grants (access_grant, migration f1e2d3c4b5a6): (principal_type, principal_id,
    permission), e.g. ("user", "*", "read") for a public model."""
    version_id = str(uuid.uuid4())
    meta = {"description": f"{model_id} on the fleet", "profile_image_url": "/static/favicon.png", "capabilities": {"vision": False}}
    snapshot = {"name": model_id, "base_model_id": base_model_id, "params": {}, "meta": meta}
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO model (id, user_id, base_model_id, name, params, meta, updated_at, created_at, is_active, version_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?)",
            (model_id, "admin-user-id", base_model_id, model_id, _dumps({}), _dumps(meta), NOW, NOW, version_id),
        )
        conn.execute(
            "INSERT INTO model_history (id, model_id, parent_id, snapshot, user_id, commit_message, created_at) VALUES (?, ?, NULL, ?, ?, NULL, ?)",
            (version_id, model_id, _dumps(snapshot), "admin-user-id", NOW),
        )
        conn.executemany(
            "INSERT INTO access_grant (id, resource_type, resource_id, principal_type, principal_id, permission, created_at)"
            " VALUES (?, 'model', ?, ?, ?, ?, ?)",
            [(str(uuid.uuid4()), model_id, ptype, pid, perm, NOW) for ptype, pid, perm in grants],
        )


def seed_config(db: Path, key: str, value) -> None:
    """A per-key config row as Config.upsert writes it (models/config.py, migration 3ff2c63645b8)."""
    with sqlite3.connect(db) as conn:
        conn.execute('INSERT OR REPLACE INTO config ("key", value, updated_at) VALUES (?, ?, ?)', (key, _dumps(value), NOW))


def seed_connections(db: Path, *model_id_lists: list[str]) -> None:
    """openai.api_configs as the admin's connection form saves it (routers/openai.py
    update_config): one entry per connection index, as a string."""
    seed_config(
        db,
        "openai.api_configs",
        {
            str(index): {"enable": True, "tags": [], "prefix_id": "", "model_ids": ids, "connection_type": "external", "key": CONNECTION_KEY}
            for index, ids in enumerate(model_id_lists)
        },
    )


def openwebui_reads(db: Path, *model_ids: str) -> dict:
    """What OpenWebUI's own code (its models, access grants, model history and config layers)
    reads from `db` for these model ids: tests/unit/openwebui_reader.py in the build's venv."""
    proc = subprocess.run([str(BUILD), "read", str(db), *model_ids], capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rows(db: Path, sql: str, params=()) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, params).fetchall()


def config_value(db: Path, key: str):
    (value,) = rows(db, 'SELECT value FROM config WHERE "key" = ?', (key,))[0]
    return json.loads(value)
