# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Qualification of one shape key: the ladder's search (ladder), its result table and the
recommended inventory snippet (verdicts), and the host's dead-man's switch (deadman)."""
