"""Fixtures of the brain-age tests: the cohort generator of :mod:`tests.support.cohorts`."""

from __future__ import annotations

import pytest

from tests.support.cohorts import Cohort, CohortFactory, make_cohort


@pytest.fixture(scope="session")
def cohort_factory() -> CohortFactory:
    """The generator itself (session-scoped so hypothesis tests may use it)."""
    return make_cohort


@pytest.fixture(scope="session")
def cohort() -> Cohort:
    return make_cohort(7)
