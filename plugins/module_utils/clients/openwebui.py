# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""OpenWebUI's served-id re-keying: when an endpoint's served id changes, the rows of OpenWebUI's
SQLite database that are keyed by that id move to the new id in one transaction, after a backup.

The fleet's history (seeds/004): "OpenWebUI.md: the id-keyed trio (model row, access_grant,
api_configs model_ids) is a foreign-key set — re-key it in the same deploy". The set re-keyed
here, checked against open-webui SCHEMA_VERSION's own migrations (scripts/openwebui_db.sh builds
that database for the tests):

- `model.id`: the model row (name, description, params, the version pointer);
- `access_grant.resource_id` where `resource_type = 'model'`: who may use the model;
- `config['openai.api_configs']`: each OpenAI connection's `model_ids` allow-list;
- `model.base_model_id`: presets built on the served model (a preset left on the old id
  proxies to a model that no longer exists);
- `model_history.model_id`: the model's configuration history (`model.version_id` points into
  it; left behind, the model's history and its current version would dangle);
- `config['ui.default_models']`, `config['ui.default_pinned_models']` (comma-joined ids),
  `config['ui.model_order_list']` (a list), `config['task.model.default']`,
  `config['task.model.external']` (one id): settings that select the model by id.

Not re-keyed, on purpose: chats, chat messages and feedback rows record which model answered
at the time; they are history, and the fleet's rule for history is that it stays ("Retired
frank-medium/small/npu names are history and stay.", seeds/004). `ollama.api_configs` names
Ollama's own model tags, which the fleet (llama-server and vLLM over the OpenAI API) never serves.
Per-user settings (`user.settings`, a user's own pinned models) are left to their users.

Standard library only (sqlite3): the module runs on the OpenWebUI host. The writes are one
transaction (BEGIN IMMEDIATE: no other writer can slip in between the plan, the backup and the
update). A running OpenWebUI keeps its model list in memory, so the new id shows only after it
restarts; the role restarts the unit it is given.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.request import pathname2url

from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError, parse_text

# The open-webui release whose migrations the table set and the columns were checked against.
SCHEMA_VERSION = "0.12.4"
REQUIRED_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "model": ("id", "base_model_id"),
    "access_grant": ("id", "resource_type", "resource_id"),
    "model_history": ("id", "model_id"),
    "config": ("key", "value", "updated_at"),
}
# Upper bounds on what one id may hold, so a damaged or hostile database fails with the bound
# named instead of being read without end.
MAX_ROWS = 10_000
MAX_CONFIG_BYTES = 4 << 20
# OpenWebUI's id-keyed config values are two levels deep ({"0": {"model_ids": [...]}}); a value
# nested deeper than this is refused, naming its key (a 4 MiB "[[[[..." was a RecursionError).
MAX_CONFIG_DEPTH = 32
MAX_ID_LENGTH = 256
BUSY_TIMEOUT_S = 10.0


class RekeyError(ValueError):
    """A re-key refused: the message names the field or the rows, and the fix."""


@dataclass(frozen=True)
class Rename:
    old: str
    new: str


@dataclass(frozen=True)
class Ref:
    """One place that holds a served id: a table, the row's primary key, and the column (or the
    JSON path inside a config value)."""

    table: str
    row: str
    column: str

    def __str__(self) -> str:
        return f"{self.table}[{self.row!r}].{self.column}"


@dataclass(frozen=True)
class RenamePlan:
    rename: Rename
    moves: tuple[Ref, ...]  # where the old id is
    present: tuple[Ref, ...]  # where the new id already is

    @property
    def status(self) -> str:
        if self.moves and self.present:
            return "conflict"
        if self.moves:
            return "move"
        return "done" if self.present else "absent"


