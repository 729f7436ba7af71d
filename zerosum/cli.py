"""The ``zerosum`` command: a thin dispatcher over lazily imported subcommands.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``. Only the chosen subcommand's module is imported, so
``zerosum deltab`` never loads grpc or scikit-learn. This is the only module
that knows about both ``node`` and ``coordinator``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, cast

from zerosum import __version__

# name -> (module, one-line summary). Later subcommands register here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "coordinator": (
        "zerosum.commands.coordinator",
        "run the coordinator of a session: mutual-TLS gRPC server that sums masked egress",
    ),
    "deltab": (
        "zerosum.commands.deltab",
        "train a brain-age model and predict brain age or delta (the public deltab flags)",
    ),
    "demo": (
        "zerosum.commands.demo",
        "run a complete local multi-TRE session on synthetic cohorts (mutual TLS, real processes)",
    ),
    "federation": (
        "zerosum.commands.federation",
        "set up a federation: shared config, CA and TLS certificates, node identity keys"
        " (and synthetic cohorts)",
    ),
    "ledger": (
        "zerosum.commands.ledger",
        "print a node's privacy ledger: releases, unmask answers, composed ε, budget left",
    ),
    "node": (
        "zerosum.commands.node",
        "run one TRE's node of a session: signed join, masked egress bundles, review gate,"
        " exact aggregate",
    ),
    "predict": (
        "zerosum.commands.predict",
        "apply a saved brain-age model to a table of new subjects",
    ),
    "review": (
        "zerosum.commands.review",
        "re-check one egress bundle (exit 0 pass, 1 look, 2 fail) and sign the output"
        " checker's approval or rejection",
    ),
    "privacy": (
        "zerosum.commands.privacy",
        "print the per-observer privacy table (outsider / coordinator / coalition) for a design",
    ),
    "simulate": (
        "zerosum.commands.simulate",
        "simulate correlated vs independent noise: utility, privacy, attacks, report",
    ),
    "synth": (
        "zerosum.commands.synth",
        "write a synthetic brain-age cohort with a known ground truth",
    ),
}


class _Subcommand(Protocol):
    DESCRIPTION: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _top_help() -> str:
    width = max(len(n) for n in SUBCOMMANDS)
    lines = [
        f"zerosum {__version__} — federated brain-age estimation across TREs with",
        "zero-sum correlated noise (every egress is private, the aggregate is exact).",
        "",
        "usage: zerosum <command> [options]     (zerosum <command> --help for details)",
        "",
        "commands:",
    ]
    lines += [f"  {name.ljust(width)}  {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    return "\n".join(lines)


@contextmanager
def _warnings_as_lines(name: str) -> Iterator[None]:
    """Show each Python warning as one line in the tool's words, for operator logs.

    Python's default shows the file, line number, category and source line of
    the code that warned (``…/plan.py:199: DeltabWarning: …``); an operator
    needs the sentence only: ``zerosum node: warning: <message>``. Filters
    (``-W``, ``PYTHONWARNINGS``, pytest's) still decide whether a warning is
    shown or raised; only how a shown one looks changes.
    """

    def one_line(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        line: str | None = None,
    ) -> str:
        # Replacing the format, not the display, leaves warnings.catch_warnings'
        # recording (pytest.warns, a caller's own) as it is.
        text = " ".join(str(message).split())  # one line, whatever the message holds
        return f"zerosum {name}: warning: {text}\n"

    previous = warnings.formatwarning
    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = previous


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_top_help())
        return 0
    if args[0] == "--version":
        print(__version__)
        return 0
    name = args[0]
    if name not in SUBCOMMANDS:
        print(f"zerosum: unknown command {name!r}.\n", file=sys.stderr)
        print(_top_help(), file=sys.stderr)
        return 2
    module = cast(_Subcommand, importlib.import_module(SUBCOMMANDS[name][0]))
    # gRPC's C core prints lines of its own on stderr (a failed TLS handshake,
    # with source file and thread id). A command that talks gRPC names the
    # level it wants (its GRPC_VERBOSITY): the node says what went wrong in its
    # own sentence instead, the coordinator turns them into its log lines
    # (coordinator.logs). An operator's own GRPC_VERBOSITY wins; ours is undone
    # when the command returns, so it never passes to another command.
    verbosity = getattr(module, "GRPC_VERBOSITY", None)
    ours = verbosity is not None and "GRPC_VERBOSITY" not in os.environ
    if ours:
        os.environ["GRPC_VERBOSITY"] = str(verbosity)
    parser = argparse.ArgumentParser(
        prog=f"zerosum {name}",
        description=module.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    ns = parser.parse_args(args[1:])
    try:
        with _warnings_as_lines(name):
            return module.run(ns)
    except BrokenPipeError:  # e.g. `zerosum privacy | head`: the reader left, not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        # A command that can be resumed says how (its module's RESUME_HINT).
        hint = getattr(module, "RESUME_HINT", "")
        print(f"zerosum {name}: interrupted{'; ' + hint if hint else ''}", file=sys.stderr)
        return 130
    finally:
        if ours:
            os.environ.pop("GRPC_VERBOSITY", None)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
