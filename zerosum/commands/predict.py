"""`zerosum predict`: apply a saved brain-age model to a table of new subjects."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from node.deltab.io import (
    DeltabInputError,
    check_output_path,
    no_age_column,
    read_table,
    write_table,
)
from node.deltab.out_of_range import OUT_OF_RANGE_CHOICES, fit_to_training_bounds
from node.deltab.persist import feature_names_of, training_bounds_of
from zerosum.commands._model_io import features_for_model, load_model_file
from zerosum.commands.deltab import MODEL_KINDS, fail, in_flag_terms, warnings_on_stderr

PROG = "zerosum predict"

DESCRIPTION = """\
Apply a saved brain-age model (from `zerosum deltab --save`, or the global
model of a federated session) to new subjects.

--data is a CSV or TSV table with a header: an 'age' column (the true ages —
brain-age delta is measured against them), optionally an 'id' column, and the
same feature columns the model was trained on. A model saved from a table with
a header knows its feature names: columns in another order are matched by name
(with a note), other columns are refused, naming them. The output table has
the columns id (when --data has one), age, brain_age and delta, where
delta = brain_age - age.

A federated model carries the public bounds its training values were clipped
to: it has seen no value outside them, and beyond them it extrapolates (one
feature ten times its usual size can move delta by decades). By default
(--out-of-range clip) such values are clipped to the bounds, as the fit did,
and a note says how many subjects and which features were affected;
--out-of-range refuse stops instead (exit 2), naming them.
"""

EPILOG = """\
examples:
  zerosum predict --model model.json --data new_subjects.csv --output brain_age.csv
  zerosum predict --model global.json --data clinic.tsv --output out.tsv \\
      --model-kind unbiased

exit status: 0 on success, 2 on bad input or, with --out-of-range refuse, values
outside the training bounds (with one sentence saying why).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("--model", required=True, metavar="FILE", help="saved model (JSON)")
    parser.add_argument(
        "--data",
        required=True,
        metavar="FILE",
        help="subjects to predict: a table with a header, an 'age' column and the features",
    )
    parser.add_argument(
        "--output",
        required=True,
        metavar="FILE",
        help="where to write id, age, brain_age, delta (tab-separated for .tsv, else commas)",
    )
    parser.add_argument(
        "--model-kind",
        choices=MODEL_KINDS,
        default=None,
        help="which of the Smith et al. (2019) models predicts (default: the kind the model "
        "was saved with)",
    )
    parser.add_argument(
        "--out-of-range",
        choices=OUT_OF_RANGE_CHOICES,
        default="clip",
        help="features outside the model's training bounds: clip them to the bounds, with a "
        "note (default), or refuse the table",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace --output if it already exists"
    )


def run(args: argparse.Namespace) -> int:
    try:
        with warnings_on_stderr(PROG):
            return _run(args)
    except ValueError as exc:
        # DeltabError (input tables, the model file, out-of-range features) is a
        # ValueError, and so are the estimator's own argument checks (node.deltab's
        # contract); each carries a full sentence.
        return fail(PROG, in_flag_terms(str(exc)))
    except OSError as exc:
        return fail(PROG, f"cannot use {exc.filename or 'a file'}: {exc.strerror or exc}.")


def _run(args: argparse.Namespace) -> int:
    output = check_output_path(args.output, overwrite=args.overwrite)
    model = load_model_file(args.model)
    if args.model_kind is not None:
        model.set_params(model=args.model_kind)
    table = read_table(args.data)
    if table.age is None:
        raise DeltabInputError(
            no_age_column(
                table,
                "brain-age delta is measured against the true age, so --data needs a header "
                "with an 'age' column.",
            )
        )
    features = features_for_model(
        PROG, model, table.path, table.feature_names, table.features, named=table.has_header
    )
    missing = np.flatnonzero(np.isnan(table.age))
    if missing.size:
        raise DeltabInputError(
            f"{table.path}: line {table.lines[int(missing[0])]}: the age is missing; every "
            "subject to predict needs a true age."
        )
    names = feature_names_of(model) or table.feature_names
    features, outside = fit_to_training_bounds(
        features,
        training_bounds_of(model),
        names,
        policy=args.out_of_range,
        source=str(table.path),
    )
    if outside.any:
        print(
            f"{PROG}: note: "
            + outside.sentence(
                str(table.path),
                "they were clipped to the bounds before predicting, as the fit did "
                "(--out-of-range refuse stops instead).",
            ),
            file=sys.stderr,
        )
    delta = np.asarray(model.predict_delta(features, table.age), dtype=np.float64)
    columns: list[tuple[str, tuple[str, ...] | np.ndarray]] = []
    if table.ids is not None:
        columns.append(("id", table.ids))
    columns += [("age", table.age), ("brain_age", table.age + delta), ("delta", delta)]
    write_table(Path(output), columns)
    print(
        f"{PROG}: wrote brain_age and delta ({model.model} model) of {table.n_subjects} "
        f"subjects of {table.path} to {output}"
    )
    return 0