@dataclass(frozen=True)
class Plan:
    renames: tuple[RenamePlan, ...]

    @property
    def changed(self) -> bool:
        return any(item.status == "move" for item in self.renames)

    @property
    def conflicts(self) -> tuple[RenamePlan, ...]:
        return tuple(item for item in self.renames if item.status == "conflict")

    @property
    def merges(self) -> dict[str, list[RenamePlan]]:
        """New ids that more than one old id would move rows into: two models would become one."""
        moving: dict[str, list[RenamePlan]] = {}
        for item in self.renames:
            if item.moves:
                moving.setdefault(item.rename.new, []).append(item)
        return {new: items for new, items in moving.items() if len(items) > 1}


@dataclass
class Result:
    changed: bool
    backup: str | None
    renames: list[dict[str, Any]] = field(default_factory=list)
    diff: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------
# The ids
# ------------------------------------------------------------------------------------------------


def parse_served_id(value: Any, name: str) -> str:
    """A served id as the endpoint shape takes it (parse_text: one line, no control characters),
    plus what OpenWebUI's storage needs: not empty, no comma (ui.default_models joins ids with
    commas), no surrounding blanks (OpenWebUI strips them when it splits that list)."""
    try:
        text = parse_text(value, name)
    except ShapeError as exc:
        raise RekeyError(str(exc)) from None
    if not text or text != text.strip():
        raise RekeyError(f"{name}: a served id must be non-empty without leading or trailing blanks, got {text!r}")
    if "," in text:
        raise RekeyError(f"{name}: a served id cannot hold a comma (OpenWebUI joins ids with commas in ui.default_models), got {text!r}")
    if len(text) > MAX_ID_LENGTH:
        raise RekeyError(f"{name}: a served id is at most {MAX_ID_LENGTH} characters, got {len(text)}")
    return text


def parse_renames(value: Any) -> tuple[Rename, ...]:
    """The renames option: a list of {from, to}. An id may be renamed once, and no id may be both
    a source and a target (a chain or a swap depends on the order of the writes: do it in two
    runs). Several old ids may go to one new id (an endpoint renamed twice keeps both old ids in
    its records); the plan refuses when more than one of them still holds rows."""
    if not isinstance(value, (list, tuple)):
        raise RekeyError("renames: expected a list of {from: OLD, to: NEW}")
    renames = []
    for index, item in enumerate(value):
        where = f"renames[{index}]"
        if not isinstance(item, Mapping) or set(item) != {"from", "to"}:
            raise RekeyError(f"{where}: expected exactly the keys from and to, e.g. {{from: frank-large, to: frank-dragoon}}")
        old = parse_served_id(item["from"], f"{where}.from")
        new = parse_served_id(item["to"], f"{where}.to")
        if old == new:
            raise RekeyError(f"{where}: from and to are the same id {old!r}; drop the entry")
        renames.append(Rename(old, new))
    sources = [r.old for r in renames]
    targets = [r.new for r in renames]
    twice = sorted({i for i in sources if sources.count(i) > 1})
    if twice:
        raise RekeyError(f"renames: {twice} appear twice as from; each id is renamed once")
    both = sorted(set(sources) & set(targets))
    if both:
        raise RekeyError(f"renames: {both} are both a from and a to (a chain or a swap); split it into two runs")
    return tuple(renames)


# ------------------------------------------------------------------------------------------------
# The database
# ------------------------------------------------------------------------------------------------


def check_db_path(path: str) -> Path:
    """The database file itself: a symlink is refused (the writes and the backup would land
    beside the link, not beside the database), and so is anything but a regular file."""
    db = Path(path)
    if not db.is_absolute():
        raise RekeyError(f"db: {path!r} is not an absolute path; give the full path of webui.db")
    if db.is_symlink():
        raise RekeyError(f"db: {path!r} is a symlink (to {os.readlink(db)!r}); give the database's real path")
    try:
        mode = db.stat().st_mode
    except FileNotFoundError:
        raise RekeyError(f"db: {path!r} does not exist; give the path of OpenWebUI's webui.db (DATA_DIR/webui.db)") from None
    if not stat.S_ISREG(mode):
        raise RekeyError(f"db: {path!r} is not a regular file")
    return db


