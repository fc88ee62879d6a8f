#!/usr/bin/env bash
# ansible-test sanity on the collection. ansible-test needs the collection at a path ending in
# ansible_collections/frank/llm_fleet, so the tracked files are copied into such a tree.
set -euo pipefail
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT_DIR"

pip_version=$(python - <<'PY'
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.host_configs import NativePythonConfig
print(get_venv_packages(NativePythonConfig(version="3.11"))["pip"])
PY
)
cache=~/.ansible/test/cache/get_pip_${pip_version//./_}.py
mkdir -p "$(dirname "$cache")"
cp scripts/get_pip_offline.py "$cache"

work=${SANITY_WORK_DIR:-$ROOT_DIR/.cache/sanity}
dest=$work/ansible_collections/frank/llm_fleet
rm -rf "$dest"
mkdir -p "$dest"
# Tracked and untracked-but-not-ignored files: what a commit would hold.
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [[ -e $f ]] && printf '%s\0' "$f"
done | tar --null -T - -c | tar -C "$dest" -x
cd "$dest"
git init -q . && git add -A >/dev/null   # ansible-test reads the file list from git
ansible-test sanity --venv --python 3.11 --color no "$@"
