"""Make `ansible_collections.frank.llm_fleet` importable from this checkout."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLECTIONS = ROOT / ".collections"
_link = COLLECTIONS / "ansible_collections" / "frank" / "llm_fleet"
if not _link.exists():
    _link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("../../..", _link)
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
