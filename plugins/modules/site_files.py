#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: site_files
short_description: Write a generated static site's files in one step, each atomically, changed only when its bytes differ
version_added: 0.4.0
description:
  - Writes each of O(files) (plain file name to content) into O(dest). A file whose content and mode
    already match is left alone; any other is replaced through a temp file and a rename, so a
    reader never sees half a page.
  - File names are plain names (no C(/) or C(..)); a symlink at O(dest) or at a file's path is
    refused. At most 64 files of at most 4 MiB each.
  - Used by the homepage role for the site generated from the deployed shapes (one call instead
    of one copy task per page).
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: full
    description: In check mode the module reports which files would be written and writes none.
  diff_mode:
    support: full
    description: The diff shows each file that would be written, before and after.
  idempotent:
    support: full
    description: A second run with the same files reports no change.
options:
  dest:
    description: The site root (created, mode 0755, when missing).
    type: path
    required: true
  files:
    description: File contents by plain file name.
    type: dict
    required: true
  mode:
    description: The files' mode.
    type: str
    default: "0644"
"""

EXAMPLES = r"""
- name: Write the homepage
  frank.llm_fleet.site_files:
    dest: /var/www/frank-homepage
    files: "{{ groups['llm_endpoints'] | frank.llm_fleet.fleet_endpoints(hostvars) | frank.llm_fleet.homepage_site }}"
"""

RETURN = r"""
dest:
  description: The site root.
  returned: success
  type: str
written:
  description: The files written (or that would be, in check mode).
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.site_files import ensure_site
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.step_report import report
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "files": {"type": "dict", "required": True},
            "mode": {"type": "str", "default": "0644"},
        },
        supports_check_mode=True,
    )
    report(module, lambda: ensure_site(module.params, Host(module.run_command, module.check_mode), module._diff))


if __name__ == "__main__":
    main()
