"""The coordinator's stream-deadline watchdog (coordinator/limits.py), on its own thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from coordinator.limits import Watchdog


@pytest.fixture
def watchdog() -> Iterator[Watchdog]:
    dog = Watchdog(time.monotonic)
    yield dog
    dog.stop()


def test_a_deadline_armed_after_a_later_one_still_fires_on_time(watchdog: Watchdog) -> None:
    fired: list[tuple[str, float]] = []
    done = threading.Event()
    start = time.monotonic()
    watchdog.arm(30.0, lambda: fired.append(("late", time.monotonic())))
    watchdog.arm(0.05, lambda: (fired.append(("soon", time.monotonic())), done.set()))
    assert done.wait(5.0), "the sooner deadline did not fire while a later one was waiting"
    assert [name for name, _ in fired] == ["soon"]
    assert fired[0][1] - start < 2.0


def test_deadlines_armed_in_order_fire_in_order(watchdog: Watchdog) -> None:
    fired: list[int] = []
    done = threading.Event()
    for index in range(5):
        watchdog.arm(0.02 * (index + 1), lambda index=index: fired.append(index))
    watchdog.arm(0.15, done.set)
    assert done.wait(5.0)
    assert fired == [0, 1, 2, 3, 4]


def test_a_disarmed_deadline_never_runs_and_the_next_one_does(watchdog: Watchdog) -> None:
    ran = threading.Event()
    wrongly: list[str] = []
    cancelled = watchdog.arm(0.02, lambda: wrongly.append("disarmed callback ran"))
    assert watchdog.disarm(cancelled) is False
    token = watchdog.arm(0.05, ran.set)
    assert ran.wait(5.0)
    assert wrongly == []
    assert watchdog.disarm(token) is True  # it had run: the guarded call was ended
