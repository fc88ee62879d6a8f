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

    # boot_calibration: writes a file in the calibration store, shows no diff of it.
    STORES_NO_DIFF = r"""
attributes:
  check_mode:
    support: full
    description: In check mode the module reports whether the boot would be stored (and the comparison) and writes nothing.
  diff_mode:
    support: none
    description: No diff is returned; C(path) names the file the boot is stored in.
  idempotent:
    support: full
    description: The same boot recorded twice is one point; the second run reports no change.
"""

    # endpoint_bench: sends requests to measure, changes nothing, and in check mode sends nothing.
    MEASURES = r"""
attributes:
  check_mode:
    support: partial
    description: Check mode is accepted, but the module does not run in it.
    details: In check mode nothing is sent, so nothing is measured; the result says so in C(msg).
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  idempotent:
    support: full
    description: Never reports a change; each run measures again.
"""
