"""Reading subject tables (CSV, TSV, whitespace) and writing predictions.

A table has one subject per line and one measure per column. The delimiter is
sniffed from the first line (tab, then comma, else runs of whitespace — the
three layouts the public ``deltab`` tool accepts). The first line is a header
when it has a non-numeric cell above a numeric one (the rule of
``csv.Sniffer.has_header``, applied to the first two rows). Columns named
``id`` (or ``eid``, ``subject``, ``subject_id``, ``participant_id``) hold
subject identifiers and a column named ``age`` holds true ages; every other
column is a feature. Without a header, a first column that is not a number is
taken as the identifiers. Cells ``""``, ``NA``, ``N/A``, ``nan`` and ``null``
(any case) are missing values and become NaN. Subject ids must be unique.

Two layouts that spreadsheets write are refused with the reason rather than
misread: semicolon-separated "CSV" (the export of locales whose decimal mark
is a comma) and, where an ``age`` column is needed, a table without a header
row (:func:`no_age_column` says which of the two, or what else, is the cause).

The file is read twice, line by line: a first pass learns the layout and
checks every row's field count and id, a second parses the numbers a few
hundred subjects at a time straight into one (subjects, features) array, so
the text is never held whole. Numbers are parsed by ``numpy.loadtxt``'s C
reader; only a chunk where it objects (a missing-value token, a bad cell) is
parsed cell by cell, which is slower but can say exactly which line and
column is at fault. Every problem is
a :class:`DeltabInputError` whose message is one sentence naming the file, the
line and the column.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from bounded.files import GIB, LocalFileError, MissingFileError, open_limited
from node.deltab.cells import spreadsheet_safe
from node.deltab.exceptions import DeltabError

__all__ = [
    "ID_COLUMN_NAMES",
    "MISSING_TOKENS",
    "AgeColumn",
    "DeltabInputError",
    "Table",
    "check_output_path",
    "check_same_subjects",
    "no_age_column",
    "read_ages",
    "read_table",
    "select_features",
    "write_table",
    "write_values",
]

FloatArray = NDArray[np.float64]

# 50,000 subjects with 5,000 measures of ten characters each take 2.5 GB; a
# larger "table" (or /dev/zero behind a symlink) is refused before it is read.
MAX_TABLE_BYTES = 4 * GIB
# Subjects parsed at a time in the second pass (a few MB of text at 2,641 features).
_CHUNK_ROWS = 256

MISSING_TOKENS = frozenset({"", "na", "n/a", "nan", "null"})
ID_COLUMN_NAMES = frozenset({"id", "eid", "subject", "subject_id", "participant_id"})
AGE_COLUMN_NAME = "age"
ID_LABEL = "id"  # how an id column is named in messages, whatever its header says


class DeltabInputError(DeltabError):
    """An input file or output path the brain-age tools cannot use; the message says why."""


@dataclass(frozen=True, eq=False)
class Table:
    """A parsed subject table.

    ``features`` is subjects × features (NaN where a cell was missing);
    ``feature_names`` are the header names, or ``column 3`` style labels when
    there was no header; ``lines`` holds each subject's line number in the file.
    """

    path: Path
    has_header: bool
    delimiter: str | None
    feature_names: tuple[str, ...]
    features: FloatArray
    ids: tuple[str, ...] | None
    age: FloatArray | None
    lines: NDArray[np.int64]

    @property
    def n_subjects(self) -> int:
        return int(self.features.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.features.shape[1])


@dataclass(frozen=True, eq=False)
class AgeColumn:
    """True ages read from a file, with subject ids when the file had them."""

    path: Path
    values: FloatArray
    ids: tuple[str, ...] | None
    lines: NDArray[np.int64]

    @property
    def n_subjects(self) -> int:
        return int(self.values.shape[0])


@dataclass(frozen=True)
class _Layout:
    """What the first pass learnt: delimiter, header, column roles, data lines."""

    delimiter: str | None
    header_line: int  # physical line of the header, 0 when there is none
    names: tuple[str, ...]  # one per column: header names or "column j"
    id_index: int | None
    lines: list[int]  # physical line number of every data row
    ids: list[str] | None


def _is_numeric(cell: str) -> bool:
    text = cell.strip()
    if text.lower() in MISSING_TOKENS:
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def _sniff_delimiter(first_line: str) -> str | None:
    if "\t" in first_line:
        return "\t"
    if "," in first_line:
        return ","
    return None


def _reject_semicolons(path: Path, number: int, line: str, delimiter: str | None) -> None:
    """Refuse a semicolon-separated file, which would otherwise be misread as one column.

    Semicolons separate more fields than the sniffed delimiter does, or sit
    beside commas outside quotes (decimal commas, ``45,5;1,2``): neither
    happens in a comma-, tab- or whitespace-separated table of numbers.
    """
    if ";" not in line:
        return
    by_semicolon = len(line.split(";"))
    sniffed = len(_split(line, delimiter))
    if by_semicolon > sniffed or (delimiter == "," and '"' not in line):
        raise DeltabInputError(
            f"{path} looks semicolon-separated (line {number} has {by_semicolon} fields "
            "between semicolons); zerosum reads comma-separated CSV, tab-separated TSV or "
            "whitespace-separated text, with '.' as the decimal point: save it as one of those."
        )


def _split(line: str, delimiter: str | None) -> list[str]:
    if delimiter is None:
        return line.split()
    text = line.rstrip("\r\n")
    if '"' in text:
        return next(csv.reader([text], delimiter=delimiter))
    return text.split(delimiter)


def _field_count(line: str, delimiter: str | None) -> int:
    if delimiter is None:
        return len(line.split())
    if '"' in line:
        return len(_split(line, delimiter))
    return line.count(delimiter) + 1


def _text(path: Path) -> io.TextIOWrapper:
    """``path`` opened as text with :func:`bounded.files.open_limited` (regular, bounded)."""
    return io.TextIOWrapper(open_limited(path, MAX_TABLE_BYTES, what="table"), encoding="utf-8-sig")


def _open(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (line number, line) for every non-blank line; I/O problems become input errors."""
    if path.is_dir():
        raise DeltabInputError(f"cannot read {path}: it is a directory, not a file.")
    try:
        with _text(path) as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    yield number, line
    except MissingFileError:
        raise DeltabInputError(f"cannot read {path}: there is no such file.") from None
    except LocalFileError as exc:
        raise DeltabInputError(f"{exc}.") from None
    except FileNotFoundError:
        raise DeltabInputError(f"cannot read {path}: there is no such file.") from None
    except IsADirectoryError:
        raise DeltabInputError(f"cannot read {path}: it is a directory, not a file.") from None
    except PermissionError:
        raise DeltabInputError(f"cannot read {path}: permission denied.") from None
    except UnicodeDecodeError as exc:
        raise DeltabInputError(
            f"cannot read {path}: it is not UTF-8 text (bad byte at offset {exc.start})."
        ) from None
    except OSError as exc:
        raise DeltabInputError(f"cannot read {path}: {exc.strerror or exc}.") from None


