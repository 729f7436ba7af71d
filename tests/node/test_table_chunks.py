"""Subject tables read a chunk of subjects at a time: the same table, the same errors.

``read_table`` parses its second pass ``_CHUNK_ROWS`` subjects at a time into
one C-contiguous feature array. Whatever the chunk size, the features, ages,
ids and line numbers are those of parsing the file in one piece, bit for bit,
and a bad cell is named by its line and column as before.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from node.deltab import io
from node.deltab.io import DeltabInputError, read_table

CHUNKS = [1, 7, 256]


def _write(path: Path, n: int = 600, p: int = 9, seed: int = 11) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.normal(0.0, 1e3, size=(n, p + 1))
    header = ["eid", "f0", "f1", "age", *[f"f{j}" for j in range(2, p)]]
    lines = [",".join(header)]
    for i, row in enumerate(values):
        cells = [repr(float(v)) for v in row]
        lines.append(",".join([f'"s,{i}"' if i % 50 == 0 else f"s{i}", *cells]))
        if i % 97 == 0:
            lines.append("")  # blank lines are not subjects
    path.write_text("\n".join(lines) + "\n")
    return values


def _written_lines(tmp_path: Path) -> tuple[Path, list[str]]:
    """The test table written to tmp_path/cohort.csv, and its lines."""
    path = tmp_path / "cohort.csv"
    _write(path)
    return path, path.read_text().split("\n")


def _set_cell(text: list[str], index: int, column: int, value: str) -> None:
    """Put ``value`` in field ``column`` of ``text[index]`` (a line without quoted commas)."""
    cells = text[index].split(",")
    cells[column] = value
    text[index] = ",".join(cells)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_any_chunk_size_reads_the_same_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    path = tmp_path / "cohort.csv"
    values = _write(path)
    monkeypatch.setattr(io, "_CHUNK_ROWS", chunk)
    table = read_table(path)
    # The file in one piece through numpy's reader: column 3 of the numbers is the age.
    whole = np.loadtxt(path, delimiter=",", skiprows=1, usecols=range(1, 11), quotechar='"')
    assert np.array_equal(whole, values)
    assert table.features.flags.c_contiguous
    assert table.features.tobytes() == np.delete(whole, 2, axis=1).tobytes()
    assert table.age is not None and table.age.tobytes() == whole[:, 2].tobytes()
    assert table.feature_names == ("f0", "f1", *[f"f{j}" for j in range(2, 9)])
    assert table.ids is not None and table.ids[50] == "s,50" and table.ids[1] == "s1"
    assert table.lines[:3].tolist() == [2, 4, 5]  # line 3 is blank


@pytest.mark.parametrize("chunk", CHUNKS)
def test_missing_tokens_in_one_chunk_are_read_as_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    path, text = _written_lines(tmp_path)
    assert '"' not in text[400]
    _set_cell(text, 400, 1, "NA")  # feature f0 of the subject on line 401, far into the file
    path.write_text("\n".join(text))
    monkeypatch.setattr(io, "_CHUNK_ROWS", chunk)
    table = read_table(path)
    at = int(np.flatnonzero(table.lines == 401)[0])
    assert np.isnan(table.features[at, 0])
    assert np.isnan(table.features).sum() == 1
    monkeypatch.setattr(io, "_CHUNK_ROWS", 10**6)
    assert read_table(path).features.tobytes() == table.features.tobytes()


@pytest.mark.parametrize("chunk", CHUNKS)
def test_a_bad_cell_is_named_by_line_and_column_before_an_earlier_infinity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    path, text = _written_lines(tmp_path)
    assert '"' not in text[10] + text[500]
    _set_cell(text, 10, 3, "inf")  # the age on line 11
    _set_cell(text, 500, 4, "12x")  # feature f2 on line 501
    path.write_text("\n".join(text))
    monkeypatch.setattr(io, "_CHUNK_ROWS", chunk)
    with pytest.raises(DeltabInputError, match=r"line 501, column 'f2': '12x' is not a number"):
        read_table(path)
    text[500] = text[500].replace("12x", "1.5")
    path.write_text("\n".join(text))
    with pytest.raises(DeltabInputError, match=r"line 11, column 'age': 'inf' is not a finite"):
        read_table(path)
