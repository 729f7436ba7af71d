"""docs/operating.md, run as written: three TREs, a coordinator and three checkers, two sessions.

Every command block of the recipe is marked for its party with an HTML
comment in the document (``<!-- recipe: PARTY ACTION [ARG] -->``):

* ``PARTY file NAME`` — the block is a file the party writes;
* ``PARTY run`` — run the block with ``bash -e``; it must exit 0;
* ``PARTY start`` — start the block in the background (a coordinator, a node);
* ``PARTY run-when PATH`` — wait until PATH exists, then run the block;
* ``copy A:PATH B:PATH`` — a file moved between machines by the TREs' own route;
* ``wait`` — every started process must end with exit status 0.

Each party has a folder of its own (its machine), and runs its commands in
the kit folder it unpacked there (``node-site-a/``, ...) once that exists.
A marker that names site-a is done for site-b and site-c too, with their ids.
The only change to the text is the address: the document's
``coordinator.example.org:50051`` (and the listen address) become a free
port on 127.0.0.1. The cohorts are the TREs' own data, which the recipe
does not write: small synthetic cohorts in real units, inside the public
bounds, are put at ``cohort.csv`` once a node's kit is unpacked.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.support.processes import free_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "operating.md"
SITES = ("site-a", "site-b", "site-c")
_MARKER = re.compile(r"<!-- recipe: (?P<spec>[^>]*?) -->\n(?:```[a-z]*\n(?P<body>.*?)```\n)?", re.S)
_BLOCK_ACTIONS = {"file", "run", "start", "run-when"}
TIMEOUT = 120.0

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Step:
    spec: list[str]
    body: str


def recipe_steps(text: str) -> list[list[Step]]:
    """The marked steps in document order; one naming site-a becomes one step per site."""
    groups: list[list[Step]] = []
    for match in _MARKER.finditer(text):
        spec, body = match["spec"].split(), match["body"] or ""
        needs_block = len(spec) > 1 and spec[1] in _BLOCK_ACTIONS
        assert needs_block == bool(body), f"marker {match['spec']!r}: block expected {needs_block}"
        if "site-a" in match["spec"]:
            groups.append(
                [
                    Step(
                        [part.replace("site-a", site) for part in spec],
                        body.replace("site-a", site),
                    )
                    for site in SITES
                ]
            )
        else:
            groups.append([Step(spec, body)])
    return groups


def _cohort(path: Path, seed: int) -> None:
    """A TRE's cohort in real units, the columns and order of the recipe's bounds.csv."""
    rng = np.random.default_rng(seed)
    n = 120
    age = rng.uniform(45.0, 85.0, n)
    brain = age + rng.normal(0.0, 3.0, n)
    left = 4800.0 - 18.0 * (brain - 45.0) + rng.normal(0.0, 150.0, n)
    right = left + rng.normal(30.0, 80.0, n)
    ventricles = 14000.0 + 1100.0 * (brain - 45.0) + rng.normal(0.0, 4000.0, n)
    thickness = 2.75 - 0.009 * (brain - 45.0) + rng.normal(0.0, 0.06, n)
    lines = [
        "id,age,lh_hippocampus_mm3,rh_hippocampus_mm3,lateral_ventricles_mm3,mean_thickness_mm"
    ]
    for i in range(n):
        lines.append(
            f"s{seed}-{i:04d},{age[i]:.2f},{left[i]:.1f},{right[i]:.1f},"
            f"{max(ventricles[i], 5100.0):.0f},{thickness[i]:.3f}"
        )
    path.write_text("\n".join(lines) + "\n")


class Recipe:
    """The parties' folders, their background processes, and the steps run in order."""

    def __init__(self, root: Path, address: str) -> None:
        self.root = root
        self.address = address
        self.started: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.lock = threading.Lock()
        self.env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "LC_ALL": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }

    def home(self, party: str) -> Path:
        home = self.root / party
        home.mkdir(exist_ok=True)
        return home

    def cwd(self, party: str) -> Path:
        home = self.home(party)
        kit = home / (f"node-{party}" if party in SITES else party)
        return kit if kit.is_dir() else home

    def _text(self, body: str) -> str:
        port = self.address.rsplit(":", 1)[1]
        body = body.replace("coordinator.example.org:50051", self.address)
        return body.replace("0.0.0.0:50051", f"127.0.0.1:{port}")

    def _run(self, party: str, body: str) -> None:
        done = subprocess.run(
            ["bash", "-e", "-c", self._text(body)],
            cwd=self.cwd(party),
            env={**self.env, "HOME": str(self.home(party))},
            capture_output=True,
            timeout=TIMEOUT,
            check=False,
        )
        printed = done.stdout.decode() + done.stderr.decode()
        assert done.returncode == 0, f"{party}: {body}\nexit {done.returncode}\n{printed}"
        with (self.home(party) / "commands.log").open("a") as log:
            log.write(f"$ {body}{printed}\n")

    def _start(self, party: str, body: str) -> None:
        log = self.home(party) / f"process-{time.monotonic_ns()}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                ["bash", "-e", "-c", self._text(body)],
                cwd=self.cwd(party),
                env={**self.env, "HOME": str(self.home(party))},
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        with self.lock:
            self.started.append((party, process, log))

    def _running_or_fail(self) -> None:
        with self.lock:
            started = list(self.started)
        for party, process, log in started:
            code = process.poll()
            if code is not None and code != 0:
                raise AssertionError(f"{party} exited {code}:\n{log.read_text()}")

    def _wait_for(self, path: Path) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not path.exists():
            self._running_or_fail()
            assert time.monotonic() < deadline, f"{path} did not appear within {TIMEOUT:.0f} s"
            time.sleep(0.1)

    def _wait_all(self) -> None:
        for party, process, log in self.started:
            try:
                code = process.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{party} still runs:\n{log.read_text()}") from None
            assert code == 0, f"{party} exited {code}:\n{log.read_text()}"
        self.started.clear()

    def _give_cohorts(self) -> None:
        with self.lock:
            for index, site in enumerate(SITES):
                kit = self.home(site) / f"node-{site}"
                if kit.is_dir() and not (kit / "cohort.csv").exists():
                    _cohort(kit / "cohort.csv", 100 + index)

    def steps(self, group: list[Step]) -> None:
        """One step at every site at once, as three machines would."""
        if len(group) == 1:
            self.step(group[0])
            return
        with ThreadPoolExecutor(len(group)) as pool:
            for done in [pool.submit(self.step, step) for step in group]:
                done.result()

    def step(self, step: Step) -> None:
        spec = step.spec
        if spec[0] == "copy":
            (source_party, source), (target_party, target) = (s.split(":", 1) for s in spec[1:])
            data = (self.cwd(source_party) / source).read_bytes()
            (self.cwd(target_party) / target).write_bytes(data)
        elif spec[0] == "wait":
            self._wait_all()
        elif spec[1] == "file":
            (self.cwd(spec[0]) / spec[2]).write_text(step.body)
        elif spec[1] == "run":
            self._run(spec[0], step.body)
        elif spec[1] == "start":
            self._start(spec[0], step.body)
        elif spec[1] == "run-when":
            self._wait_for(self.cwd(spec[0]) / spec[2])
            self._run(spec[0], step.body)
        else:  # pragma: no cover - a marker this test does not know
            raise AssertionError(f"unknown recipe step {spec}")
        self._give_cohorts()

    def stop(self) -> None:
        for _, process, _ in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@pytest.mark.slow  # two whole sessions through every command of the recipe (about 20 s)