def _column_label(layout: _Layout, index: int) -> str:
    if layout.header_line:
        return f"column {layout.names[index]!r}"
    return f"column {index + 1}"


def _has_header(first_cells: list[str], second_cells: list[str] | None) -> bool:
    """A header: a first line with text, or text above a number in the second line."""
    non_numeric = [not _is_numeric(c) for c in first_cells]
    if second_cells is None:
        return any(non_numeric)
    return any(
        bad and _is_numeric(below) for bad, below in zip(non_numeric, second_cells, strict=False)
    )


def _columns(
    path: Path, first_no: int, first_cells: list[str], *, has_header: bool
) -> tuple[tuple[str, ...], int | None]:
    """The column names (from the header, else "column j") and the id column, if any."""
    if not has_header:
        names = tuple(f"column {j + 1}" for j in range(len(first_cells)))
        # Without a header, identifiers can only be recognised by not being numbers.
        if first_cells and not _is_numeric(first_cells[0]):
            return names, 0
        return names, None
    id_index: int | None = None
    seen: dict[str, int] = {}
    for j, name in enumerate(first_cells):
        key = name.lower()
        if key in seen:
            raise DeltabInputError(
                f"{path}: line {first_no}: the column name {name!r} appears twice "
                f"(columns {seen[key] + 1} and {j + 1})."
            )
        seen[key] = j
        if id_index is None and key in ID_COLUMN_NAMES:
            id_index = j
    return tuple(first_cells), id_index


def _subject_id(line: str, delimiter: str | None, id_index: int) -> str:
    """The id cell of a data line (the first field is cut out without a full split)."""
    if id_index == 0 and delimiter is not None and '"' not in line:
        return line[: line.index(delimiter)].strip()
    return _split(line, delimiter)[id_index].strip()


