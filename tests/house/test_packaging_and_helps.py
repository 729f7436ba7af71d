"""Packaging metadata setuptools reads without a deprecation notice; helps that agree.

* ``license`` is an SPDX expression string (PEP 639), which setuptools
  accepts from version 77 on; the table form ``{ text = … }`` prints a
  deprecation banner on every install, ``make demo`` included.
* The packages sit at the top of the repository with ``package-dir`` ``""``
  → ``.``: an editable install is then a plain ``.pth`` entry, for which
  setuptools prints no "Editable installation" notice.
* ``zerosum deltab`` predicts with unbiased_quadratic by default (as the
  public deltab does), a federation's model defaults to unbiased: both helps
  say so.
"""

from __future__ import annotations

import argparse
import tomllib
import warnings
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from node.plans.deltab.settings import DeltabSettings
from zerosum.commands import deltab, federation

ROOT = Path(__file__).resolve().parents[2]


def test_the_license_is_an_spdx_string_and_setuptools_is_new_enough_for_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert not any("License ::" in c for c in project["project"].get("classifiers", []))
    setuptools = next(
        Requirement(r) for r in project["build-system"]["requires"] if r.startswith("setuptools")
    )
    assert Version("77") in setuptools.specifier
    assert Version("76.9") not in setuptools.specifier
    assert project["tool"]["setuptools"]["package-dir"] == {"": "."}


def test_setuptools_reads_the_project_table_without_a_warning() -> None:
    from setuptools.config.pyprojecttoml import read_configuration

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = read_configuration(ROOT / "pyproject.toml")
    assert config["project"]["license"] == "Apache-2.0"


def _help(add_arguments: object, description: str = "") -> str:
    parser = argparse.ArgumentParser(description=description)
    add_arguments(parser)  # type: ignore[operator]
    return " ".join(parser.format_help().split())


def test_both_helps_say_the_default_model_kinds_differ() -> None:
    assert deltab.DEFAULT_MODEL_KIND == "unbiased_quadratic"
    # What a federation config without plan.model.kind gets.
    settings = DeltabSettings.from_tables(
        {
            "model": {"n_features": 4, "n_components": 2},
            "clipping": {"age_low": 45.0, "age_high": 80.0, "feature_low": -4.0,
                         "feature_high": 4.0, "feature_names": ["f1", "f2", "f3", "f4"]},
        }
    )  # fmt: skip
    assert settings.kind == deltab.FEDERATION_MODEL_KIND == "unbiased"
    own = _help(deltab.add_arguments, deltab.DESCRIPTION)
    assert "default unbiased_quadratic, as in the public deltab" in own
    assert "a federation's model kind defaults to unbiased" in own
    init = _help(federation.add_init_arguments)
    assert "(default unbiased; zerosum deltab predicts with unbiased_quadratic by default" in init