def test_the_operating_recipe_runs_as_written_and_completes_two_sessions(tmp_path: Path) -> None:
    groups = recipe_steps(DOC.read_text(encoding="utf-8"))
    steps = [step for group in groups for step in group]
    parties = {s.spec[0] for s in steps if s.spec[0] not in ("copy", "wait")}
    assert parties == {"issuer", "coordinator", *SITES, *(f"checker-{s}" for s in SITES)}
    assert sum(s.spec[:2] == ["coordinator", "start"] for s in steps) == 2
    recipe = Recipe(tmp_path, f"127.0.0.1:{free_port()}")
    try:
        for group in groups:
            recipe.steps(group)
    finally:
        recipe.stop()
    # Every party held only its own kit: no node's or checker's machine holds the CA key.
    for party in ("coordinator", *SITES, *(f"checker-{s}" for s in SITES)):
        assert not list((tmp_path / party).rglob("ca.key")), party
    for site in SITES:
        node = tmp_path / site / f"node-{site}" / "nodes" / site
        for session in ("out-1", "out-2"):
            assert (node / session / "model.json").is_file(), (site, session)
            approval = node / session / "egress" / "round-0" / "approval.json"
            assert "A. Checker" in approval.read_text()
        assert not list((tmp_path / site).rglob("checker.pem")), site
        ledger = (tmp_path / site / "commands.log").read_text()
        assert "1.455" in ledger  # colluders:1 after two sessions, as the recipe says
    coordinator = tmp_path / "coordinator" / "coordinator" / "sessions"
    assert sorted(p.name for p in coordinator.glob("*.sqlite")) == ["1.sqlite", "2.sqlite"]
