"""A session at the scale of real imaging studies: 3 TREs × 3,000 subjects × 2,641 features.

Smith et al. (2019) fit brain age on 2,641 imaging-derived phenotypes. With
the one-release plan (``--nan-policy drop``) each node releases Σx, Σxxᵀ and
the age sums in one egress of about 3.5·10^6 values. The benchmark writes
such a federation with ``zerosum federation init --synthetic``, starts the real
``zerosum coordinator`` and three ``zerosum node`` processes on 127.0.0.1
(mutual TLS, ``--approve auto``), and measures, as medians over the runs:

* ``ukb_session_seconds``: from starting the nodes until the last one exits;
* ``ukb_node_peak_rss_mb``: the largest peak resident set of the three nodes
  (``ru_maxrss`` from ``wait4``: the kernel's own peak, no sampling);
* ``ukb_coordinator_peak_rss_mb``: the coordinator's peak.

The runs use only the command line, so the same module measures an older
checkout too (``python -m benchmarks.ukb_bench --once`` from that checkout's
environment), which is how the "before" figures in the README were taken.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["run", "session"]

NODES = ("a", "b", "c")
FEATURES = 2641
SUBJECTS = 3000
_LISTENING = re.compile(r"listening on 127\.0\.0\.1:\d+")
_TIMEOUT = 900.0


def _zerosum(*argv: str) -> list[str]:
    return [sys.executable, "-m", "zerosum.cli", *argv]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(popen: subprocess.Popen[bytes], deadline: float) -> tuple[int, float]:
    """Reap ``popen``; (exit status, peak RSS in MB) from wait4."""
    while True:
        pid, status, usage = os.wait4(popen.pid, os.WNOHANG)
        if pid == popen.pid:
            popen.returncode = os.waitstatus_to_exitcode(status)
            return popen.returncode, usage.ru_maxrss / 1024.0
        if time.monotonic() > deadline:
            popen.kill()
            raise TimeoutError(f"{popen.args!r} did not finish within {_TIMEOUT:.0f} s")
        time.sleep(0.05)


def session(work: Path) -> dict[str, float]:
    """One session in ``work``: wall time and peak RSS figures (see the module docstring)."""
    fed = work / "federation"
    subprocess.run(
        _zerosum(
            "federation",
            "init",
            "--nodes",
            ",".join(NODES),
            "--out",
            str(fed),
            "--synthetic",
            "--seed",
            "7",
            "--cohort-sizes",
            ",".join([str(SUBJECTS)] * len(NODES)),
            "--n-features",
            str(FEATURES),
            "--n-components",
            "10",
            "--holdout-size",
            "100",
            "--coordinator",
            "127.0.0.1:1",
            "--nan-policy",
            "drop",
            "--join-deadline",
            "300",
            "--round-deadline",
            "600",
        ),
        check=True,
        capture_output=True,
    )
    address = f"127.0.0.1:{_free_port()}"
    deadline = time.monotonic() + _TIMEOUT
    log = (work / "coordinator.log").open("wb")
    coordinator = subprocess.Popen(
        _zerosum(
            "coordinator",
            "--federation",
            str(fed / "federation.toml"),
            "--state",
            str(work / "state.sqlite"),
            "--listen",
            address,
        ),
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    while not _LISTENING.search((work / "coordinator.log").read_text(errors="replace")):
        if coordinator.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the coordinator did not start listening")
        time.sleep(0.05)
    start = time.monotonic()
    nodes = [
        subprocess.Popen(
            _zerosum(
                "node",
                "--federation",
                str(fed / "federation.toml"),
                "--node-id",
                node,
                "--out",
                str(work / f"out-{node}"),
                "--state",
                str(work / f"state-{node}"),
                "--approve",
                "auto",
                "--coordinator",
                address,
            ),
            stdout=subprocess.DEVNULL,
            stderr=(work / f"node-{node}.log").open("wb"),
        )
        for node in NODES
    ]
    peaks = []
    for node in nodes:
        code, peak = _wait(node, deadline)
        if code != 0:
            raise RuntimeError(f"a node exited with status {code}; see {work}")
        peaks.append(peak)
    seconds = time.monotonic() - start
    code, coordinator_peak = _wait(coordinator, deadline)
    log.close()
    if code != 0:
        raise RuntimeError(f"the coordinator exited with status {code}; see {work}")
    return {
        "ukb_session_seconds": seconds,
        "ukb_node_peak_rss_mb": max(peaks),
        "ukb_coordinator_peak_rss_mb": coordinator_peak,
    }


def run(repeats: int) -> dict[str, float]:
    """Medians of ``repeats`` sessions, each in a fresh temporary folder."""
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="zerosum-ukb-") as folder:
            runs.append(session(Path(folder)))
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ukb_bench", description=__doc__)
    parser.add_argument("--once", action="store_true", help="one session, figures as JSON")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    figures = run(1 if args.once else args.repeats)
    print(json.dumps(figures, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
