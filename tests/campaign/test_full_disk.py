"""A full disk under the coordinator's state: nothing half-written, and a clean restart.

No mount is needed: the coordinator process gets a file-size limit
(RLIMIT_FSIZE, set with ``prlimit`` on the running process, or before the
command starts), so any write that would grow one of its files beyond the
limit fails with EFBIG, as on a full file system (Python ignores SIGXFSZ).
A limit of one byte at a chosen moment is a disk that is full from then on;
the coordinator's output goes through pipes, which the limit does not touch.

Three moments: before the coordinator has written anything (``at-start``),
once every node joined (``joined``: the uploads of round 0 cannot be stored),
and once round 0 is published (``round-1``). Each time the test checks that

* the coordinator either keeps running or ends, but says why in sentences,
  never with a traceback;
* SQLite's integrity check passes, and every payload the state refers to
  exists and has the SHA-256 recorded for it (no half-written payload under
  a final name);

then stops it (SIGKILL, as an operator clearing the disk would) and starts it
again with no limit: the session resumes and completes exactly, or every
process that fails states its reason.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import blake3
import numpy as np
import pytest

from coordinator.store import payload_dir_for
from tests.campaign.digest import integrity_ok
from tests.support.federations import three_cohort_federation
from tests.support.processes import Federation, Processes, Spawned, wait_until
from tests.support.sessions import SessionRun, reference_model, relative_difference

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES = ("a", "b", "c")
DEADLINE = 60.0
FULL_SECONDS = 15.0
# Sets the file-size limit in the coordinator process itself, then runs the CLI.
_LIMITED = (
    "import resource, sys\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "from zerosum.cli import main\n"
    "raise SystemExit(main(sys.argv[2:]))\n"
)


def _pump(stream: IO[bytes], path: Path) -> None:
    with stream, path.open("ab") as out:
        for line in iter(stream.readline, b""):
            out.write(line)
            out.flush()


def _coordinator(run: SessionRun, limit: int | None) -> Spawned:
    """The coordinator of ``run`` with its output through pipes (and a file-size limit)."""
    argv = [
        "coordinator",
        "--federation",
        str(run.federation.toml),
        "--state",
        str(run.state.path),
        "--listen",
        run.address,
    ]
    prefix = ["-m", "zerosum.cli"] if limit is None else ["-c", _LIMITED, str(limit)]
    name = f"{run.label}-coordinator-{len(run.coordinators)}"
    logs = run.processes.logs
    logs.mkdir(parents=True, exist_ok=True)
    popen = subprocess.Popen(
        [sys.executable, *prefix, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    spawned = Spawned(name, tuple(argv), popen, logs / f"{name}.stdout", logs / f"{name}.stderr")
    assert popen.stdout is not None and popen.stderr is not None
    for stream, path in ((popen.stdout, spawned.stdout_path), (popen.stderr, spawned.stderr_path)):
        threading.Thread(target=_pump, args=(stream, path), daemon=True).start()
    run.processes.spawned.append(spawned)
    run.coordinators.append(spawned)
    return spawned


def _listening(run: SessionRun, spawned: Spawned) -> None:
    wait_until(
        lambda: f"listening on {run.address}" in spawned.stderr(),
        what=f"{spawned.name} to listen",
        alive=[spawned],
    )


def _fill_disk(spawned: Spawned) -> None:
    """From now on no file of the process may grow: a full disk."""
    resource.prlimit(spawned.pid, resource.RLIMIT_FSIZE, (1, 1))


def _payloads_complete(run: SessionRun) -> list[str]:
    """Every payload file the state names exists with its recorded SHA-256; problems found."""
    problems = []
    folder = payload_dir_for(run.state.path)
    named = [("uploads", row) for row in run.state.query("SELECT path, digest FROM uploads")] + [
        ("results", row) for row in run.state.query("SELECT path, digest FROM results")
    ]
    for table, (name, digest) in named:
        path = folder / name
        if not path.is_file():
            problems.append(f"{table}: {name} is missing")
        elif blake3.blake3(path.read_bytes()).digest() != bytes(digest):
            problems.append(f"{table}: {name} does not match its SHA-256")
    return problems


def _delivered(run: SessionRun, round_index: int) -> set[str]:
    rows = run.state.query("SELECT node_id FROM deliveries WHERE round_index = ?", (round_index,))
    return {r[0] for r in rows}


def _answered(run: SessionRun, round_index: int) -> set[str]:
    rows = run.state.query(
        "SELECT node_id FROM unmask_corrections WHERE round_index = ?", (round_index,)
    )
    return {r[0] for r in rows}


def _no_traceback(spawned: Spawned) -> None:
    text = spawned.stderr()
    assert "Traceback" not in text, spawned.describe()


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    return three_cohort_federation(tmp_path_factory.mktemp("disk") / "federation", NODES, DEADLINE)


# A storage failure inside a call (EFBIG here, ENOSPC on a real disk, SQLite's
# "disk I/O error") is answered UNAVAILABLE: the call kept nothing, and a node
# retries UNAVAILABLE, so the session resumes once the disk has room again.


def _run_into_a_full_disk(run: SessionRun, moment: str) -> None:
    """Start the session and let the coordinator's disk fill at ``moment``; it is stopped."""
    if moment == "at-start":
        first = _coordinator(run, limit=1)
        code = first.wait(60)
        assert code != 0
        _no_traceback(first)
        assert first.stderr().strip(), "the coordinator stopped without a word"
        print(f"{moment}: exit {code}: {first.stderr().strip().splitlines()[-1]}")
        for node in NODES:
            run.start_node(node, approve="manual")
    else:
        first = _coordinator(run, limit=None)
        _listening(run, first)
        for node in NODES:
            run.start_node(node, approve="manual")
        wait_until(run.state.roster_final, what="every node to join", alive=run.everyone())
        if moment == "round-1":
            for node in NODES:
                run.approve(node, 0)
            wait_until(lambda: run.state.result(0), what="round 0's result", alive=[first])
            # Filling the disk before a node fetched round 0 is the case below.
            wait_until(
                lambda: _delivered(run, 0) == set(NODES),
                what="every node to fetch round 0",
                alive=run.everyone(),
            )
        _fill_disk(first)
        round_index = 0 if moment == "joined" else 1
        for node in NODES:
            run.approve(node, round_index)
        # The disk stays full a while: uploads come and cannot be stored.
        time.sleep(FULL_SECONDS)
        _no_traceback(first)
        print(f"{moment}: coordinator {'running' if first.running() else 'exited'}; log tail:")
        print("\n".join(first.stderr().strip().splitlines()[-4:]))
        first.kill()