def _scan(path: Path) -> _Layout:
    """First pass: delimiter, header, id column, and a field count for every row."""
    rows = _open(path)
    first = next(rows, None)
    if first is None:
        raise DeltabInputError(f"{path} is empty.")
    first_no, first_line = first
    delimiter = _sniff_delimiter(first_line)
    _reject_semicolons(path, first_no, first_line, delimiter)
    first_cells = [c.strip() for c in _split(first_line, delimiter)]
    second = next(rows, None)
    second_cells = [c.strip() for c in _split(second[1], delimiter)] if second else None

    has_header = _has_header(first_cells, second_cells)
    width = len(first_cells)
    names, id_index = _columns(path, first_no, first_cells, has_header=has_header)

    what = "the header has" if has_header else f"line {first_no} has"
    lines: list[int] = []
    ids: list[str] | None = [] if id_index is not None else None
    id_lines: dict[str, int] = {}
    pending = [] if has_header else [first]
    if second is not None:
        pending.append(second)

    def rows_with_pending() -> Iterator[tuple[int, str]]:
        yield from pending
        yield from rows

    for number, line in rows_with_pending():
        count = _field_count(line, delimiter)
        if count != width:
            fields = "field" if count == 1 else "fields"
            raise DeltabInputError(f"{path}: line {number} has {count} {fields}; {what} {width}.")
        lines.append(number)
        if ids is not None:
            assert id_index is not None
            subject = _subject_id(line, delimiter, id_index)
            earlier = id_lines.setdefault(subject, number)
            if earlier != number:
                # Two rows of one id would count one person twice and make the
                # rows of an ages file and a features file impossible to match.
                which = f"the subject id {subject!r} appears" if subject else "an empty id appears"
                raise DeltabInputError(
                    f"{path}: {which} twice (lines {earlier} and {number}); every subject needs "
                    "its own id."
                )
            ids.append(subject)
    if not lines:
        raise DeltabInputError(f"{path} has a header line but no subjects.")
    return _Layout(
        delimiter=delimiter,
        header_line=first_no if has_header else 0,
        names=names,
        id_index=id_index,
        lines=lines,
        ids=ids,
    )


def _parse_cell(path: Path, layout: _Layout, number: int, column: int, cell: str) -> float:
    text = cell.strip()
    if text.lower() in MISSING_TOKENS:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        raise DeltabInputError(
            f"{path}: line {number}, {_column_label(layout, column)}: {text!r} is not a number."
        ) from None
    return value


def _parse_slowly(
    path: Path, layout: _Layout, columns: Sequence[int], rows: Sequence[tuple[int, str]]
) -> FloatArray:
    """Cell-by-cell parse of ``rows``: understands missing-value tokens and names any bad cell."""
    out = np.empty((len(rows), len(columns)), dtype=np.float64)
    for i, (number, line) in enumerate(rows):
        cells = _split(line, layout.delimiter)
        out[i] = [_parse_cell(path, layout, number, j, cells[j]) for j in columns]
    return out


def _parse_rows(
    path: Path, layout: _Layout, columns: Sequence[int], rows: Sequence[tuple[int, str]]
) -> FloatArray:
    """The numbers of ``rows`` (line number, text): numpy's C reader, cell by cell if it objects."""
    try:
        values: FloatArray = np.loadtxt(
            [line for _, line in rows],
            dtype=np.float64,
            delimiter=layout.delimiter,
            usecols=None if layout.id_index is None else columns,
            comments=None,
            quotechar='"' if layout.delimiter is not None else None,
            ndmin=2,
        )
    except ValueError:
        # loadtxt's messages count rows from zero; the slow path finds the same
        # problem (or reads the missing-value tokens) in the file's own terms.
        return _parse_slowly(path, layout, columns, rows)
    if values.shape != (len(rows), len(columns)):
        return _parse_slowly(path, layout, columns, rows)
    return values


def _data_rows(path: Path, layout: _Layout) -> Iterator[list[tuple[int, str]]]:
    """The table's data lines (line number, text), ``_CHUNK_ROWS`` at a time."""
    chunk: list[tuple[int, str]] = []
    for number, line in _open(path):
        if number <= layout.header_line:
            continue
        chunk.append((number, line))
        if len(chunk) == _CHUNK_ROWS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _first_infinite(
    path: Path,
    layout: _Layout,
    columns: Sequence[int],
    values: FloatArray,
    rows: Sequence[tuple[int, str]],
) -> DeltabInputError | None:
    bad = np.argwhere(np.isinf(values))
    if not bad.size:
        return None
    row, col = (int(v) for v in bad[0])
    return DeltabInputError(
        f"{path}: line {rows[row][0]}, {_column_label(layout, columns[col])}: "
        f"'{float(values[row, col])}' is not a finite number."
    )


