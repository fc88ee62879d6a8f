# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Shared `attributes:` for modules that only read and report.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    description: The module changes nothing, so check mode runs it in full.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  idempotent:
    support: full
    description: Running it again gives the same result.
"""

    # Shared `attributes:` for modules that change the host.
    CHANGES_HOST = r"""
attributes:
  check_mode:
    support: full
    description: In check mode the module reports what it would change and changes nothing.
  diff_mode:
    support: full
    description: Reports the before and after of what it changes.
  idempotent:
    support: full
    description: A second run with the same arguments reports no change.
"""
