#!/usr/bin/env bash
# Builds a real OpenWebUI database: open-webui's own alembic migrations (`alembic upgrade head`
# with the package's alembic.ini) run against an empty SQLite file, in a venv that holds the
# wheel and only what the migrations import (scripts/openwebui_db.requirements.txt). The
# re-key tests (tests/unit/test_openwebui_rekey.py) copy this file per test. Cached by the
# requirements' hash: a rerun prints the path and exits. Prints the database's path on stdout.
set -euo pipefail
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REQS=$ROOT_DIR/scripts/openwebui_db.requirements.txt
VERSION=$(sed -n 's/^open-webui==//p' "$REQS")
CACHE=$ROOT_DIR/.cache/openwebui/$VERSION
DB=$CACHE/webui.db
STAMP=$CACHE/.requirements.sha256
PYTHON=${PYTHON:-python3}  # open-webui needs 3.11 or 3.12; Debian 12 ships 3.11
log() { printf '[openwebui_db] %s\n' "$*" >&2; }

want=$(sha256sum "$REQS" | cut -d' ' -f1)
if [[ -f $DB && $(cat "$STAMP" 2>/dev/null) == "$want" ]]; then
    echo "$DB"
    exit 0
fi

log "building open-webui $VERSION's database from its migrations into $CACHE"
rm -rf "$CACHE"
mkdir -p "$CACHE/data"
"$PYTHON" -m venv "$CACHE/venv"
"$CACHE/venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$REQS"
package=$("$CACHE/venv/bin/python" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("open_webui").origin))')
# The package's alembic.ini sits in open_webui/ and its script_location is relative to it.
# DATA_DIR keeps anything the import writes out of the package; the secret key is a
# placeholder the import path insists on (no server runs, nothing is signed with it).
(
    cd "$package"
    DATA_DIR="$CACHE/data" DATABASE_URL="sqlite:///$CACHE/data/webui.db" \
        WEBUI_SECRET_KEY=migration-only-placeholder HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        OFFLINE_MODE=1 ENABLE_ORJSON=false \
        "$CACHE/venv/bin/alembic" upgrade head >"$CACHE/alembic.log" 2>&1
) || { log "alembic upgrade head failed; see $CACHE/alembic.log"; tail -20 "$CACHE/alembic.log" >&2; exit 1; }
mv "$CACHE/data/webui.db" "$DB"
echo "$want" >"$STAMP"
log "ready: $DB"
echo "$DB"
