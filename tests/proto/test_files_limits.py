"""Files someone else may have put there, and text someone else wrote.

Every reader of ``bounded.files`` refuses a FIFO (without blocking), a device
such as ``/dev/zero`` behind a symlink (without reading it), a folder and a
file over its limit, each in one sentence naming the file; secret keys are
also refused when group or others may access them. ``bounded.nesting`` bounds
the depth of TOML and JSON before the recursive parsers see it.
``proto.text.sanitise_text`` makes peer text printable, and
``spreadsheet_safe`` keeps ids from becoming formulas.
"""

from __future__ import annotations

import os
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bounded.files import (
    LocalFileError,
    MissingFileError,
    open_limited,
    read_limited,
    read_limited_text,
    read_secret,
)
from bounded.nesting import (
    MAX_NESTING,
    NestingError,
    check_text_nesting,
    check_value_nesting,
    parse_json,
)
from node.deltab.cells import spreadsheet_safe
from node.deltab.io import read_table, write_table
from proto.federation import ConfigError, parse_federation
from proto.text import sanitise_text
from tests.support.sample_config import edited

Reader = Callable[[Path], object]

READERS: dict[str, Reader] = {
    "read_limited": lambda p: read_limited(p, 1 << 20, what="test file"),
    "read_limited_text": lambda p: read_limited_text(p, 1 << 20, what="test file"),
    "read_secret": lambda p: read_secret(p, 1 << 20, what="test file"),
    "open_limited": lambda p: open_limited(p, 1 << 20, what="test file").read(),
}


