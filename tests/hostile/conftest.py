"""Fixtures for tests/hostile: the Hub emulator and the GGUF writer of tests/unit, shared, not copied."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from hub_payload import hub  # noqa: F401  # pylint: disable=unused-import  # the fixture
from openwebui_db import openwebui_db, openwebui_schema_db  # noqa: F401  # pylint: disable=unused-import  # the fixtures
from relay_fixtures import running_relay  # noqa: F401  # pylint: disable=unused-import  # the fixture
