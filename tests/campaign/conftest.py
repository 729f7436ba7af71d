"""The integration tests' process fixtures, for the campaign's real sessions."""

from __future__ import annotations

from tests.integration.conftest import module_processes, processes

__all__ = ["module_processes", "processes"]