def _in_thread(call: Callable[[], object], seconds: float = 10.0) -> BaseException | None:
    """Run ``call`` in a thread; fail the test if it does not return (a FIFO read blocks)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as error:  # the refusal is the outcome under test
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"the reader was still blocked after {seconds} s"
    return outcome[0]


@pytest.mark.parametrize("reader", list(READERS))
def test_a_fifo_is_refused_at_once(tmp_path: Path, reader: str) -> None:
    fifo = tmp_path / "federation.toml"
    os.mkfifo(fifo, 0o600)
    error = _in_thread(lambda: READERS[reader](fifo))
    assert isinstance(error, LocalFileError)
    assert str(error) == f"test file {fifo} is a FIFO (named pipe); only a regular file is read"


@pytest.mark.parametrize("reader", list(READERS))
def test_dev_zero_behind_a_symlink_is_refused_unread(tmp_path: Path, reader: str) -> None:
    link = tmp_path / "identity.pem"
    link.symlink_to("/dev/zero")
    error = _in_thread(lambda: READERS[reader](link))
    assert isinstance(error, LocalFileError)
    assert "is a character device; only a regular file is read" in str(error)


@pytest.mark.parametrize("reader", list(READERS))
def test_sizes_folders_and_absent_files(tmp_path: Path, reader: str) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * ((1 << 20) + 1))
    big.chmod(0o600)
    with pytest.raises(LocalFileError, match=r"holds 1048577 bytes, more than the 1048576"):
        READERS[reader](big)
    with pytest.raises(LocalFileError, match="is a folder"):
        READERS[reader](tmp_path)
    with pytest.raises(MissingFileError, match="does not exist") as caught:
        READERS[reader](tmp_path / "absent")
    assert isinstance(caught.value, FileNotFoundError)
    fits = tmp_path / "fits"
    fits.write_bytes(b"x" * (1 << 20))
    fits.chmod(0o600)
    assert len(READERS[reader](fits)) == 1 << 20  # type: ignore[arg-type]


def test_a_stream_stops_at_the_limit_when_the_file_grows(tmp_path: Path) -> None:
    path = tmp_path / "table.csv"
    path.write_bytes(b"a\n" * 10)
    with open_limited(path, 30, what="table") as stream:
        path.write_bytes(b"a\n" * 100)  # the same inode, now longer than the limit
        with pytest.raises(LocalFileError, match="grew beyond the 30 bytes"):
            stream.read()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o666, 0o602, 0o610])
def test_a_secret_others_may_access_is_refused_with_the_chmod(tmp_path: Path, mode: int) -> None:
    key = tmp_path / "client.key"
    key.write_bytes(b"secret")
    key.chmod(mode)
    with pytest.raises(LocalFileError) as caught:
        read_secret(key, 1024, what="client key")
    assert str(caught.value) == (
        f"client key {key} is a secret key but has mode {mode:04o}, so other users may read "
        f"it; make it private with `chmod 600 {key}` (and replace the key if someone else "
        "may have copied it)"
    )
    key.chmod(0o600)
    assert read_secret(key, 1024, what="client key") == b"secret"
    key.chmod(0o400)
    assert read_secret(key, 1024, what="client key") == b"secret"


# ---------------------------------------------------------------- nesting


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 50_000, 100_000])
def test_deep_json_is_refused_before_parsing(depth: int) -> None:
    text = "[" * depth + "]" * depth
    with pytest.raises(NestingError, match=f"more than {MAX_NESTING} levels deep"):
        parse_json(text, what="the model file")
    objects = '{"a":' * depth + "1" + "}" * depth
    with pytest.raises(NestingError, match="the model file nests"):
        parse_json(objects, what="the model file")


def test_json_at_the_limit_and_brackets_in_strings_are_fine() -> None:
    text = "[" * MAX_NESTING + "]" * MAX_NESTING
    assert parse_json(text, what="x") is not None
    quoted = '["' + "[" * 1000 + '", "\\"[[[", {"k{": "}]]"}]'
    assert parse_json(quoted, what="x")[0] == "[" * 1000


def test_toml_brackets_in_strings_and_comments_do_not_count() -> None:
    text = (
        'a = "' + "[" * 500 + '"\n'
        "b = '" + "{" * 500 + "'\n"
        "# " + "[" * 500 + "\n"
        'c = """\n' + "[" * 500 + '\n"""\n'
        "d = '''" + "{" * 500 + "'''\n"
        "e = [[1, 2], [3]]\n"
    )
    check_text_nesting(text, what="a federation config", syntax="toml")
    assert tomllib.loads(text)["e"] == [[1, 2], [3]]


@pytest.mark.parametrize(
    "text",
    [
        "x = " + "[" * 60_000 + "]" * 60_000,
        "x = " + "{a = " * 5_000 + "1" + "}" * 5_000,
        ".".join(["k"] * 5_000) + " = 1",
        "[" + ".".join(["t"] * 5_000) + "]\nv = 1",
    ],
    ids=["arrays", "inline-tables", "dotted-keys", "table-header"],
)
def test_deep_toml_is_one_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_federation(text, source="fed.toml")
    assert str(caught.value).startswith(
        f"file = 'fed.toml': a federation config nests arrays or tables more than {MAX_NESTING} "
        "levels deep"
    )


def test_value_nesting_walks_without_recursion() -> None:
    value: object = 1
    for _ in range(200_000):
        value = {"k": [value]}
    with pytest.raises(NestingError):
        check_value_nesting(value, what="x")
    check_value_nesting({"a": [[1], {"b": 2}]}, what="x")


# ---------------------------------------------------------------- peer text


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J\x1b[31mred", "\\x1b[2J\\x1b[31mred"),
        ("\x1b]8;;http://evil\x07link\x1b]8;;\x07", "\\x1b]8;;http://evil\\x07link\\x1b]8;;\\x07"),
        ("ok\rfake line", "ok\\rfake line"),
        ("one\ntwo\tthree", "one\\ntwo\\tthree"),
        ("right\u202eto left", "right\\u202eto left"),
        ("\x9bC1 CSI", "\\x9bC1 CSI"),
        ("back\\slash", "back\\\\slash"),
        ("Zürich 東京 — fine", "Zürich 東京 — fine"),
    ],
)
def test_sanitise_text_escapes_what_a_terminal_would_obey(raw: str, shown: str) -> None:
    assert sanitise_text(raw) == shown
    assert "\x1b" not in sanitise_text(raw)


def test_sanitise_text_bounds_the_length() -> None:
    assert sanitise_text("x" * 500) == "x" * 500
    cut = sanitise_text("x" * 501)
    assert len(cut) == 500 and cut.endswith("…")
    escaped = sanitise_text("\x1b" * 300, limit=20)
    assert len(escaped) <= 20 and escaped.endswith("…") and "\x1b" not in escaped
    assert sanitise_text(b"\x1b[31m", limit=50) == "b'\\\\x1b[31m'"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit = 0"):
        sanitise_text("x", limit=0)


# ---------------------------------------------------------------- CSV output


@pytest.mark.parametrize(
    ("cell", "written"),
    [
        ('=HYPERLINK("http://evil","x")', '\'=HYPERLINK("http://evil","x")'),
        ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\t=1", "'\t=1"),
        ("\r=1", "'\r=1"),
        ("-3.2", "-3.2"),
        ("+44", "+44"),
        ("-1e5", "-1e5"),
        ("sub-001", "sub-001"),
        ("", ""),
    ],
)
def test_spreadsheet_safe(cell: str, written: str) -> None:
    assert spreadsheet_safe(cell) == written


def test_written_tables_hold_no_live_formula_and_read_back(tmp_path: Path) -> None:
    ids = ('=HYPERLINK("http://evil","click")', "a,b", "-7", "@x")
    path = tmp_path / "predictions.csv"
    write_table(path, [("id", ids), ("age", np.array([50.0, 60.0, -3.25, 70.0]))])
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[1] == '"\'=HYPERLINK(""http://evil"",""click"")",50'
    assert lines[2] == '"a,b",60'
    assert lines[3] == "-7,-3.25"
    back = read_table(path)
    assert back.ids == ('\'=HYPERLINK("http://evil","click")', "a,b", "-7", "'@x")
    assert back.age is not None and back.age[2] == -3.25


# ---------------------------------------------------------------- numbers at load

RANGE_ERRORS: list[tuple[str, str, str]] = [
    (
        edited("min_cohort_size = 100", "min_cohort_size = 9223372036854775807"),
        "min_cohort_size",
        "between 1 and 1000000000",
    ),
    (edited("epsilon = 1.0", "epsilon = 1e-300"), "privacy.epsilon", "between 0.001 and 1000"),
    (
        edited("epsilon_budget = 4.0", "epsilon_budget = 1e308"),
        "privacy.epsilon_budget",
        "between 0.001 and 100000",
    ),
    (
        edited('target_std = "calibrated"', "target_std = 1e300"),
        "privacy.noise_design.target_std",
        "at most 2^(56-F) = 16777216 with fixed_point_bits F = 32",
    ),
    (
        edited("shape = [10]", "shape = [1073741824, 2]"),
        "plan.rounds[1].tensors",
        "at most 1073741824 values",
    ),
    (
        edited("min_nodes = 2", 'min_nodes = 2\nrevoked = ["xyz"]'),
        "revoked[0]",
        "SHA-256 fingerprint: 64 hexadecimal digits",
    ),
]


@pytest.mark.parametrize(("text", "field", "reason"), RANGE_ERRORS)
def test_every_number_is_range_checked_at_load(text: str, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_federation(text)
    assert caught.value.field == field, str(caught.value)
    assert reason in str(caught.value)
