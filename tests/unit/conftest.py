"""Fixtures for tests/unit."""

from hub_payload import hub  # noqa: F401 (the fixture, shared with tests/hostile)
