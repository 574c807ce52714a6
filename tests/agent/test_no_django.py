"""The agent is a standalone program: importing any of its modules pulls in no Django."""

from __future__ import annotations

from tests.standalone import assert_imports_no_service


def test_agent_modules_import_without_django():
    assert_imports_no_service("agent", also="agent.workload")
