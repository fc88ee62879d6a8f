#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: settings_render
short_description: Render a settings file's ${NAME} secret placeholders from an allowlist, 0600, owned by the service user
version_added: 0.3.0
description:
  - For services that read their settings literally (SearXNG does not expand environment
    variables in settings.yml - the live C(secret_key) once was the string C(${SEARXNG_SECRET})
    and the app tolerated it silently).
  - Each C(${NAME}) in O(content) is replaced by the value of NAME in O(values) when NAME is on O(allowed) and has
    a value. Any other placeholder fails the task, which names the file and every unresolved
    placeholder (not on the allowlist, or without a value); a value for a name off the allowlist
    fails too, and so does a value holding a quote, backslash or control character (it would break
    the YAML string it goes into).
  - The file is written atomically, mode 0600, owned by O(owner) and O(group). The same content,
    mode and owner change nothing. RV(content_changed) says whether the service must restart.
  - Values never appear in the result, errors or logs (O(values) is no_log); no diff is shown.
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: full
    description: In check mode the module reports what it would change and changes nothing.
  diff_mode:
    support: none
    description: The rendered file holds secrets, so no diff is shown.
  idempotent:
    support: full
    description: A second run with the same arguments reports no change.
options:
  content:
    description: The settings text with C(${NAME}) placeholders (for instance a template rendered on the controller).
    type: str
    required: true
  dest:
    description: The rendered file on the host.
    type: path
    required: true
  values:
    description: The placeholders' values, from Ansible Vault.
    type: dict
    default: {}
  allowed:
    description: The placeholder names that may be resolved.
    type: list
    elements: str
    default: [KAGI_API_KEY, SEARXNG_SECRET, SEARXNG_BASE_URL]
  owner:
    description: The service user that owns the file; root when empty.
    type: str
    default: ""
  group:
    description: The file's group; the owner's primary group when empty.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: SearXNG's settings with its secrets
  frank.llm_fleet.settings_render:
    content: "{{ lookup('ansible.builtin.template', 'settings.yml.j2') }}"
    dest: /opt/searxng/config/settings.yml
    values: "{{ searxng_secrets }}"
    owner: searxng
  register: settings

- name: Restart SearXNG only when the settings changed
  ansible.builtin.systemd_service:
    name: searxng.service
    state: restarted
  when: settings.content_changed
"""

RETURN = r"""
dest:
  description: The rendered file.
  returned: success
  type: str
content_changed:
  description: Whether the file's content changed (the service needs a restart); a mode or owner fix alone is not.
  returned: success
  type: bool
placeholders:
  description: The names of the placeholders filled (never their values).
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.settings_render import SEARXNG_ALLOWED, ensure_rendered
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.step_report import report
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "content": {"type": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "values": {"type": "dict", "default": {}, "no_log": True},
            "allowed": {"type": "list", "elements": "str", "default": list(SEARXNG_ALLOWED)},
            "owner": {"type": "str", "default": ""},
            "group": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    report(module, lambda: ensure_rendered(module.params, Host(module.run_command, module.check_mode)))


if __name__ == "__main__":
    main()
