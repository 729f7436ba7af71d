"""Machinery the tests share: processes, sessions, cohorts and egress bundles (no tests here)."""
