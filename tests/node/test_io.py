"""Subject tables: delimiters, headers, ids, missing values, and one-sentence errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from node.deltab.io import (
    DeltabInputError,
    check_output_path,
    check_same_subjects,
    no_age_column,
    read_ages,
    read_table,
    select_features,
    write_table,
    write_values,
)
from node.deltab.synthetic import make_cohort, write_cohort_csv


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "header", "include_id"),
    [
        ("c.csv", True, True),
        ("c.tsv", True, True),
        ("c.csv", False, False),
        ("c.tsv", False, True),
        ("c.txt", True, False),
    ],
)
def test_round_trip_of_a_synthetic_cohort(
    tmp_path: Path, name: str, header: bool, include_id: bool
) -> None:
    cohort = make_cohort(40, 7, seed=3)
    path = write_cohort_csv(cohort, tmp_path / name, include_id, header=header)
    table = read_table(path)
    assert table.has_header is header
    assert table.n_subjects == 40
    if header:
        assert table.feature_names == cohort.feature_names
        assert table.age is not None
        np.testing.assert_allclose(table.age, cohort.age, atol=1e-6)
        np.testing.assert_allclose(table.features, cohort.features, rtol=1e-6)
    else:
        # Without a header the age column is indistinguishable from a feature.
        assert table.age is None
        assert table.n_features == 8
        np.testing.assert_allclose(table.features[:, 0], cohort.age, atol=1e-6)
    assert table.ids == (cohort.ids if include_id else None)


def test_whitespace_layout_without_header(tmp_path: Path) -> None:
    table = read_table(_write(tmp_path, "x.txt", "1 2  3\n\n4\t5 6\n"))
    np.testing.assert_array_equal(table.features, [[1, 2, 3], [4, 5, 6]])
    assert table.delimiter is None
    assert table.lines.tolist() == [1, 3]


def test_missing_value_tokens_become_nan(tmp_path: Path) -> None:
    path = _write(tmp_path, "m.csv", "id,age,a,b\ns1,60,NA,1\ns2,61,,2\ns3,62,nan,N/A\n")
    table = read_table(path)
    assert np.isnan(table.features[:, 0]).all()
    assert np.isnan(table.features[2, 1])
    assert table.ids == ("s1", "s2", "s3")


def test_id_column_in_the_middle_and_quotes(tmp_path: Path) -> None:
    path = _write(tmp_path, "q.csv", '"a","participant_id","age"\n"1.5","sub 1",70\n2,sub-2,71\n')
    table = read_table(path)
    assert table.ids == ("sub 1", "sub-2")
    assert table.feature_names == ("a",)
    np.testing.assert_array_equal(table.features[:, 0], [1.5, 2.0])
    np.testing.assert_array_equal(table.age, [70, 71])


def test_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_bytes("\ufeffage,a\r\n60,1\r\n61,2\r\n".encode())
    table = read_table(path)
    np.testing.assert_array_equal(table.age, [60, 61])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("id,age,a,b\ns1,60,1,2\n\ns2,61,3\n", r"x.csv: line 4 has 3 fields; the header has 4\."),
        ("id,age,a,b\ns1,60,1,2\ns2,61,3,4,5\n", r"line 3 has 5 fields; the header has 4\."),
        ("1,2,3\n4,5\n", r"line 2 has 2 fields; line 1 has 3\."),
        ("id,age,f0004\ns1,60,1\ns2,61,abc\n", r"line 3, column 'f0004': 'abc' is not a number\."),
        ("1,2\n3,x\n", r"line 2, column 2: 'x' is not a number\."),
        ("age,a\n60,inf\n", r"line 2, column 'a': 'inf' is not a finite number\."),
        ("", r"x.csv is empty\."),
        ("\n \n", r"x.csv is empty\."),
        ("age,a\n", r"has a header line but no subjects\."),
        ("age,a,AGE\n1,2,3\n", r"the column name 'AGE' appears twice"),
    ],
)
def test_bad_tables_give_one_clear_sentence(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DeltabInputError, match=message):
        read_table(_write(tmp_path, "x.csv", text))


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(DeltabInputError, match="there is no such file"):
        read_table(tmp_path / "absent.csv")
    with pytest.raises(DeltabInputError, match="it is a directory"):
        read_table(tmp_path)
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(DeltabInputError, match="not UTF-8 text"):
        read_table(binary)


def test_read_ages_layouts(tmp_path: Path) -> None:
    np.testing.assert_array_equal(read_ages(_write(tmp_path, "a", "60\n61\n")).values, [60, 61])
    np.testing.assert_array_equal(read_ages(_write(tmp_path, "b", "age\n60\n")).values, [60])
    np.testing.assert_array_equal(
        read_ages(_write(tmp_path, "c", "60 61 62\n")).values, [60, 61, 62]
    )
    ages = read_ages(_write(tmp_path, "d.csv", "id,age,x\ns1,60,1\n"))
    assert ages.ids == ("s1",)
    with pytest.raises(DeltabInputError, match="has 2 columns and none is named 'age'"):
        read_ages(_write(tmp_path, "e.csv", "a,b\n1,2\n3,4\n"))


def test_subject_count_and_order_checks(tmp_path: Path) -> None:
    ages = read_ages(_write(tmp_path, "ages.txt", "60\n61\n62\n"))
    table = read_table(_write(tmp_path, "x.csv", "a\n1\n2\n"))
    with pytest.raises(DeltabInputError, match=r"ages.txt has 3 subjects but .*x.csv has 2"):
        check_same_subjects(ages, table)
    named = read_ages(_write(tmp_path, "n.csv", "id,age\ns1,60\ns2,61\n"))
    other = read_table(_write(tmp_path, "o.csv", "id,a\ns1,1\ns3,2\n"))
    with pytest.raises(DeltabInputError, match=r"subject 2 is 's2' in .* but 's3' in"):
        check_same_subjects(named, other)


def test_output_path_checks(tmp_path: Path) -> None:
    existing = _write(tmp_path, "out.txt", "x")
    with pytest.raises(DeltabInputError, match="already exists; pass --overwrite"):
        check_output_path(existing, overwrite=False)
    assert check_output_path(existing, overwrite=True) == existing
    with pytest.raises(DeltabInputError, match="does not exist"):
        check_output_path(tmp_path / "no" / "out.txt", overwrite=False)
    with pytest.raises(DeltabInputError, match="is a directory"):
        check_output_path(tmp_path, overwrite=True)


def test_writers_round_trip(tmp_path: Path) -> None:
    write_values(tmp_path / "v.txt", np.array([1.5, np.nan, 3.0]))
    assert (tmp_path / "v.txt").read_text() == "1.5\n\n3\n"
    write_table(
        tmp_path / "t.tsv",
        [("id", ["a", "b"]), ("age", np.array([60.0, 61.0])), ("delta", np.array([0.5, -1]))],
    )
    table = read_table(tmp_path / "t.tsv")
    assert table.ids == ("a", "b")
    np.testing.assert_array_equal(table.features[:, 0], [0.5, -1.0])
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.parametrize(
    "text",
    [
        "id;age;f1;f2\ns1;60;1.5;2\ns2;61;1;2\n",  # semicolons, decimal points
        "id;age;f1\ns1;60,5;1,25\ns2;61,5;1\n",  # a spreadsheet's decimal commas
        "60;1,5;2\n61;1;2\n",  # headerless, decimal commas
        "60;1;2\n61;1;2\n",  # headerless
    ],
)
def test_a_semicolon_separated_file_is_named_as_such(tmp_path: Path, text: str) -> None:
    with pytest.raises(DeltabInputError, match=r"x.csv looks semicolon-separated \(line 1 has"):
        read_table(_write(tmp_path, "x.csv", text))


def test_semicolons_inside_quotes_are_just_text(tmp_path: Path) -> None:
    table = read_table(_write(tmp_path, "q.csv", 'id,age,a\n"s;1",60,1\n"s;2",61,2\n'))
    assert table.ids == ("s;1", "s;2")


def test_no_age_column_says_why(tmp_path: Path) -> None:
    remedy = "add one."
    headerless = read_table(_write(tmp_path, "n.csv", "60,1,2\n61,2,3\n"))
    assert no_age_column(headerless, remedy) == (
        f"{tmp_path / 'n.csv'} has no 'age' column: it has no header row (line 1 holds data, "
        "not column names); add one."
    )
    with_ids = read_table(_write(tmp_path, "i.csv", "s1,60,1\ns2,61,2\n"))
    assert "it has no header row" in no_age_column(with_ids, remedy)
    near = read_table(_write(tmp_path, "m.csv", "id,Age_at_scan,a\ns1,60,1\ns2,61,2\n"))
    assert "has no column named exactly 'age' (its header has 'Age_at_scan')" in no_age_column(
        near, remedy
    )
    other = read_table(_write(tmp_path, "o.csv", "id,years,a,b,c,d\ns1,60,1,2,3,4\n"))
    assert "(its header names 'id', 'years', 'a', 'b', ...)" in no_age_column(other, remedy)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "id,age,a\ns1,60,1\ns2,61,2\ns1,62,3\n",
            r"x.csv: the subject id 's1' appears twice \(lines 2 and 4\); every subject needs",
        ),
        ("s1 60 1\ns2 61 2\ns2 62 3\n", r"the subject id 's2' appears twice \(lines 2 and 3\)"),
        ("age,eid,a\n60,7,1\n61,7,2\n", r"the subject id '7' appears twice \(lines 2 and 3\)"),
        ("id,age,a\n,60,1\n,61,2\n", r"an empty id appears twice \(lines 2 and 3\)"),
    ],
)
def test_duplicate_subject_ids_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DeltabInputError, match=message):
        read_table(_write(tmp_path, "x.csv", text))


def test_select_features_reorders_by_name_or_names_the_difference() -> None:
    values = np.array([[1.0, 2.0, 3.0]])
    path = Path("t.csv")
    same, moved = select_features(path, ("a", "b", "c"), values, ("a", "b", "c"))
    assert same is values and not moved
    reordered, moved = select_features(path, ("c", "a", "b"), values, ("a", "b", "c"))
    assert moved
    np.testing.assert_array_equal(reordered, [[2.0, 3.0, 1.0]])
    with pytest.raises(
        DeltabInputError, match=r"t.csv does not have the feature columns .*: missing 'b'; "
        r"unexpected 'x' \(the model has 3 features, the file 3\)"
    ):  # fmt: skip
        select_features(path, ("a", "x", "c"), values, ("a", "b", "c"))
    many = tuple(f"m{j}" for j in range(6))
    with pytest.raises(DeltabInputError, match=r"missing 'm0', 'm1', 'm2' and 3 more \("):
        select_features(path, ("a", "b", "c"), values, ("a", "b", "c", *many))
