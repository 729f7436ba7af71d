"""The output checker's airlock, with the node and the checker as two different OS users.

The node's operator exports a bundle for review (``zerosum review --export``:
a copy others can read, the node's own folder staying 0600/0700), the checker
copies it into their own account, reviews it and signs it there with a key
that only their account can read, returns ``approval.json``, and the operator
imports it (``--import-decision``): verified against the node's bundle and
checker keys, then written into the node's folder, where the node's approval
gate accepts it. Every step is a real ``zerosum`` process run under the
party's own uid, so the operating system's permissions are the real ones.

Needs root (to create two throwaway users with ``useradd``); skipped, with
the reason, where that is impossible. The users are removed afterwards.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from node.egress.approval import ApprovalGate, read_approval, sign_approval
from node.egress.bundle import EgressBundle
from tests.support.bundles import make_bundle
from tests.support.made_up_federation import _checkers, _identities

REPO = Path(__file__).resolve().parents[2]
NODE_KEY = _identities(["a", "b", "c"])["a"]
CHECKER = _checkers(["a", "b", "c"])["a"]
OTHER_CHECKER = _checkers(["a", "b", "c"])["b"]
# Started under the party's uid: the project's packages from this installation.
BOOT = (
    "import site, sys; site.addsitedir(sys.argv[1]); sys.path.insert(0, sys.argv[2]); "
    "from zerosum.cli import main; sys.exit(main(sys.argv[3:]))"
)


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path


def _run_as(user: User, python: str, *argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-c", BOOT, sysconfig.get_paths()["purelib"], str(REPO), *map(str, argv)],
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        cwd=user.home,
        env={"PATH": "/usr/bin:/bin", "HOME": str(user.home), "LC_ALL": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _interpreter(user: User) -> str | None:
    """A Python of this version the user may run: this one, or the system's of the same version."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (sys.executable, shutil.which(version, path="/usr/bin:/bin")):
        if candidate is None:
            continue
        try:
            probe = _run_as(user, candidate, "--help")
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="module")
def space() -> Iterator[Path]:
    """A folder both users can reach (each keeps its own files private below it)."""
    root = Path(tempfile.mkdtemp(prefix="zerosum-airlock-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _make_user(role: str, space: Path) -> User:
    name = f"zs{role}{secrets.token_hex(3)}"
    home = space / name
    done = subprocess.run(
        [
            "useradd",
            "--no-create-home",
            "--home-dir",
            str(home),
            "--shell",
            "/usr/sbin/nologin",
            name,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot create a throwaway user with useradd: {done.stderr.strip()}")
    entry = pwd.getpwnam(name)
    home.mkdir(mode=0o700)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    return User(name, entry.pw_uid, entry.pw_gid, home)


@pytest.fixture(scope="module")
def users(space: Path) -> Iterator[tuple[User, User, str]]:
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("the airlock test runs the node and the checker as two OS users: needs root")
    made: list[User] = []
    try:
        made.append(_make_user("node", space))
        made.append(_make_user("chk", space))
        python = _interpreter(made[0])
        if python is None or _interpreter(made[1]) != python:
            pytest.skip("no Python of this version that a throwaway user may run")
        yield made[0], made[1], python
    finally:
        for user in made:
            subprocess.run(["userdel", user.name], capture_output=True, timeout=30, check=False)


def _own(path: Path, user: User) -> None:
    for item in [path, *path.rglob("*")]:
        os.chown(item, user.uid, user.gid)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _airlock(node: User, checker: User) -> tuple[Path, Path, Path, Path]:
    """The node's private bundle, the checker's kit, the exchange folder and the inbox."""
    # The node's side: its federation folder and bundle, private to its account.
    (node.home / "fed").mkdir()
    bundle = make_bundle(node.home / "fed")
    _own(node.home, node)
    assert _mode(bundle / "manifest.json") == 0o600
    checker_kit = checker.home / "kit"
    checker_kit.mkdir()
    shutil.copyfile(node.home / "fed" / "federation.toml", checker_kit / "federation.toml")
    CHECKER.write_pem(checker_kit / "checker.pem")
    exchange = checker.home.parent / "exchange"  # the airlock: the node writes, anyone reads
    exchange.mkdir(mode=0o755)
    _own(exchange, node)
    inbox = checker.home.parent / "inbox"  # the way back: the checker writes, anyone reads
    inbox.mkdir(mode=0o755)
    _own(checker_kit, checker)
    _own(inbox, checker)
    return bundle, checker_kit, exchange, inbox


def test_the_checker_signs_on_their_own_account_and_the_node_imports_the_decision(
    users: tuple[User, User, str],
) -> None:
    node, checker, python = users
    bundle, checker_kit, exchange, inbox = _airlock(node, checker)

    # The checker cannot read the node's folder at all.
    peek = _run_as(checker, python, "review", bundle)
    assert peek.returncode == 2, peek.stderr
    assert "not readable from this account" in peek.stderr and "--export" in peek.stderr

    # 1. The node's operator exports the bundle.
    exported = exchange / "round-1"
    done = _run_as(node, python, "review", bundle, "--export", exported)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "decision: none yet; bundle exported (exit 0)"
    assert _mode(exported / "manifest.json") == 0o644
    assert not (exported / "approval.json").exists()

    # 2. The checker takes a copy into their own account, reviews and signs it there.
    copy = checker.home / "round-1"
    taken = subprocess.run(
        ["cp", "-r", str(exported), str(copy)],
        user=checker.uid,
        group=checker.gid,
        extra_groups=[],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert taken.returncode == 0, taken.stderr
    kit_config = checker_kit / "federation.toml"
    looked = _run_as(checker, python, "review", copy, "--federation", kit_config)
    assert looked.returncode == 0, looked.stdout + looked.stderr
    assert looked.stdout.splitlines()[-1].strip() == "verdict: pass (exit 0)"
    key = checker_kit / "checker.pem"
    signed = _run_as(
        checker, python, "review", copy, "--federation", kit_config, "--approve",
        "--key", key, "--reviewer", "J. Smith", "--comment", "sums only",
    )  # fmt: skip
    assert signed.returncode == 0, signed.stderr
    lines = signed.stdout.splitlines()
    assert lines[-1] == "decision: approve written (exit 0)"
    assert f"approve signed by J. Smith → {copy}/approval.json" in signed.stdout
    assert "[ok  ]" not in signed.stdout  # the full report is the read-only review's
    assert (copy / "approval.json").stat().st_uid == checker.uid
    returned = inbox / "approval.json"
    shutil.copyfile(copy / "approval.json", returned)
    os.chown(returned, checker.uid, checker.gid)

    # 3. The node's operator imports the decision; the node's gate acts on it.
    imported = _run_as(node, python, "review", bundle, "--import-decision", returned)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.splitlines()[-1] == "decision: approve imported (exit 0)"
    written = bundle / "approval.json"
    assert written.stat().st_uid == node.uid and _mode(written) == 0o600
    found = read_approval(bundle)
    assert found is not None
    gate = ApprovalGate(
        "manual", identity=NODE_KEY, checker_keys={CHECKER.public_bytes(): "a's checker"}
    )
    assert gate.check(bundle, found).reviewer == "J. Smith"


def test_an_import_of_a_decision_by_another_key_is_refused_and_nothing_is_written(
    users: tuple[User, User, str],
) -> None:
    node, _, python = users
    (node.home / "fed2").mkdir()
    bundle = make_bundle(node.home / "fed2")
    forged = node.home / "forged.json"
    approval = sign_approval(
        OTHER_CHECKER, EgressBundle.manifest_sha256(bundle), "approve", reviewer="B"
    )

    forged.write_text(json.dumps(approval.to_json()))
    _own(node.home, node)
    done = _run_as(node, python, "review", bundle, "--import-decision", forged)
    assert done.returncode == 2
    assert done.stdout.splitlines()[-1] == "decision: none written (exit 2)"
    assert "is not a valid decision" in done.stderr and str(forged) in done.stderr
    assert not (bundle / "approval.json").exists()
