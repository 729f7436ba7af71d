"""`zerosum deltab`: train a brain-age model and predict, with the public ``deltab`` flags.

The flags, their defaults and their meaning follow the public ``deltab`` command
(SPMIC-UoN/deltab, ``deltab/main.py``), so existing scripts keep working; the
differences in the numbers are documented in docs/deltab-comparison.md. This
module imports only numpy and the brain-age code — never grpc, scikit-learn or
pandas — so it starts fast and small inside a TRE.
"""

from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from node.deltab import MODELS
from node.deltab.io import (
    DeltabInputError,
    check_output_path,
    write_table,
    write_values,
)
from node.deltab.model import BrainAgeModel
from node.deltab.out_of_range import fit_to_training_bounds
from node.deltab.persist import feature_names_of, save_model, set_feature_names, training_bounds_of
from zerosum.commands._deltab_input import Subjects, load_subjects
from zerosum.commands._deltab_report import (
    check_interpolation,
    check_text_folder,
    describe_model,
    fit_naming_columns,
    write_model_text,
)
from zerosum.commands._model_io import features_for_model, load_model_file
from zerosum.errors import UsageError

PROG = "zerosum deltab"
MODEL_KINDS = MODELS  # the five models of Smith et al. 2019, listed once in node.deltab
DEFAULT_MODEL_KIND = "unbiased_quadratic"  # the public deltab default
# plan.model.kind when a federation config names none (node.plans.deltab.settings);
# both helps say the two defaults differ.
FEDERATION_MODEL_KIND = "unbiased"
DEFAULT_PREDICT_OUTPUT = "deltab.txt"  # the public deltab default
TABLE_SUFFIXES = {".csv", ".tsv", ".tab"}

DESCRIPTION = """\
Train a brain-age model on true ages and imaging features (IDPs) and predict
brain age or brain-age delta, with the models of Smith et al. (2019,
NeuroImage 200:528-539):

  simple               age regressed on features; delta is biased towards the mean age
  unbiased             removes the linear age dependence left in the simple delta
  unbiased_quadratic   also removes a quadratic age dependence (default here, as in
                       the public deltab; a federation's plan.model.kind defaults to
                       unbiased: `zerosum federation init --model-kind`)
  alternate            features regressed on age; delta read off that model
  alternate_quadratic  the alternate model with a quadratic age term

Inputs are CSV, TSV or whitespace-separated text, with or without a header
line. A header may name an 'id' column (subject identifiers) and an 'age'
column (true ages, so --train-ages can be left out); every other column is a
feature. Cells that are empty, NA or nan are missing values (see
--feature-nans).

The flags are those of the public deltab command, so its command lines carry
over; models are saved as JSON, not pickle (--save-text also writes them as
plain text). A successful run prints what it trained or loaded, on how many
subjects and features, and where each output went; warnings and notes go to
stderr. A model that can only reproduce its training ages (as many principal
components as subjects minus one, e.g. 5 subjects and 20 features) is
degenerate: its training deltas are 0 up to rounding, and a warning says so.
"""

