# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""endpoint_preflight: the endpoint role's controller-side checks in one task, in this process
(no module, no host). The checks and their words are plugins/plugin_utils/endpoint_preflight.py;
this adapter hands them the host's variables as Ansible holds them (untemplated, with the file and
line each was read from) and the other endpoints of the inventory."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.frank.llm_fleet.plugins.plugin_utils.endpoint_preflight import ROLE_DEFAULTS, Neighbour, port_origin, preflight
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.user_errors import origin_of

try:  # Ansible 2.19: where a value was read from
    from ansible._internal._datatag._tags import Origin
except ImportError:  # pragma: no cover - another Ansible
    Origin = None

ENDPOINT_GROUP = "llm_endpoints"


def _origin_path(value: Any) -> str:
    tag = Origin.get_tag(value) if Origin is not None else None
    return str(getattr(tag, "path", "") or "")


class _Variables:
    """HostVariables over an action's task_vars and templar."""

    def __init__(self, task_vars: Mapping[str, Any], template: Any) -> None:
        self._vars = task_vars
        self._template = template

    def names(self) -> Iterable[str]:
        return self._vars.keys()

    def raw(self, name: str) -> Any:
        return self._vars[name]

    def value(self, name: str) -> Any:
        return self._template(self._vars[name])

    def origin(self, value: Any) -> str | None:
        return origin_of(value)

    def where(self, name: str) -> str | None:
        """The line of the variable's name where it is the inventory's; a variable the inventory
        overrides keeps the role default's name (its first place), so then the value's line."""
        for key in self._vars:
            if key == name:
                if _origin_path(key).endswith(ROLE_DEFAULTS):
                    return origin_of(self._vars[name]) or origin_of(key)
                return origin_of(key) or origin_of(self._vars[name])
        return None

    def is_role_default(self, name: str) -> bool:
        return _origin_path(self._vars.get(name)).endswith(ROLE_DEFAULTS)

    def locked(self, names: Iterable[str]) -> list[str]:
        found = []
        for name in names:
            if name not in self._vars:
                continue
            raw = self._vars[name]
            entries = [(f"{name}.{key}", raw[key]) for key in raw] if isinstance(raw, Mapping) else [(name, raw)]
            for label, entry in entries:
                try:
                    # A vaulted value decrypts on use; a template resolves (and decrypts what it names).
                    str(self._template(entry))
                except Exception as exc:  # only a vault failure is this check's business
                    if "vault" not in f"{type(exc).__name__} {exc}".lower():
                        continue
                    where = origin_of(entry) or self.where(name)
                    found.append(f"{label} ({where})" if where else label)
        return found


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        host = str(task_vars.get("inventory_hostname", ""))
        variables = _Variables(task_vars, self._templar.template)
        verdict = preflight(host, variables, self._neighbours(host, task_vars), self._reads_secrets(task_vars))
        if not verdict.ok:
            return {**result, "failed": True, "msg": verdict.message(host), "problems": verdict.problems}
        return {**result, "changed": False, "msg": verdict.firewall or "the preflight checks pass", "problems": []}

    def _reads_secrets(self, task_vars: Mapping[str, Any]) -> bool:
        """A run that reads the vaulted values: not a budget-only run (`--tags budget`), not the
        fleet plan (endpoint_budget_controller_only); the task's `secrets` argument overrides."""
        if "secrets" in self._task.args:
            return boolean(self._task.args["secrets"], strict=False)
        tags = set(task_vars.get("ansible_run_tags") or ["all"])
        plan = self._templar.template(task_vars.get("endpoint_budget_controller_only", False))
        return bool(tags - {"budget"}) and not boolean(plan, strict=False)

    def _neighbours(self, host: str, task_vars: Mapping[str, Any]) -> list[Neighbour]:
        """Every other endpoint of the inventory (whatever --limit selected): its machine, its port
        and the line that set that port."""
        hostvars = task_vars.get("hostvars")
        others = []
        for other in (task_vars.get("groups") or {}).get(ENDPOINT_GROUP) or []:
            if other == host or hostvars is None:
                continue
            theirs = hostvars[other]  # templated in that endpoint's own context
            shape = theirs.get("endpoint_shape")
            if not isinstance(shape, Mapping) or shape.get("port") is None:
                continue
            raw = hostvars.raw_get(other) if hasattr(hostvars, "raw_get") else {}
            raw_shape = raw.get("endpoint_shape") if isinstance(raw, Mapping) else None
            where = port_origin(raw_shape, origin_of) if isinstance(raw_shape, Mapping) else None
            others.append(Neighbour(str(other), str(theirs.get("ansible_host", other)), shape["port"], where))
        return others