def _parse(
    path: Path, layout: _Layout, columns: Sequence[int], age_at: int | None
) -> tuple[FloatArray, FloatArray | None]:
    """Second pass: (features, ages) read ``_CHUNK_ROWS`` subjects at a time.

    ``columns`` are the non-id columns and ``age_at`` the position of the age
    among them. Each chunk is parsed on its own and copied into the two
    results, so the file is never held whole, nor a table with the age
    column that would then be copied without it; the features come out as
    one C-contiguous (subjects, features) array, the layout every later step
    reads without another copy.
    """
    n = len(layout.lines)
    kept = [k for k in range(len(columns)) if k != age_at]
    features = np.empty((n, len(kept)), dtype=np.float64)
    age = None if age_at is None else np.empty(n, dtype=np.float64)
    if not columns:
        return features, age
    done = 0
    # A cell that is not a number anywhere is reported before an infinite one.
    infinite: DeltabInputError | None = None
    for rows in _data_rows(path, layout):
        stop = done + len(rows)
        if stop > n or [number for number, _ in rows] != layout.lines[done:stop]:
            raise DeltabInputError(f"{path} changed while it was being read; read it again.")
        values = _parse_rows(path, layout, columns, rows)
        infinite = infinite or _first_infinite(path, layout, columns, values, rows)
        if age is not None:
            age[done:stop] = values[:, age_at]
            features[done:stop] = values[:, kept]
        else:
            features[done:stop] = values
        done = stop
    if done != n:
        raise DeltabInputError(f"{path} changed while it was being read; read it again.")
    if infinite is not None:
        raise infinite
    return features, age


def read_table(path: str | Path) -> Table:
    """Read a subject table (see the module docstring for the accepted layouts)."""
    source = Path(path)
    layout = _scan(source)
    columns = [j for j in range(len(layout.names)) if j != layout.id_index]
    age_at: int | None = None
    if layout.header_line:
        named = [k for k, j in enumerate(columns) if layout.names[j].lower() == AGE_COLUMN_NAME]
        age_at = named[0] if named else None
    features, age = _parse(source, layout, columns, age_at)
    feature_columns = [j for k, j in enumerate(columns) if k != age_at]
    return Table(
        path=source,
        has_header=bool(layout.header_line),
        delimiter=layout.delimiter,
        feature_names=tuple(layout.names[j] for j in feature_columns),
        features=features,
        ids=tuple(layout.ids) if layout.ids is not None else None,
        age=age,
        lines=np.asarray(layout.lines, dtype=np.int64),
    )


def read_ages(path: str | Path) -> AgeColumn:
    """Read true ages: an ``age`` column, a single column, or a single row of numbers."""
    table = read_table(path)
    if table.age is not None:
        values = table.age
        lines = table.lines
    elif table.n_features == 1:
        values = table.features[:, 0].copy()
        lines = table.lines
    elif table.n_subjects == 1 and not table.has_header:
        values = table.features[0].copy()
        lines = np.repeat(table.lines, values.shape[0])
        return AgeColumn(path=table.path, values=values, ids=None, lines=lines)
    else:
        raise DeltabInputError(
            f"{table.path} has {table.n_features} columns and none is named 'age'; "
            "an ages file needs a single column or a header with an 'age' column."
        )
    return AgeColumn(path=table.path, values=values, ids=table.ids, lines=lines)


def no_age_column(table: Table, remedy: str) -> str:
    """The sentence for a table that lacks an ``age`` column, with its likely cause.

    ``remedy`` completes the sentence (what the caller needs instead). The
    causes told apart: no header row at all, a header whose age column is
    named otherwise (``Age_at_scan``), or a header with no such column.
    """
    path = table.path
    if not table.has_header:
        first = int(table.lines[0]) if table.lines.size else 1
        return (
            f"{path} has no 'age' column: it has no header row (line {first} holds data, not "
            f"column names); {remedy}"
        )
    near = [n for n in table.feature_names if AGE_COLUMN_NAME in n.lower()]
    if near:
        shown = ", ".join(repr(n) for n in near[:3])
        return (
            f"{path} has no column named exactly 'age' (its header has {shown}); rename the "
            f"true ages' column to 'age', or {remedy}"
        )
    names = ([ID_LABEL] if table.ids is not None else []) + list(table.feature_names)
    shown = ", ".join(repr(n) for n in names[:4]) + (", ..." if len(names) > 4 else "")
    return f"{path} has no 'age' column (its header names {shown}); {remedy}"