def _check_the_end(
    run: SessionRun, second: Spawned, codes: dict[str, int], federation: Federation
) -> None:
    """After the restart: the pooled model if every process succeeded, else one clear line."""
    if all(code == 0 for code in codes.values()):
        pooled = reference_model(federation, NODES, NODES)
        for node in NODES:
            assert relative_difference(run.model(node), pooled, federation.holdout()) <= 1e-9
            assert json.loads((run.out(node) / "model.json").read_text())
        return
    for spawned in [second, *run.nodes.values()]:
        if not spawned.running() and spawned.popen.returncode != 0:
            _no_traceback(spawned)
            lines = spawned.stderr().strip().splitlines()
            assert lines, f"{spawned.name} failed without a word"
            print(f"  {spawned.name} exited {spawned.popen.returncode}: {lines[-1]}")
            assert "UNKNOWN" not in lines[-1], lines[-1]


@pytest.mark.parametrize(
    "moment",
    [
        "at-start",
        "joined",
        "round-1",
    ],
)
def test_a_full_disk_leaves_nothing_half_written_and_a_restart_is_clean(
    moment: str, federation: Federation, tmp_path: Path, processes: Processes
) -> None:
    run = SessionRun(federation, tmp_path / moment, processes)
    _run_into_a_full_disk(run, moment)
    if run.state.path.exists():
        assert integrity_ok(run.state.path) == "ok"
        assert _payloads_complete(run) == []

    second = _coordinator(run, limit=None)
    _listening(run, second)
    if moment == "at-start":
        for node in NODES:
            run.approve(node, 0)
    if moment != "round-1":
        for node in NODES:
            run.approve(node, 1)
    codes = run.wait_all(240)
    print(f"{moment}: exit codes after the restart {codes}")
    assert integrity_ok(run.state.path) == "ok"
    assert _payloads_complete(run) == []
    leftovers = [p.name for p in payload_dir_for(run.state.path).iterdir() if ".part" in p.name]
    assert leftovers == []
    for round_index in (0, 1):
        published = run.state.result(round_index)
        if published is not None:
            survivors, aggregate = published
            assert np.array_equal(aggregate, run.audit_sum(survivors, round_index))
    _check_the_end(run, second, codes, federation)


def test_a_full_disk_while_a_node_fetches_the_aggregate_does_not_stop_that_node(
    federation: Federation, tmp_path: Path, processes: Processes
) -> None:
    run = SessionRun(federation, tmp_path / "fetching", processes)
    first = _coordinator(run, limit=None)
    _listening(run, first)
    for node in NODES:
        run.start_node(node, approve="manual")
    wait_until(run.state.roster_final, what="every node to join", alive=run.everyone())
    for node in NODES:
        run.approve(node, 0)
    # The first node to answer the unmask request waits for the others: stop it
    # there, so that it fetches the aggregate only once the disk is full.
    give_up = time.monotonic() + 90
    while not (answered := _answered(run, 0)):
        assert time.monotonic() < give_up, "no unmask answer"
        time.sleep(0.002)
    late = sorted(answered)[0]
    os.kill(run.nodes[late].pid, signal.SIGSTOP)
    others = set(NODES) - {late}
    wait_until(
        lambda: _delivered(run, 0) >= others, what="the others to fetch round 0", alive=[first]
    )
    _fill_disk(first)
    os.kill(run.nodes[late].pid, signal.SIGCONT)
    time.sleep(FULL_SECONDS)
    first.kill()
    second = _coordinator(run, limit=None)
    _listening(run, second)
    # Today: "failed: the coordinator refused a request: GetResult: UNKNOWN:
    # Exception iterating responses: disk I/O error" (recording the delivery failed).
    assert run.nodes[late].running(), run.nodes[late].describe()
    for node in NODES:
        run.approve(node, 1)
    codes = run.wait_all(240)
    assert codes == dict.fromkeys(["coordinator", *NODES], 0), run.describe()