EPILOG = """\
examples:
  # train on ages + features, write the unbiased quadratic delta of the same subjects
  zerosum deltab --train-ages ages.txt --train-features idps.tsv \\
      --feature-proportion 0.2 --predict-output delta.txt

  # one CSV with 'id' and 'age' columns; keep 20 components, save the model,
  # and write brain ages as a CSV (id, age, brain_age)
  zerosum deltab --train-features cohort.csv --feature-num 20 --save model.json \\
      --predict age --predict-output brain_age.csv

  # apply a saved model to new subjects
  zerosum deltab --load model.json --predict-features new.csv --predict-model unbiased \\
      --predict-output new_delta.csv

  # also keep the model as text to read (summary.txt and one file per array)
  zerosum deltab --train-features cohort.csv --feature-num 20 --save model.json \\
      --save-text model-text

outputs:
  --predict-output ending in .csv or .tsv gets a header and the columns id (when
  known), age and brain_age or delta; any other name gets one number per line,
  as the public deltab writes. Existing files are kept unless --overwrite.
  --save-text FOLDER writes summary.txt (the model in words: training size,
  components, variance explained, and the formulas that turn the numbers into a
  delta) and one .txt file of numbers per fitted array (feature_mean.txt,
  components.txt, b1.txt, ...), plus feature_names.txt when the training table
  had a header. It is for reading and for other programs; zerosum loads only the
  JSON of --save. The training data are not written.
  A model saved from a table with a header keeps its feature names: predicting
  from a table whose columns are the same in another order reorders them (with
  a note); a table with other columns is refused, naming them.

exit status: 0 on success, 2 on bad input (with one sentence saying why).
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1; got {value}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1]; got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1]; got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    train = parser.add_argument_group("training")
    train.add_argument(
        "--train-ages",
        metavar="FILE",
        help="true ages of the training subjects: one column, or a table with an 'age' column "
        "(not needed when --train-features has an 'age' column)",
    )
    train.add_argument(
        "--train-features",
        metavar="FILE",
        help="training features, one subject per line and one feature per column",
    )
    train.add_argument(
        "--feature-nans",
        choices=["median", "remove", "drop"],
        default="median",
        help="missing feature values: 'median' replaces each with the training median of its "
        "feature; 'remove' (or 'drop') leaves out every subject with a missing value "
        "(default median)",
    )
    reduce = parser.add_argument_group(
        "PCA reduction (at most one; default: keep every component the data support)"
    ).add_mutually_exclusive_group()
    reduce.add_argument(
        "--feature-proportion",
        type=_fraction,
        metavar="FRACTION",
        help="keep this proportion of the number of features as principal components "
        "(Smith et al. suggest 0.1-0.25)",
    )
    reduce.add_argument(
        "--feature-num", type=_positive_int, metavar="K", help="keep K principal components"
    )
    reduce.add_argument(
        "--feature-var",
        type=_fraction,
        metavar="FRACTION",
        help="keep the fewest components that explain at least this proportion of the variance",
    )
    reduce.add_argument(
        "--kaiser-guttmann",
        "--kaiser-guttman",
        dest="kaiser_guttmann",
        action="store_true",
        help="keep the components with an above-average eigenvalue, i.e. above 1 for the "
        "correlation matrix (Kaiser-Guttman criterion)",
    )
    model = parser.add_argument_group("saved models")
    model.add_argument("--save", metavar="FILE", help="save the trained model (JSON)")
    model.add_argument(
        "--save-text",
        metavar="FOLDER",
        help="also write the trained model as text into FOLDER: summary.txt (readable) and one "
        "file of numbers per array (see outputs below); not loadable, use --save for that",
    )
    model.add_argument("--load", metavar="FILE", help="load a saved model instead of training one")
    predict = parser.add_argument_group("prediction")
    predict.add_argument(
        "--predict",
        choices=["delta", "age"],
        default=None,
        help="write the brain-age delta (brain age minus true age) or the brain age "
        "(default delta)",
    )
    predict.add_argument(
        "--predict-model",
        choices=MODEL_KINDS,
        default=None,
        help=f"which model predicts (default {DEFAULT_MODEL_KIND}, as in the public deltab, or "
        "the kind a loaded model was saved with; a federation's model kind defaults to "
        f"{FEDERATION_MODEL_KIND}, see zerosum federation init --model-kind)",
    )
    predict.add_argument(
        "--predict-ages",
        metavar="FILE",
        help="true ages of the subjects to predict (not needed when --predict-features has an "
        "'age' column)",
    )
    predict.add_argument(
        "--predict-features",
        metavar="FILE",
        help="features of the subjects to predict (default: the training subjects)",
    )
    predict.add_argument(
        "--predict-output",
        metavar="FILE",
        help=f"where to write the prediction (default {DEFAULT_PREDICT_OUTPUT}; .csv/.tsv gets "
        "columns, anything else one number per line)",
    )
    predict.add_argument(
        "--true-ages-output",
        metavar="FILE",
        help="also write the true ages of the predicted subjects, one per line (useful with "
        "--feature-nans remove)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace output files that already exist"
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="more output on stderr: how each file was read, the fitted model's details, and "
        "a traceback with any error",
    )


def fail(prog: str, message: str) -> int:
    """Print ``<prog>: error: <message>`` on stderr and return exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def _note(prog: str, message: str) -> None:
    print(f"{prog}: note: {message}", file=sys.stderr)


def _debug(args: argparse.Namespace, message: str) -> None:
    if getattr(args, "debug", False):
        print(f"{PROG}: debug: {message}", file=sys.stderr)


def _say(message: str) -> None:
    print(f"{PROG}: {message}")


