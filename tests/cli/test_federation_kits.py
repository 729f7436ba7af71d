"""`zerosum federation init` writes one kit per party: exactly its files, no one else's secret."""

from __future__ import annotations

import argparse
import contextlib
import io
import stat
from pathlib import Path

import pytest

from noise.keys import IdentityKey
from proto.federation import config_hash, load_federation
from zerosum import pki
from zerosum.commands import federation as command

NODES = ("north", "east", "south")
FAST = ["--n-features", "4", "--n-components", "2", "--cohort-sizes", "110,110,110"]
FAST += ["--holdout-size", "20", "--seed", "5", "--synthetic"]


def init(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.run(parser.parse_args(["init", *argv]))


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def _secrets(fed: Path) -> dict[str, bytes]:
    """Every private key init wrote, by the kit that alone may hold it ('' for none)."""
    found = {"": (fed / "ca" / "ca.key").read_bytes()}
    found["coordinator"] = (fed / "coordinator" / "server.key").read_bytes()
    for node in NODES:
        for name in ("identity.pem", "client.key"):
            found[f"node-{node}/{name}"] = (fed / "nodes" / node / name).read_bytes()
        checker = fed / "checkers" / node / "checker.pem"
        if checker.exists():
            found[f"checker-{node}"] = checker.read_bytes()
    return found


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("kits") / "fed"
    checker = IdentityKey.generate()
    pub = out.parent / "south-checker.pub"
    pub.write_bytes(pki.ed25519_public_pem(checker.public_bytes()))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = init(
            "--nodes", ",".join(NODES), "--out", str(out), "--checker-key", f"south={pub}", *FAST
        )
    assert status == 0
    return out, printed.getvalue()


def test_each_kit_holds_exactly_its_partys_files(fed: tuple[Path, str]) -> None:
    out, _ = fed
    kits = out / "kits"
    shared = {"federation.toml", "ca/ca.pem", "README.txt"}
    expected = {"coordinator": shared | {"coordinator/server.pem", "coordinator/server.key"}}
    for node in NODES:
        expected[f"node-{node}"] = shared | {
            f"nodes/{node}/{name}"
            for name in ("identity.pem", "client.pem", "client.key", "data.csv")
        }
        expected[f"checker-{node}"] = shared | {
            f"checkers/{node}/checker.pem",
            f"checkers/{node}/checker.pub",
        }
    # south's checker pinned their own key: their kit carries the config only.
    expected["checker-south"] = set(shared)
    assert {p.name for p in kits.iterdir()} == set(expected)
    for name, files in expected.items():
        assert _files(kits / name) == files, name
        for relative in files - {"README.txt"}:
            original = out / relative
            copy = kits / name / relative
            assert copy.read_bytes() == original.read_bytes(), (name, relative)
            assert stat.S_IMODE(copy.stat().st_mode) == stat.S_IMODE(original.stat().st_mode)
        config = load_federation(kits / name / "federation.toml")
        assert config_hash(config) == config_hash(load_federation(out / "federation.toml"))


def test_no_private_key_is_in_another_partys_kit(fed: tuple[Path, str]) -> None:
    out, _ = fed
    secrets = _secrets(out)
    for kit in (out / "kits").iterdir():
        for path in kit.rglob("*"):
            if not path.is_file():
                continue
            content = path.read_bytes()
            for owner, secret in secrets.items():
                if secret in content:
                    where = f"{kit.name}/{path.relative_to(kit).as_posix()}"
                    assert owner and where.startswith(owner.split("/")[0] + "/"), (
                        f"{where} holds the private key of {owner or 'the CA'}"
                    )
                    assert stat.S_IMODE(path.stat().st_mode) == 0o600, where
    assert (
        b"PRIVATE KEY"
        not in (out / "kits" / "checker-south").joinpath("federation.toml").read_bytes()
    )


def test_the_readme_of_each_kit_gives_its_partys_commands(fed: tuple[Path, str]) -> None:
    out, printed = fed
    kits = out / "kits"
    assert "kits/<party>/" in printed
    named = printed.split("kits/<party>/", 1)[1].splitlines()[0]
    for kit in kits.iterdir():
        assert kit.name in named
    coordinator = (kits / "coordinator" / "README.txt").read_text()
    assert "zerosum coordinator --federation federation.toml --state" in coordinator
    assert "new --state" in coordinator
    north = (kits / "node-north" / "README.txt").read_text()
    assert "zerosum node --federation federation.toml --node-id north" in north
    assert "--approve manual" in north and "nodes/north/identity.pem" in north
    checker = (kits / "checker-north" / "README.txt").read_text()
    assert "zerosum review BUNDLE --federation federation.toml --approve" in checker
    assert "--key checkers/north/checker.pem" in checker and "--import-decision" in checker
    south = (kits / "checker-south" / "README.txt").read_text()
    assert "--checker-key" in south and "checkers/south" not in south