def connect(db: Path, *, read_only: bool) -> sqlite3.Connection:
    """A connection in autocommit mode (the transaction is ours to open); `mode=rw` never creates
    a missing file, `mode=ro` never writes."""
    uri = f"file:{pathname2url(str(db))}?mode={'ro' if read_only else 'rw'}"
    return sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_S)


def check_schema(conn: sqlite3.Connection, db: Path) -> None:
    """Refuse a database that lacks a table or a column of the set, naming them and the release
    the set was checked against."""
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise RekeyError(f"db: {str(db)!r} is not a SQLite database ({exc})") from None
    missing = [table for table in REQUIRED_COLUMNS if table not in tables]
    if missing:
        raise RekeyError(
            f"db: {str(db)!r} lacks the table(s) {', '.join(missing)} of OpenWebUI's id-keyed set (checked against open-webui "
            f"{SCHEMA_VERSION}); is this OpenWebUI's webui.db, and has OpenWebUI started once since its upgrade (its migrations create them)?"
        )
    for table, columns in REQUIRED_COLUMNS.items():
        have = {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
        lacking = [column for column in columns if column not in have]
        if lacking:
            raise RekeyError(f"db: table {table} lacks the column(s) {', '.join(lacking)} (checked against open-webui {SCHEMA_VERSION})")


# ------------------------------------------------------------------------------------------------
# Where an id is
# ------------------------------------------------------------------------------------------------

# Each column that holds a served id: (table, primary key, column, extra condition). The SQL is
# built from these constants only; the ids are always bound parameters.
COLUMN_REFS: tuple[tuple[str, str, str, str], ...] = (
    ("model", "id", "id", ""),
    ("model", "id", "base_model_id", ""),
    ("model_history", "id", "model_id", ""),
    ("access_grant", "id", "resource_id", " AND resource_type = 'model'"),
)


def _config_ids(kind: str, value: Any, ident: str, new: str) -> tuple[Any, list[str]]:
    """A config value with `ident` replaced by `new` (pass new=ident to only find it), and the
    paths inside the value where it was."""
    if kind == "connections":  # {"0": {"model_ids": [...], ...}, ...} (a URL key is legacy)
        if not isinstance(value, dict):
            return value, []
        out, paths = {}, []
        for conn_key, conn in value.items():
            ids = conn.get("model_ids") if isinstance(conn, dict) else None
            if isinstance(ids, list) and ident in ids:
                conn = {**conn, "model_ids": [new if item == ident else item for item in ids]}
                paths.append(f"[{conn_key}].model_ids")
            out[conn_key] = conn
        return out, paths
    if kind == "csv":  # "a,b,c" (OpenWebUI's repair turns a list into this)
        if isinstance(value, list):
            return _config_ids("list", value, ident, new)
        if not isinstance(value, str):
            return value, []
        items = [item.strip() for item in value.split(",")]
        if ident not in items:
            return value, []
        return ",".join(new if item == ident else item for item in items), [""]
    if kind == "list":
        if not isinstance(value, list) or ident not in value:
            return value, []
        return [new if item == ident else item for item in value], [""]
    # kind == "id": one id as a JSON string
    return (new, [""]) if value == ident else (value, [])


CONFIG_REFS: Mapping[str, str] = {
    "openai.api_configs": "connections",
    "ui.default_models": "csv",
    "ui.default_pinned_models": "csv",
    "ui.model_order_list": "list",
    "task.model.default": "id",
    "task.model.external": "id",
}


def _bounded(conn: sqlite3.Connection, sql: str, params: Sequence[Any], what: str) -> list[tuple[Any, ...]]:
    rows = conn.execute(sql + f" LIMIT {MAX_ROWS + 1}", params).fetchall()
    if len(rows) > MAX_ROWS:
        raise RekeyError(f"{what}: more than {MAX_ROWS} rows hold one id; refusing to re-key a table this size in one run (inspect it)")
    return rows


def _config_values(conn: sqlite3.Connection) -> dict[str, Any]:
    """The id-keyed config rows, decoded; a value over MAX_CONFIG_BYTES is refused unread."""
    marks = ",".join("?" * len(CONFIG_REFS))
    values = {}
    for key, size in conn.execute(f'SELECT "key", length(CAST(value AS BLOB)) FROM config WHERE "key" IN ({marks})', tuple(CONFIG_REFS)):
        if size is not None and size > MAX_CONFIG_BYTES:
            raise RekeyError(f"config[{key!r}]: the value is {size} bytes, over the {MAX_CONFIG_BYTES}-byte bound; inspect it")
        (raw,) = conn.execute('SELECT value FROM config WHERE "key" = ?', (key,)).fetchone()
        too_deep = RekeyError(
            f"config[{key!r}]: the value is nested more than {MAX_CONFIG_DEPTH} levels deep; OpenWebUI writes at most a few, "
            "so it is damaged or hostile: inspect it (or restore it from a backup) before re-keying"
        )
        try:
            values[key] = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        except RecursionError:
            raise too_deep from None
        except ValueError:
            raise RekeyError(f"config[{key!r}]: the value is not JSON; OpenWebUI would not read it either (inspect it)") from None
        if json_depth(values[key]) > MAX_CONFIG_DEPTH:
            raise too_deep
    return values


def json_depth(value: Any) -> int:
    """How deeply lists and objects nest in a decoded JSON value, walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            if depth <= MAX_CONFIG_DEPTH:
                stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def find_refs(conn: sqlite3.Connection, ident: str, config: Mapping[str, Any]) -> tuple[Ref, ...]:
    """Every place in the set that holds `ident`."""
    refs = []
    for table, key, column, condition in COLUMN_REFS:
        rows = _bounded(conn, f'SELECT "{key}" FROM "{table}" WHERE "{column}" = ?{condition} ORDER BY "{key}"', (ident,), f"{table}.{column}")
        refs += [Ref(table, str(row[0]), column) for row in rows]
    for key, value in config.items():
        paths = _config_ids(CONFIG_REFS[key], value, ident, ident)[1]
        refs += [Ref("config", key, f"value{path}") for path in paths]
    return tuple(refs)


def _plan(conn: sqlite3.Connection, renames: Iterable[Rename]) -> Plan:
    config = _config_values(conn)
    return Plan(tuple(RenamePlan(r, find_refs(conn, r.old, config), find_refs(conn, r.new, config)) for r in renames))


def plan_rekey(db: str, renames: Sequence[Rename]) -> Plan:
    """What apply_rekey would move, read through a read-only connection."""
    path = check_db_path(db)
    conn = connect(path, read_only=True)
    try:
        check_schema(conn, path)
        return _plan(conn, renames)
    finally:
        conn.close()


def refuse_conflicts(plan: Plan) -> None:
    for new, items in plan.merges.items():
        olds = ", ".join(f"{item.rename.old!r} ({', '.join(map(str, item.moves))})" for item in items)
        raise RekeyError(
            f"renames: {olds} all hold rows and would all become {new!r}, merging models; "
            "remove the stale one in OpenWebUI or leave it out of the renames (nothing was changed)"
        )
    if plan.conflicts:
        lines = [f"{item.rename.old!r} -> {item.rename.new!r}: the new id is already in {', '.join(map(str, item.present))}" for item in plan.conflicts]
        raise RekeyError(
            "renames: the new id already exists beside the old one, so a re-key would merge two models; "
            "remove or rename one side in OpenWebUI first (nothing was changed): " + "; ".join(lines)
        )


# ------------------------------------------------------------------------------------------------
# The change
# ------------------------------------------------------------------------------------------------


def backup_path(db: Path, now: float) -> Path:
    """Beside the database, named the way the fleet names its backups (seeds/004: "backup
    webui.db.bak-20261017b"), with the time to the second."""
    return db.with_name(f"{db.name}.bak-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}")


def write_backup(db: Path, now: float, host: Host) -> Path:
    """An online backup (the sqlite3 backup API, through its own read connection: the writer's
    connection already holds the write lock) into a new file, mode 0600 from its creation (the
    config table holds connection keys). O_EXCL: an existing file or link there is never followed.
    The file is made (and a failed copy removed) through `host`; in check mode nothing is."""
    target = backup_path(db, now)
    try:
        fd = host.open_write(str(target), os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        raise RekeyError(f"backup: {str(target)!r} already exists; rerun in a second or move it away") from None
    if fd is None:
        return target
    os.close(fd)
    source = connect(db, read_only=True)
    dest = sqlite3.connect(str(target), isolation_level=None)
    try:
        source.backup(dest)
        dest.execute("SELECT count(*) FROM model").fetchone()  # the copy opens and has the set
    except BaseException:
        dest.close()
        host.remove(str(target), missing_ok=False)  # a partial copy must never pass for a backup
        raise
    finally:
        dest.close()
        source.close()
    return target


def _write(conn: sqlite3.Connection, plan: Plan, now: float) -> None:
    for item in plan.renames:
        if item.status != "move":
            continue
        old, new = item.rename.old, item.rename.new
        for table, _key, column, condition in COLUMN_REFS:
            conn.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE "{column}" = ?{condition}', (new, old))
        for key, value in _config_values(conn).items():
            rewritten, paths = _config_ids(CONFIG_REFS[key], value, old, new)
            if paths:
                # OpenWebUI's own serializer: json.dumps(value, ensure_ascii=False) (internal/db.py).
                conn.execute('UPDATE config SET value = ?, updated_at = ? WHERE "key" = ?', (json.dumps(rewritten, ensure_ascii=False), int(now), key))


def apply_rekey(
    db: str,
    renames: Sequence[Rename],
    *,
    backup: bool = True,
    check_mode: bool = False,
    clock: Callable[[], float] = time.time,
    host: Host | None = None,
) -> Result:
    """Re-key `renames` in the database at `db`: plan under the write lock, refuse conflicts,
    back up, write, commit. Nothing to move: no backup, changed=False. The backup file goes
    through `host` (without one, a files-only Host in `check_mode`), whose check mode plans."""
    host = host or Host.files_only(check_mode)
    path = check_db_path(db)
    # Read-only first: a deploy after a rename names the old ids every time, and most runs have
    # nothing to move; they must not take (or wait for) OpenWebUI's write lock.
    plan = plan_rekey(db, renames)
    refuse_conflicts(plan)
    if host.check_mode or not plan.changed:
        return _result(plan, None)
    conn = connect(path, read_only=False)
    try:
        check_schema(conn, path)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise RekeyError(f"db: {str(path)!r} stayed locked by another writer for {BUSY_TIMEOUT_S:.0f} s ({exc}); rerun") from None
        try:
            plan = _plan(conn, renames)
            refuse_conflicts(plan)
            saved = None
            if plan.changed:
                now = clock()
                saved = str(write_backup(path, now, host)) if backup else None
                _write(conn, plan, now)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()
    return _result(plan, saved)


def _result(plan: Plan, backup: str | None) -> Result:
    renames = [
        {
            "from": item.rename.old,
            "to": item.rename.new,
            "status": item.status,
            "moved": [str(ref) for ref in item.moves] if item.status == "move" else [],
        }
        for item in plan.renames
    ]
    before = [f"{ref}: {item.rename.old}" for item in plan.renames if item.status == "move" for ref in item.moves]
    after = [f"{ref}: {item.rename.new}" for item in plan.renames if item.status == "move" for ref in item.moves]
    diff = {"before": "".join(line + "\n" for line in before), "after": "".join(line + "\n" for line in after)} if before else {}
    return Result(changed=plan.changed, backup=backup, renames=renames, diff=diff)
