"""Node runners run side by side, one thread each, and what each one ended with."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from node.runner import NodeRunner


def run_side_by_side(
    nodes: Iterable[str], runner_for: Callable[[str], NodeRunner], *, timeout: float
) -> dict[str, object]:
    """Each node's ``run()`` result, or the exception it raised (absent if still running)."""
    outcomes: dict[str, object] = {}

    def run(node: str) -> None:
        runner = runner_for(node)
        try:
            outcomes[node] = runner.run()
        except BaseException as error:
            outcomes[node] = error

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    return outcomes
