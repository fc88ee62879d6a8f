"""Fixtures for tests/unit."""

from hub_payload import hub  # noqa: F401  # pylint: disable=unused-import  # the fixture, shared with tests/hostile
from openwebui_db import openwebui_db, openwebui_schema_db  # noqa: F401  # pylint: disable=unused-import  # the fixtures, shared with tests/hostile
from relay_fixtures import running_relay  # noqa: F401  # pylint: disable=unused-import  # the fixture, shared with tests/hostile
