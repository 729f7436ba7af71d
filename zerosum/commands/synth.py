"""`zerosum synth`: write a synthetic brain-age cohort with a known ground truth."""

from __future__ import annotations

import argparse

import numpy as np

from node.deltab.io import check_output_path, write_values
from node.deltab.synthetic import SiteEffect, make_cohort, write_cohort_csv
from zerosum.commands.deltab import fail
from zerosum.errors import UsageError

PROG = "zerosum synth"

DESCRIPTION = """\
Write a synthetic cohort in the spirit of Simulation 1 of Smith et al. (2019,
NeuroImage 200:528-539): true ages from a uniform or skewed distribution, true
brain-age deltas ~ N(0, sd^2), a few latent ageing components (linear and
quadratic in brain age) and age-free components mixed into the features, plus
measurement noise and, optionally, a scanner (site) effect per feature.

Two seeds, because a cohort is a sample from a population:

  --population-seed  the population: how brain age shows in the features (ageing
                     curves, mixing, feature units). Cohorts that share it are
                     sites of one world, so a model trained on some predicts the
                     others. Default 0, so every cohort made without it shares
                     one population (for a given --features).
  --seed             the sample: which subjects (ages, deltas, noise) and, with
                     --site-offset-sd/--site-scale-sd, the site's scanner effect.
                     Vary it to make several sites or a test set.

The output has the columns id, age, f0001, f0002, ...; ids are seed<S>-000001,
... so cohorts of different seeds can be concatenated. The same two seeds
always give the same file. (Before --population-seed existed, --seed S drew
both; --population-seed S --seed S gives those numbers again.)
"""

EPILOG = """\
examples:
  # a training cohort and a test cohort from the same population (default 0)
  zerosum synth --subjects 500 --features 100 --seed 1 --output train.csv
  zerosum synth --subjects 200 --features 100 --seed 2 --age-range 60 85 --age-skew 1 \\
      --site-offset-sd 0.5 --output test.tsv --true-delta-output test_delta.txt
  zerosum deltab --train-features train.csv --feature-num 20 --save model.json
  zerosum predict --model model.json --data test.tsv --output test_pred.tsv

  # a different world: a model trained on train.csv does not transfer to it
  zerosum synth --subjects 200 --features 100 --population-seed 7 --output other.csv
"""


def _age_range(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an age in years; got {text!r}") from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1; got {value}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number; got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative; got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("--subjects", type=_count, required=True, metavar="N")
    parser.add_argument("--features", type=_count, required=True, metavar="P")
    parser.add_argument(
        "--seed",
        type=_seed,
        default=0,
        help="the sample: which subjects (and which scanner effect); vary it per site or test "
        "set. Any non-negative integer, used whole (default 0)",
    )
    parser.add_argument(
        "--population-seed",
        type=_seed,
        default=0,
        metavar="SEED",
        help="the population the subjects come from: keep it the same (default 0) for cohorts "
        "one model should fit, change it for an unrelated world",
    )
    parser.add_argument(
        "--output", required=True, metavar="FILE", help="cohort table (.tsv: tab-separated)"
    )
    parser.add_argument(
        "--age-range",
        nargs=2,
        type=_age_range,
        default=(45.0, 80.0),
        metavar=("LOW", "HIGH"),
        help="true ages lie in [LOW, HIGH] (default 45 80)",
    )
    parser.add_argument(
        "--age-skew",
        type=float,
        default=0.0,
        help="0 for uniform ages; > 0 more young subjects, < 0 more old ones (default 0)",
    )
    parser.add_argument(
        "--delta-sd", type=float, default=2.0, help="sd of the true delta in years (default 2)"
    )
    parser.add_argument(
        "--site-offset-sd",
        type=float,
        default=0.0,
        help="sd of the scanner's per-feature offset, in feature sds (default 0: no site effect)",
    )
    parser.add_argument(
        "--site-scale-sd",
        type=float,
        default=0.0,
        help="sd of the log of the scanner's per-feature scale (default 0)",
    )
    parser.add_argument(
        "--missing-fraction",
        type=float,
        default=0.0,
        help="share of feature cells left empty, to exercise --feature-nans (default 0)",
    )
    parser.add_argument("--no-id", action="store_true", help="leave out the id column")
    parser.add_argument(
        "--true-delta-output", metavar="FILE", help="also write the true deltas, one per line"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace output files that already exist"
    )


def _check(args: argparse.Namespace) -> None:
    low, high = args.age_range
    if not low < high:
        raise UsageError(f"--age-range needs LOW < HIGH; got {low:g} {high:g}.")
    for flag, value in (
        ("--delta-sd", args.delta_sd),
        ("--site-offset-sd", args.site_offset_sd),
        ("--site-scale-sd", args.site_scale_sd),
    ):
        if not value >= 0:
            raise UsageError(f"{flag} must be non-negative; got {value:g}.")
    if not 0 <= args.missing_fraction < 1:
        raise UsageError(f"--missing-fraction must be in [0, 1); got {args.missing_fraction:g}.")


def run(args: argparse.Namespace) -> int:
    try:
        _check(args)
        output = check_output_path(args.output, overwrite=args.overwrite)
        delta_output = (
            check_output_path(args.true_delta_output, overwrite=args.overwrite)
            if args.true_delta_output
            else None
        )
        site = None
        if args.site_offset_sd or args.site_scale_sd:
            # Child 2 of the sample seed: make_cohort uses child 1 for the subjects
            # (and child 0 of a seed for a population), so the site effect stays
            # independent of both.
            site = SiteEffect.draw(
                "site",
                args.features,
                np.random.SeedSequence(args.seed, spawn_key=(2,)),
                offset_sd=args.site_offset_sd,
                scale_sd=args.site_scale_sd,
            )
        cohort = make_cohort(
            args.subjects,
            args.features,
            seed=args.seed,
            population_seed=args.population_seed,
            site=site,
            age_range=tuple(args.age_range),
            age_skew=args.age_skew,
            delta_sd=args.delta_sd,
            missing_fraction=args.missing_fraction,
            name=f"seed{args.seed}",
        )
        write_cohort_csv(cohort, output, include_id=not args.no_id)
        if delta_output is not None:
            write_values(delta_output, cohort.true_delta)
    except ValueError as exc:
        # UsageError and the generator's own argument checks (node.deltab's contract:
        # a bad argument is a ValueError naming it and its value).
        return fail(PROG, str(exc))
    except OSError as exc:
        return fail(PROG, f"cannot write {exc.filename or args.output}: {exc.strerror or exc}.")
    return 0