def select_features(
    path: Path, columns: Sequence[str], features: FloatArray, names: Sequence[str]
) -> tuple[FloatArray, bool]:
    """``features`` (whose columns are named ``columns``) in the order of ``names``.

    Returns the reordered array and whether a reordering was needed. The
    columns must be exactly ``names`` (no more, no fewer); otherwise a
    :class:`DeltabInputError` names the first missing and the first unexpected
    columns of the file ``path``.
    """
    if tuple(names) == tuple(columns):
        return features, False
    position = {name: j for j, name in enumerate(columns)}
    wanted = set(names)
    missing = [n for n in names if n not in position]
    unexpected = [n for n in columns if n not in wanted]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {_first_few(missing)}")
        if unexpected:
            parts.append(f"unexpected {_first_few(unexpected)}")
        raise DeltabInputError(
            f"{path} does not have the feature columns the model was trained on: "
            f"{'; '.join(parts)} (the model has {len(names)} features, the file "
            f"{len(columns)}); give the model's features, named as in its training table."
        )
    return features[:, [position[n] for n in names]], True


def _first_few(names: Sequence[str], shown: int = 3) -> str:
    text = ", ".join(repr(n) for n in names[:shown])
    return text + (f" and {len(names) - shown} more" if len(names) > shown else "")


def check_same_subjects(ages: AgeColumn, table: Table) -> None:
    """Raise unless ``ages`` and ``table`` describe the same subjects in the same order."""
    if ages.n_subjects != table.n_subjects:
        raise DeltabInputError(
            f"{ages.path} has {ages.n_subjects} subjects but {table.path} has "
            f"{table.n_subjects}; line k of each file must be the same subject."
        )
    if ages.ids is not None and table.ids is not None:
        for k, (a, b) in enumerate(zip(ages.ids, table.ids, strict=True)):
            if a != b:
                raise DeltabInputError(
                    f"subject {k + 1} is {a!r} in {ages.path} (line {ages.lines[k]}) but "
                    f"{b!r} in {table.path} (line {table.lines[k]}); the files must list "
                    "subjects in the same order."
                )


def check_output_path(path: str | Path, *, overwrite: bool) -> Path:
    """Refuse to clobber an existing file unless asked, and require an existing folder."""
    target = Path(path)
    if target.is_dir():
        raise DeltabInputError(f"cannot write {target}: it is a directory.")
    if target.exists() and not overwrite:
        raise DeltabInputError(
            f"{target} already exists; pass --overwrite to replace it or choose another name."
        )
    parent = target.parent
    if not parent.is_dir():
        raise DeltabInputError(f"cannot write {target}: the folder {parent} does not exist.")
    return target


def _write_atomically(path: Path, text_lines: Iterator[str]) -> None:
    """Write via a temporary sibling and rename, so a failure leaves no half-written file."""
    temporary = path.with_name(f".{path.name}.partial")
    try:
        with temporary.open("w", encoding="utf-8", newline="") as out:
            for line in text_lines:
                out.write(line)
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise DeltabInputError(f"cannot write {path}: {exc.strerror or exc}.") from None


def _format(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.10g}"


def write_values(path: str | Path, values: FloatArray) -> None:
    """One number per line, the layout the public ``deltab`` tool writes."""
    _write_atomically(Path(path), (f"{_format(float(v))}\n" for v in values))


def write_table(
    path: str | Path,
    columns: Sequence[tuple[str, Sequence[str] | FloatArray]],
    *,
    delimiter: str | None = None,
) -> None:
    """Write named columns with a header; tab-delimited for ``.tsv``/``.tab``, else commas.

    Text cells (subject ids) are quoted where the delimiter or a quote needs
    it and made :func:`spreadsheet_safe`, so an id such as
    ``=HYPERLINK("http://...")`` read from an input table is not written
    back as a live formula.
    """
    target = Path(path)
    sep = delimiter or ("\t" if target.suffix.lower() in {".tsv", ".tab"} else ",")
    n = len(columns[0][1]) if columns else 0
    rendered: list[list[str]] = []
    for _, data in columns:
        if isinstance(data, np.ndarray):
            rendered.append([_format(float(v)) for v in data])
        else:
            rendered.append([spreadsheet_safe(str(v)) for v in data])

    def lines() -> Iterator[str]:
        buffer = io.StringIO()
        writer = csv.writer(buffer, delimiter=sep, lineterminator="\n")
        writer.writerow([spreadsheet_safe(name) for name, _ in columns])
        for i in range(n):
            writer.writerow([col[i] for col in rendered])
            if buffer.tell() > 1 << 16:
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
        yield buffer.getvalue()

    _write_atomically(target, lines())
