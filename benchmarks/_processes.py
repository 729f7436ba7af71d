"""The processes of the session benchmark: node workers, their fleet, the coordinator.

Every node runs as its own ``python -m benchmarks._session_worker`` process,
driven by one JSON line per command (:class:`Fleet`); the coordinator is the
real ``zerosum coordinator`` command (:func:`coordinator_process`). Every wait
is bounded by a :class:`Deadline` shared by one measurement.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["Deadline", "Fleet", "coordinator_process"]

_ROOT = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


class Deadline:
    """A time limit shared by every wait of one measurement."""

    def __init__(self, seconds: float, what: str) -> None:
        self._end = time.monotonic() + seconds
        self._seconds = seconds
        self._what = what

    def remaining(self, waiting_for: str) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"{self._what} took longer than {self._seconds:.0f} s (waiting for {waiting_for})."
            )
        return left


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    # One numpy thread per process: K processes already share the cores.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


class _Lines:
    """The lines of a child's output pipe, read by a thread as they come."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._queue: queue.Queue[str] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for line in self._stream:
            self._queue.put(line.rstrip("\n"))

    def get(self, timeout: float) -> str:
        """The next line; queue.Empty if none came within ``timeout`` seconds."""
        return self._queue.get(timeout=timeout)

    def close(self) -> None:
        """Once the child has exited: let the reader reach the end, then close the pipe."""
        self._thread.join(timeout=5)
        self._stream.close()


class _Worker:
    """A node process answering one JSON line per command."""

    def __init__(self, federation: Path, node_id: str, index: int, size: int, log: Path) -> None:
        self.node_id = node_id
        self.log = log
        self._log_file = log.open("w")
        arguments = ["--federation", str(federation), "--node-id", node_id]
        arguments += ["--index", str(index), "--size", str(size)]
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "benchmarks._session_worker", *arguments],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log_file,
                text=True,
                cwd=_ROOT,
                env=_child_env(),
            )
        except BaseException:
            self._log_file.close()
            raise
        assert self.process.stdout is not None
        self._lines = _Lines(self.process.stdout)

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def receive(self, deadline: Deadline) -> dict[str, Any]:
        waiting_for = f"node {self.node_id}"
        while True:
            try:
                line = self._lines.get(timeout=min(1.0, deadline.remaining(waiting_for)))
            except queue.Empty:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"node process {self.node_id} exited with status "
                        f"{self.process.returncode}: {self._tail()}"
                    ) from None
                continue
            answer: dict[str, Any] = json.loads(line)
            if "error" in answer:
                raise RuntimeError(f"{answer['error']} ({self._tail()})")
            return answer

    def _tail(self) -> str:
        self._log_file.flush()
        text = self.log.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-5:]) or "no output on stderr"

    def stop(self) -> None:
        try:
            if self.process.poll() is None:
                with contextlib.suppress(OSError):
                    self.send({"cmd": "quit"})
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self._lines.close()
        finally:
            self._log_file.close()


class Fleet:
    """K node processes driven in lock step."""

    def __init__(self, federation: Path, node_ids: Sequence[str], size: int, logs: Path) -> None:
        self.workers: list[_Worker] = []
        try:
            for index, node_id in enumerate(node_ids):
                self.workers.append(
                    _Worker(federation, node_id, index, size, logs / f"node-{node_id}.log")
                )
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, deadline: Deadline) -> None:
        for worker in self.workers:
            worker.receive(deadline)

    def broadcast(self, command: dict[str, Any], deadline: Deadline) -> list[dict[str, Any]]:
        for worker in self.workers:
            worker.send(command)
        return [worker.receive(deadline) for worker in self.workers]

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


class _Coordinator:
    """A ``zerosum coordinator`` process with a fresh state file."""

    def __init__(self, federation: Path, state: Path, deadline: Deadline) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "zerosum.cli",
                "coordinator",
                "--federation",
                str(federation),
                "--state",
                str(state),
                "--listen",
                "127.0.0.1:0",
                "--linger",
                "10",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=_ROOT,
            env=_child_env(),
        )
        assert self.process.stderr is not None
        self._lines = _Lines(self.process.stderr)
        self.seen: list[str] = []
        try:
            self.port = int(self._wait_for(_LISTENING, deadline).group(1))
        except BaseException:
            self.stop()
            raise

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def _wait_for(self, pattern: re.Pattern[str], deadline: Deadline) -> re.Match[str]:
        while True:
            try:
                line = self._lines.get(timeout=min(1.0, deadline.remaining("the coordinator")))
            except queue.Empty:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"the coordinator exited with status {self.process.returncode}: "
                        + " | ".join(self.seen[-5:])
                    ) from None
                continue
            self.seen.append(line)
            if found := pattern.search(line):
                return found

    def peak_rss_mb(self) -> float:
        """The process's peak resident set size so far (VmHWM), in MiB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        found = re.search(r"^VmHWM:\s+(\d+)\s+kB$", status, re.MULTILINE)
        if found is None:
            raise RuntimeError(f"/proc/{self.process.pid}/status has no VmHWM line.")
        return int(found.group(1)) / 1024

    def finish(self, deadline: Deadline) -> None:
        """Wait for the coordinator to end its completed session; fail if it does not."""
        try:
            code = self.process.wait(timeout=deadline.remaining("the coordinator to exit"))
        except subprocess.TimeoutExpired:
            raise TimeoutError("the coordinator did not exit after its session ended.") from None
        if code != 0:
            raise RuntimeError(f"the coordinator exited with status {code}.")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._lines.close()


@contextlib.contextmanager
def coordinator_process(
    federation: Path, state: Path, deadline: Deadline
) -> Iterator[_Coordinator]:
    coordinator = _Coordinator(federation, state, deadline)
    try:
        yield coordinator
    finally:
        coordinator.stop()
