"""`zerosum demo` from a folder that holds a `zerosum/` (or `node/`, `noise/`) of its own.

``python -m`` puts the current directory first on ``sys.path``; the demo's
child processes must import the installed packages, not whatever folder of the
same name happens to sit where the user typed the command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import zerosum
from zerosum.commands.demo import child_argv, child_environment, spawn

pytestmark = pytest.mark.integration

DECOYS = ("zerosum", "node", "noise", "coordinator", "proto")


@pytest.fixture
def decoy_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A current directory whose packages of the project's names fail on import."""
    here = tmp_path / "work"
    for name in DECOYS:
        (here / name).mkdir(parents=True)
        (here / name / "__init__.py").write_text(
            f"raise ImportError('the decoy {name}/ in the current directory was imported')\n"
        )
    monkeypatch.chdir(here)
    return here


def test_the_decoys_would_be_imported_by_a_plain_python_m(decoy_cwd: Path) -> None:
    # What the demo used to run: the child fails on the decoy before doing anything.
    plain = subprocess.run(
        [sys.executable, "-m", "zerosum.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert plain.returncode != 0
    assert "the decoy zerosum/ in the current directory was imported" in plain.stderr


def test_a_spawned_child_imports_the_real_packages_and_keeps_the_cwd(decoy_cwd: Path) -> None:
    log = decoy_cwd / "logs" / "synth.log"
    child = spawn(["synth", "--subjects", "4", "--features", "3", "--output", "c.csv"], log)
    assert child.wait(timeout=60) == 0, log.read_text()
    # Relative paths still mean the user's folder.
    assert (decoy_cwd / "c.csv").read_text().startswith("id,age,f0001")
    assert child_argv("x")[:4] == [sys.executable, "-P", "-m", "zerosum.cli"]


def test_the_whole_demo_runs_beside_decoys(decoy_cwd: Path) -> None:
    # The parent is started with -P too (it would import the decoy otherwise);
    # its coordinator and node children are what is under test.
    finished = subprocess.run(
        [sys.executable, "-P", "-m", "zerosum.cli", "demo", "--nodes", "2", "--json",
         "--out", "demo-out"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr[-3000:]
    summary = json.loads(finished.stdout)
    assert summary["payload_sums_equal_audit_sums"] is True
    assert summary["max_relative_difference_vs_pooled"] <= 1e-9


def test_an_uninstalled_checkout_is_passed_on_to_the_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = Path(zerosum.__file__).resolve().parent.parent
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    # Found through the first sys.path entry (python -m from the checkout): passed on.
    monkeypatch.setattr(sys, "path", [str(root), *sys.path[1:]])
    assert child_environment()["PYTHONPATH"] == os.pathsep.join([str(root), "elsewhere"])
    # Found through an installation: the environment is left as it is.
    monkeypatch.setattr(sys, "path", ["/nonexistent-script-dir", *sys.path[1:]])
    env = child_environment()
    assert env["PYTHONPATH"] == "elsewhere" and env["PYTHONUNBUFFERED"] == "1"
