"""Plans found by name, pinned by version and code digest; a node with other code refuses."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from pathlib import Path

import pytest

from node.plans import registry
from node.plans.interface import code_digest, package_modules
from node.plans.registry import PlanMismatch, installed_plans, plan_for
from proto.federation import dump_federation, load_federation
from zerosum.cli import main
from zerosum.commands import federation as command


def _init(out: Path, *extra: str) -> Path:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    argv = ["init", "--nodes", "a,b,c", "--out", str(out), "--synthetic", "--seed", "4"]
    assert command.run(parser.parse_args([*argv, "--holdout-size", "40", *extra])) == 0
    return out / "federation.toml"


def test_both_plans_are_announced_as_entry_points_and_built_in() -> None:
    from importlib.metadata import entry_points

    announced = {e.name for e in entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert {"deltab", "logreg"} <= announced
    plans = installed_plans()
    assert plans["deltab"].version == "3" and plans["logreg"].version == "1"
    assert len(plans["deltab"].digest()) == 64


def _modules_of_folder(folder: Path, package: str) -> set[str]:
    names = set()
    for path in folder.rglob("*.py"):
        parts = path.relative_to(folder).with_suffix("").parts
        names.add(".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return names


def test_the_brain_age_digest_covers_its_folder_and_the_library_computing_its_tensors() -> None:
    import node.deltab
    import node.plans.deltab

    plan_folder = Path(node.plans.deltab.__file__).parent
    library = Path(node.deltab.__file__).parent
    covered = set(installed_plans()["deltab"].modules)
    assert covered == _modules_of_folder(plan_folder, "node.plans.deltab") | _modules_of_folder(
        library, "node.deltab"
    )
    # The delta summary and its bundle are released too, so they are covered.
    assert {"node.plans.deltab.summary_bundle", "node.deltab.sums"} <= covered
    assert installed_plans()["logreg"].modules == ("node.plans.logreg",)


def test_package_modules_walks_a_folder_at_every_depth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "walked_plan"
    (root / "inner").mkdir(parents=True)
    for name in ("__init__.py", "rounds.py", "inner/__init__.py", "inner/model.py"):
        (root / name).write_text("")
    (root / "notes.txt").write_text("not code")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_modules("walked_plan") == (
        "walked_plan",
        "walked_plan.inner",
        "walked_plan.inner.model",
        "walked_plan.rounds",
    )
    with pytest.raises(ValueError, match=r"'walked_plan\.rounds' is not a package"):
        package_modules("walked_plan.rounds")
    sys.modules.pop("walked_plan", None)


def test_init_pins_the_installed_digest_and_the_node_checks_it(tmp_path: Path) -> None:
    config = load_federation(_init(tmp_path / "fed"))
    assert config.plan.digest == installed_plans()["deltab"].digest()
    assert plan_for(config).name == "deltab"


def test_a_node_whose_plan_code_differs_refuses_to_start_naming_both_digests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _init(tmp_path / "fed")
    config = load_federation(path)
    approved = "ab" * 32
    edited = dataclasses.replace(config, plan=dataclasses.replace(config.plan, digest=approved))
    path.write_text(dump_federation(edited))
    capsys.readouterr()
    code = main(["node", "--federation", str(path), "--node-id", "a"])
    err = capsys.readouterr().err
    assert code == 2
    installed = installed_plans()["deltab"].digest()
    assert approved in err and installed in err
    assert "plan.digest" in err and err.count("\n") == 1


def test_an_unknown_plan_or_version_is_refused(tmp_path: Path) -> None:
    config = load_federation(_init(tmp_path / "fed"))
    other = dataclasses.replace(config, plan=dataclasses.replace(config.plan, name="ridge"))
    with pytest.raises(PlanMismatch, match=r"no such plan is installed here \(installed: .*deltab"):
        plan_for(other)
    old = dataclasses.replace(config, plan=dataclasses.replace(config.plan, version="1"))
    with pytest.raises(PlanMismatch, match="has plan 'deltab' version '3' installed"):
        plan_for(old)


def test_an_unpinned_digest_is_accepted_with_a_warning(tmp_path: Path) -> None:
    config = load_federation(_init(tmp_path / "fed"))
    loose = dataclasses.replace(config, plan=dataclasses.replace(config.plan, digest=""))
    said: list[str] = []
    plan_for(loose, warn=said.append)
    assert said and "pins no digest" in said[0]


def test_the_digest_follows_the_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    module = tmp_path / "digest_probe_plan.py"
    module.write_text("X = 1\n")
    first = code_digest(["digest_probe_plan"])
    assert code_digest(["digest_probe_plan", "digest_probe_plan"]) == first
    module.write_text("X = 2\n")
    assert code_digest(["digest_probe_plan"]) != first
    with pytest.raises(ValueError, match="has no Python source"):
        code_digest(["no_such_module_anywhere"])


def test_a_third_party_plan_is_found_through_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An installed distribution as importlib.metadata sees one: a dist-info folder
    # with entry_points.txt beside the plan's module.
    (tmp_path / "tre_ridge_plan.py").write_text(
        textwrap.dedent(
            """
            from node.plans.deltab.plan import PLAN as _DELTAB
            from dataclasses import replace
            PLAN = replace(_DELTAB, name="ridge", version="0.1", modules=("tre_ridge_plan",))
            """
        )
    )
    info = tmp_path / "tre_ridge_plan-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tre-ridge-plan\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[zerosum.plans]\nridge = tre_ridge_plan:PLAN\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plans = installed_plans()
    assert plans["ridge"].version == "0.1"
    assert plans["ridge"].digest() == code_digest(["tre_ridge_plan"])
    sys.modules.pop("tre_ridge_plan", None)
