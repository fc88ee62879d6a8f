#!/usr/bin/env bash
# A real OpenWebUI database for the re-key tests.
#   scripts/openwebui_db.sh                 build it (cached) and print its path
#   scripts/openwebui_db.sh read DB ID...   print, as JSON, what OpenWebUI's own code reads from
#                                           DB for these model ids (tests/unit/openwebui_reader.py)
# The build runs open-webui's own alembic migrations (`alembic upgrade head` with the package's
# alembic.ini) against an empty SQLite file, in a venv that holds the wheel and only what those
# migrations and the reader import (scripts/openwebui_db.requirements.txt). Cached by the
# requirements' hash under .cache/openwebui/VERSION/; the tests copy the database per test.
set -euo pipefail
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REQS=$ROOT_DIR/scripts/openwebui_db.requirements.txt
VERSION=$(sed -n 's/^open-webui==//p' "$REQS")
CACHE=$ROOT_DIR/.cache/openwebui/$VERSION
DB=$CACHE/webui.db
STAMP=$CACHE/.requirements.sha256
PYTHON=${PYTHON:-python3}  # open-webui needs 3.11 or 3.12; Debian 12 ships 3.11
log() { printf '[openwebui_db] %s\n' "$*" >&2; }

# OpenWebUI's code, run against DATABASE ($1) with DATA_DIR beside it and nothing fetched; the
# secret key is a placeholder its import path insists on (no server runs, nothing is signed).
openwebui() {
    local database=$1
    shift
    env DATA_DIR="$(dirname "$database")" DATABASE_URL="sqlite:///$database" \
        WEBUI_SECRET_KEY=import-only-placeholder HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        OFFLINE_MODE=1 ENABLE_ORJSON=false "$@"
}

build() {
    local want package
    want=$(sha256sum "$REQS" | cut -d' ' -f1)
    [[ -f $DB && $(cat "$STAMP" 2>/dev/null) == "$want" ]] && return 0
    log "building open-webui $VERSION's database from its migrations into $CACHE"
    rm -rf "$CACHE"
    mkdir -p "$CACHE/data"
    "$PYTHON" -m venv "$CACHE/venv"
    "$CACHE/venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$REQS"
    package=$("$CACHE/venv/bin/python" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("open_webui").origin))')
    # The package's alembic.ini sits in open_webui/ and its script_location is relative to it.
    (cd "$package" && openwebui "$CACHE/data/webui.db" "$CACHE/venv/bin/alembic" upgrade head >"$CACHE/alembic.log" 2>&1) ||
        { log "alembic upgrade head failed; see $CACHE/alembic.log"; tail -20 "$CACHE/alembic.log" >&2; exit 1; }
    mv "$CACHE/data/webui.db" "$DB"
    echo "$want" >"$STAMP"
    log "ready: $DB"
}

build
case ${1:-} in
    "") echo "$DB" ;;
    read)
        [[ $# -ge 3 ]] || { log "usage: $0 read DB MODEL_ID..."; exit 2; }
        database=$(realpath "$2")
        shift 2
        cd "$(dirname "$database")"
        openwebui "$database" "$CACHE/venv/bin/python" "$ROOT_DIR/tests/unit/openwebui_reader.py" "$@"
        ;;
    *) log "usage: $0 [read DB MODEL_ID...]"; exit 2 ;;
esac
