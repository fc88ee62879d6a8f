# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An endpoint's secrets on the host: the engine's secret environment (the inventory's secrets plus
the API key under the variable its runtime reads), the step arguments as recorded (without
them), and the last-known-good secrets kept beside the env files for the next rollback.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import UNIT_OPTIONS
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import DRIVERS
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

# Where each engine reads its API key from the environment (llama-server's --api-key and vLLM's
# --api-key would put it in argv, /proc/PID/cmdline and the unit file).
# The variable each runtime reads its key from (runtimes/<name>.py `api_key_env`).
API_KEY_ENV = {name: runtime.api_key_env for name, runtime in DRIVERS.items()}
# Environment names that carry credentials: refused in the plain (recorded, 0640) environment.
_SECRET_NAME_PARTS = ("API_KEY", "TOKEN", "PASSWORD", "SECRET")
# Words that hold a part and name no credential: halogen's HALOGEN_TOKENIZER is a directory, and
# a token count is a number.
_PLAIN_WORDS = frozenset({"TOKENIZER", "TOKENIZERS", "TOKENS"})


def looks_like_credential(name: str) -> bool:
    """A variable name holding API_KEY, or a word holding TOKEN, PASSWORD or SECRET (HF_TOKEN,
    DB_PASSWORD, MYSECRET), unless that word is a plain one (TOKENIZER)."""
    upper = str(name).upper()
    if "API_KEY" in upper:
        return True
    words = [word for word in re.split(r"[^A-Z0-9]+", upper) if word not in _PLAIN_WORDS]
    return any(part in word for word in words for part in _SECRET_NAME_PARTS)


def without_secrets(params: dict[str, Any] | None) -> dict[str, Any]:
    """Step arguments as recorded: no secret environment, no key (health and probe carry one)."""
    kept = {k: v for k, v in (params or {}).items() if k != "secret_environment"}
    if isinstance(kept.get("health"), dict):
        kept["health"] = {k: v for k, v in kept["health"].items() if k not in ("api_key", "drain_api_key")}
    return kept


def engine_secrets(params: dict[str, Any]) -> dict[str, str]:
    """The engine's secret environment: the inventory's secrets plus the endpoint's API key under
    the variable its runtime reads."""
    secrets = {str(k): str(v) for k, v in (params.get("secret_environment") or {}).items()}
    api_key = params.get("api_key") or ""
    for where in ("engine", "unit"):
        plain = ((params.get(where) or {}).get("environment")) or {}
        leaked = sorted(k for k in plain if looks_like_credential(k))
        if leaked:
            raise StepError(
                f"{where}.environment: {', '.join(leaked)} look like credentials, and the plain environment is recorded and "
                "readable: give an API key as endpoint_api_key and other secrets in endpoint_secret_environment (from Ansible Vault)",
                {"changed": False},
            )
    if api_key:
        runtime = str((params.get("shape") or {}).get("runtime", ""))
        if runtime not in API_KEY_ENV:
            known = ", ".join(API_KEY_ENV)
            raise StepError(f"api_key: the shape's runtime ({runtime or 'none given'}) has no API-key variable; use one of {known}", {"changed": False})
        secrets[API_KEY_ENV[runtime]] = api_key
    return secrets


def with_key(step: dict[str, Any] | None, api_key: str) -> dict[str, Any] | None:
    """A health or probe argument set that authenticates with the endpoint's key."""
    if not step or not api_key:
        return step
    return {**step, "api_key": api_key}


def secrets_path(unit: dict[str, Any]) -> str:
    """The last-known-good secrets: beside the env files (root-only), never in the record."""
    env_dir = str(unit.get("env_dir") or UNIT_OPTIONS["env_dir"]["default"])
    return os.path.join(env_dir, str(unit["name"]).rsplit(".", 1)[0] + ".last-good-secrets.json")


def keep_secrets(host: Host, path: str, secrets: dict[str, str], previous: dict[str, Any] | None) -> bool:
    """After a green deploy: the secrets it ran with, kept for the next rollback (0600, the file
    only: a step reports the file, never its content). Returns whether they changed."""
    if previous == secrets:
        return False
    if secrets:
        host.write(path, json.dumps(secrets, sort_keys=True) + "\n", 0o600, dir_mode=0o700)
    elif previous is not None:
        host.remove(path)
    return True


def restored_key(previous: dict[str, Any], secrets: dict[str, str], api_key: str) -> str:
    """The key the restored engine holds: the one in its secrets, whichever runtime it runs."""
    runtime = str((previous.get("shape") or {}).get("runtime", ""))
    return secrets.get(API_KEY_ENV.get(runtime, ""), "") if runtime in API_KEY_ENV else api_key