@contextmanager
def warnings_on_stderr(prog: str) -> Iterator[None]:
    """Show the estimator's warnings as ``<prog>: warning: ...`` lines, not Python banners."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            seen: set[str] = set()
            for item in caught:
                text = str(item.message)
                if text not in seen:
                    seen.add(text)
                    print(f"{prog}: warning: {text}", file=sys.stderr)


def _check_flags(args: argparse.Namespace) -> None:
    if args.load and (args.train_features or args.train_ages):
        raise UsageError("give either --load or --train-features, not both.")
    if args.load and (
        args.feature_proportion or args.feature_num or args.feature_var or args.kaiser_guttmann
    ):
        raise UsageError(
            "the PCA reduction flags apply to training; a loaded model keeps its own reduction."
        )
    if not args.load and not args.train_features:
        if args.train_ages:
            raise UsageError("--train-ages needs --train-features.")
        raise UsageError(
            "nothing to do: give --train-features (and --train-ages) to train a model, "
            "or --load a saved one."
        )
    if args.predict_ages and not args.predict_features:
        raise UsageError("--predict-ages needs --predict-features.")
    if args.load and not args.predict_features and _wants_prediction(args):
        raise UsageError(
            "a loaded model needs --predict-features (and --predict-ages, unless that file has "
            "an 'age' column) to predict."
        )


def _wants_prediction(args: argparse.Namespace) -> bool:
    """Predict unless the run only saves a model (the public tool always predicts)."""
    asked = (
        args.predict is not None
        or args.predict_output is not None
        or args.predict_features is not None
        or args.predict_model is not None
        or args.true_ages_output is not None
    )
    return asked or not args.save


def _check_components(args: argparse.Namespace, subjects: Subjects) -> None:
    """A fixed component count needs one subject per component plus one for the mean."""
    n, p = subjects.features.shape
    k = args.feature_num
    if k is not None and k > min(n - 1, p):
        if n - 1 < p:
            limit = (
                f"{n} subjects, which allow at most {n - 1} (one subject per component plus one "
                "for the mean)"
            )
        else:
            limit = f"{p} features"
        raise DeltabInputError(
            f"--feature-num {k} asks for {k} principal components, but {subjects.source} has "
            f"only {limit}."
        )


# The estimator names its parameters; on the command line the user knows the flags.
_FLAG_NAMES = (
    ("n_components=", "--feature-num "),
    ("feature_proportion=", "--feature-proportion "),
    ("variance_explained=", "--feature-var "),
    ("kaiser_guttman=True", "--kaiser-guttmann"),
    ("nan_policy='drop'", "--feature-nans remove"),
)


def in_flag_terms(message: str) -> str:
    """Rewrite the estimator's parameter names in a message as this command's flags."""
    for name, flag in _FLAG_NAMES:
        message = message.replace(name, flag)
    return message


def write_prediction(
    path: Path, subjects: Subjects, values: NDArray[np.float64], what: str
) -> None:
    """A table (id, age, brain_age|delta) for .csv/.tsv names, else one number per line."""
    if path.suffix.lower() in TABLE_SUFFIXES:
        columns: list[tuple[str, tuple[str, ...] | NDArray[np.float64]]] = []
        if subjects.ids is not None:
            columns.append(("id", subjects.ids))
        columns.append(("age", subjects.age))
        columns.append(("brain_age" if what == "age" else "delta", values))
        write_table(path, columns)
    else:
        write_values(path, values)


def run(args: argparse.Namespace) -> int:
    try:
        with warnings_on_stderr(PROG):
            return _run(args)
    except ValueError as exc:
        # DeltabError (the library's refusals: input tables, model files, ranges) and
        # UsageError are ValueErrors, and so are the estimator's own argument checks
        # (node.deltab's contract); each carries a full sentence.
        if args.debug:
            traceback.print_exc()
        return fail(PROG, in_flag_terms(str(exc)))
    except OSError as exc:
        if args.debug:
            traceback.print_exc()
        return fail(PROG, f"cannot use {exc.filename or 'a file'}: {exc.strerror or exc}.")


def _training_size(subjects: Subjects) -> str:
    n, p = subjects.features.shape
    return f"{n} subjects x {p} features of {subjects.source}"


def _run(args: argparse.Namespace) -> int:
    _check_flags(args)
    predicting = _wants_prediction(args)
    output = Path(args.predict_output or DEFAULT_PREDICT_OUTPUT) if predicting else None
    for target in (output, args.true_ages_output if predicting else None, args.save):
        if target is not None:
            check_output_path(target, overwrite=args.overwrite)
    text_folder = (
        check_text_folder(args.save_text, overwrite=args.overwrite) if args.save_text else None
    )

    def debug(message: str) -> None:
        _debug(args, message)

    training: Subjects | None = None
    if args.load:
        model, trained_on = _loaded(args)
    else:
        training = load_subjects(
            PROG,
            args.train_features,
            args.train_ages,
            "--train-ages",
            args.feature_nans,
            debug=debug,
        )
        model = _trained(args, training)
        trained_on = _training_size(training)
        _say(f"trained the {model.model} model on {trained_on}: {describe_model(model)}")
    debug(
        f"model: age mean {model.age_mean_:.6g}, age scale {model.age_scale_:.6g}; variance "
        "explained per component "
        + ", ".join(f"{v:.3g}" for v in model.explained_variance_ratio_[:10])
        + (" ..." if model.n_components_ > 10 else "")
    )
    _save(args, model, text_folder, trained_on)
    if output is None:
        return 0
    if args.predict_features:
        subjects = load_subjects(
            PROG,
            args.predict_features,
            args.predict_ages,
            "--predict-ages",
            args.feature_nans,
            debug=debug,
        )
        features = _features_within_bounds(model, subjects)
    elif training is not None:
        subjects = training
        features = training.features
    else:  # pragma: no cover - ruled out by _check_flags
        raise UsageError("a loaded model needs --predict-features to predict.")
    _predict(args, model, subjects, features, output)
    return 0


def _loaded(args: argparse.Namespace) -> tuple[BrainAgeModel, str]:
    """The model of --load (with --predict-model's kind, if given) and what it was trained on."""
    model = load_model_file(args.load)
    if args.predict_model is not None:
        model.set_params(model=args.predict_model)
    trained_on = f"{int(model.n_subjects_)} subjects x {model.n_features_in_} features"
    _say(
        f"loaded {args.load}: {model.model} model trained on {trained_on}; {describe_model(model)}"
    )
    return model, trained_on


def _trained(args: argparse.Namespace, training: Subjects) -> BrainAgeModel:
    """A model of the options' kind and components, fitted on ``training``."""
    _check_components(args, training)
    model = BrainAgeModel(
        args.predict_model or DEFAULT_MODEL_KIND,
        n_components=args.feature_num,
        feature_proportion=args.feature_proportion,
        variance_explained=args.feature_var,
        kaiser_guttman=bool(args.kaiser_guttmann),
        nan_policy="median" if args.feature_nans == "median" else "drop",
    )
    fit_naming_columns(
        model,
        training.features,
        training.age,
        feature_names=training.feature_names,
        source=training.source,
    )
    if training.named:
        set_feature_names(model, training.feature_names)
    check_interpolation(model, training.features, training.age, training.source)
    return model


def _save(
    args: argparse.Namespace, model: BrainAgeModel, text_folder: Path | None, trained_on: str
) -> None:
    """--save and --save-text."""
    if args.save:
        save_model(model, args.save)
        _say(f"saved the model to {args.save}")
    if text_folder is not None:
        written = write_model_text(
            model, text_folder, feature_names=feature_names_of(model), trained_on=trained_on
        )
        _say(
            f"saved the model as text to {text_folder}/ (summary.txt and {len(written) - 1} files)"
        )


def _features_within_bounds(model: BrainAgeModel, subjects: Subjects) -> NDArray[np.float64]:
    """``subjects``' features in the model's column order, clipped to its training bounds."""
    features = features_for_model(
        PROG,
        model,
        subjects.source,
        subjects.feature_names,
        subjects.features,
        named=subjects.named,
    )
    # A federated model carries its training bounds: predict within them, as zerosum
    # predict does (node.deltab.out_of_range), and say what was clipped.
    features, outside = fit_to_training_bounds(
        features, training_bounds_of(model), feature_names_of(model) or subjects.feature_names
    )
    if outside.any:
        _say(
            "note: "
            + outside.sentence(
                str(subjects.source), "they were clipped to the bounds before predicting."
            )
        )
    return features


def _predict(
    args: argparse.Namespace,
    model: BrainAgeModel,
    subjects: Subjects,
    features: NDArray[np.float64],
    output: Path,
) -> None:
    """Predict, write the prediction to ``output`` and, with --true-ages-output, the true ages."""
    what = args.predict or "delta"
    if what == "age":
        values = model.predict_age(features, subjects.age)
    else:
        values = model.predict_delta(features, subjects.age)
    write_prediction(output, subjects, np.asarray(values, dtype=np.float64), what)
    quantity = "brain age" if what == "age" else "delta"
    _say(
        f"wrote the {quantity} ({model.model} model) of {subjects.features.shape[0]} subjects "
        f"of {subjects.source} to {output}"
    )
    if args.true_ages_output:
        write_values(Path(args.true_ages_output), subjects.age)
        _say(f"wrote their true ages to {args.true_ages_output}")
