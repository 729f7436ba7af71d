"""Run a sweep's cells on a Dask cluster (``dask.distributed``) instead of the local pool.

A cell is a pure function of its description and the sweep seed, so where it
runs does not change its rows: a worker computes the cell's CSV text and
returns it, and the driver writes ``cells/<file>`` atomically as each result
arrives — the same bytes as a local run, and the same resume rule (a file
that exists is a finished cell). Workers therefore need this package
installed at the same version, not the driver's file system.

Two ways to get a cluster:

* ``DaskTarget(scheduler="tcp://host:8786")`` connects to a running
  scheduler (``dask scheduler`` and ``dask worker`` on the machines);
* ``DaskTarget(local_workers=N)`` starts a ``distributed.LocalCluster`` of N
  single-threaded workers on 127.0.0.1 for this run and stops it afterwards
  (``processes=False`` runs them as threads of this process).

Each task is named after its cell file, so the scheduler's dashboard shows
which cell is running. ``dask.distributed`` is an optional dependency
(``pip install 'zerosum[cluster]'``); without it :class:`ClusterError` says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from simulations.errors import SimulationError

__all__ = ["ClusterError", "ClusterTargetError", "DaskTarget", "map_on_dask"]

T = TypeVar("T")
R = TypeVar("R")

INSTALL_HINT = "install the cluster extra: pip install 'zerosum[cluster]'"


class ClusterError(SimulationError, RuntimeError):
    """The Dask cluster cannot be used: not installed, unreachable, or too slow."""


class ClusterTargetError(SimulationError, ValueError):
    """A :class:`DaskTarget` setting is out of range; names the setting and the value."""


@dataclass(frozen=True)
class DaskTarget:
    """Where to run: a scheduler's address, or a local cluster of ``local_workers``.

    ``connect_timeout`` bounds reaching the scheduler; ``timeout``, if given,
    bounds the whole run (seconds).
    """

    scheduler: str | None = None
    local_workers: int = 0
    processes: bool = True
    connect_timeout: float = 30.0
    timeout: float | None = None

    def __post_init__(self) -> None:
        if (self.scheduler is None) == (self.local_workers == 0):
            raise ClusterTargetError(
                "give either a scheduler address or a number of local workers, not both or "
                f"neither; got scheduler={self.scheduler!r}, local_workers={self.local_workers!r}"
            )
        if self.scheduler is not None and (
            not isinstance(self.scheduler, str) or "://" not in self.scheduler
        ):
            raise ClusterTargetError(
                f"scheduler must be an address such as tcp://127.0.0.1:8786; got {self.scheduler!r}"
            )
        workers = self.local_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ClusterTargetError(f"local_workers must be a whole number >= 1; got {workers!r}")
        for name in ("connect_timeout", "timeout"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ClusterTargetError(f"{name} must be > 0 seconds; got {value!r}")

    @property
    def description(self) -> str:
        if self.scheduler is not None:
            return f"Dask scheduler {self.scheduler}"
        kind = "processes" if self.processes else "threads"
        return f"local Dask cluster of {self.local_workers} worker {kind}"


def _distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise ClusterError(f"dask.distributed is not installed ({exc}); {INSTALL_HINT}") from None
    return distributed


@contextmanager
def _client(target: DaskTarget) -> Iterator[Any]:
    distributed = _distributed()
    cluster = None
    try:
        if target.scheduler is None:
            # Worker processes talk over TCP on loopback; threads use in-process transport.
            network = {"host": "127.0.0.1", "scheduler_port": 0} if target.processes else {}
            cluster = distributed.LocalCluster(
                n_workers=target.local_workers,
                threads_per_worker=1,
                processes=target.processes,
                # None does not turn the scheduler's HTTP server off: it listens on
                # port 8787 of every interface, and a second sweep fails on it. A
                # free port of the loopback interface keeps it local and apart.
                dashboard_address="127.0.0.1:0",
                **network,
            )
            address = cluster
        else:
            address = target.scheduler
        try:
            client = distributed.Client(
                address, timeout=f"{target.connect_timeout}s", set_as_default=False
            )
        except OSError as exc:
            raise ClusterError(f"cannot reach the {target.description}: {exc}") from None
        try:
            yield client
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()


def map_on_dask(
    target: DaskTarget,
    function: Callable[[T], R],
    items: Sequence[T],
    keys: Sequence[str],
) -> Iterator[tuple[int, R]]:
    """``(i, function(items[i]))`` for every item, in the order the results arrive.

    ``keys`` name the tasks on the scheduler (unique). Past ``target.timeout``
    :class:`ClusterError` is raised; what was already yielded stays yielded.
    A task's exception is raised here.
    """
    if len(keys) != len(items) or len(set(keys)) != len(keys):
        raise ValueError("keys must name every item once")
    if not items:
        return
    distributed = _distributed()
    timeout = target.timeout
    deadline = None if timeout is None else time.monotonic() + timeout
    with _client(target) as client:
        futures = {
            client.submit(function, item, key=key, pure=False): i
            for i, (item, key) in enumerate(zip(items, keys, strict=True))
        }
        waiting = set(futures)
        while waiting:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ClusterError(
                    f"{len(waiting)} of {len(items)} tasks still running on the "
                    f"{target.description} after {timeout:g} s"
                )
            try:
                # This client is not the process-wide default; wait() must be told.
                with client.as_current():
                    done, waiting = distributed.wait(
                        waiting, timeout=left, return_when="FIRST_COMPLETED"
                    )
            except TimeoutError:
                continue
            for future in sorted(done, key=futures.__getitem__):
                yield futures[future], future.result()
