"""How far one round travels through the code: the modules a node visits, and its returns to them.

A structure figure, not a speed. A whole session runs in this process
(``zerosum.inprocess``: three real node runners in threads and the real
coordinator session over a SQLite file, no network) on small synthetic
cohorts, and node ``a``'s thread is traced with :func:`sys.setprofile` from
the moment it enters ``node.session.model_round.run_model_round`` for the
first model round until that call returns: the egress computed, noised,
written, approved and uploaded, the unmask step answered, the aggregate
received and checked.

How it counts. Every call and return event in the traced window is
attributed to the innermost frame that belongs to the project's node side
(modules of ``node``, ``noise`` and ``proto``; frames of numpy, the standard
library, ``coordinator`` and ``zerosum.inprocess`` are passed through to the
project frame below them, because over gRPC the coordinator's code runs in
another process and ``node.protocol.client`` stands where the in-process gateway
stands). Following that module through the trace:

* ``round_walk_modules``: how many distinct modules the round visits;
* ``round_walk_returns``: how many times control moves into a module it has
  already been in and left (a call returning to its caller's module counts,
  as does a second call into a helper module);
* ``round_walk_transitions``: every change of module, first visits included;
* ``round_walk_module_pairs``: distinct (from, to) pairs among those changes,
  which a loop over tensors or chunks does not inflate;
* ``round_walk_distinct_returns``: distinct (from, to) pairs among the returns,
  i.e. the returns counted once per edge, so that neither a loop nor the
  node's polls while it waits inflate them.

The session, keys and cohorts are the same every time, so the modules and
the module pairs are fixed for a given code base; returns and transitions
also count the node's polls while it waits for the round's result, whose
number depends on timing (a few per cent from run to run); the distinct
returns do not. One run is
therefore enough; ``repeats`` is accepted for the benchmark runner and ignored.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from coordinator.config import SessionConfig
from coordinator.session import Session
from coordinator.store import Store
from node.protocol.gateway import CoordinatorGateway
from node.runner import NodeOptions, NodeRunner
from node.session import model_round
from node.session.setup import LocalSetup
from proto.federation import config_hash, load_federation
from zerosum.commands import federation as federation_command
from zerosum.inprocess import InProcessGateway, Ticker

__all__ = ["Walk", "run", "walk_one_round"]

NODES = "abc"
_COUNTED = ("node", "noise", "proto")
_PASSED = ("coordinator", "zerosum.inprocess")
_TIMEOUT = 120.0


def _federation(out: Path) -> Path:
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    args = parser.parse_args(
        [
            "init",
            "--nodes",
            ",".join(NODES),
            "--out",
            str(out),
            "--synthetic",
            "--seed",
            "21",
            "--n-features",
            "5",
            "--n-components",
            "2",
            "--cohort-sizes",
            "120,130,140",
            "--round-deadline",
            "5",
            "--join-deadline",
            "30",
            "--nan-policy",
            "mean",
        ]
    )
    if federation_command.run(args) != 0:
        raise RuntimeError("zerosum federation init failed for the round walk")
    return out


def _counted(module: str) -> bool:
    if module.startswith(_PASSED):
        return False
    return module.split(".", 1)[0] in _COUNTED


class Walk:
    """The module-by-module path of the traced window (see the module docstring)."""

    def __init__(self) -> None:
        self.path: list[str] = []
        self.active = False
        self._window: FrameType | None = None

    def _module_of(self, frame: FrameType | None) -> str | None:
        while frame is not None:
            module = frame.f_globals.get("__name__", "")
            if isinstance(module, str) and _counted(module):
                return module
            frame = frame.f_back
        return None

    def _note(self, frame: FrameType | None) -> None:
        module = self._module_of(frame)
        if module is not None and (not self.path or self.path[-1] != module):
            self.path.append(module)

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            if not self.active and frame.f_code is model_round.run_model_round.__code__:
                self.active = True
                self._window = frame
            if self.active:
                self._note(frame)
        elif event == "return" and self.active:
            if frame is self._window:
                self.active = False
                self._window = None
                sys.setprofile(None)
                return
            self._note(frame.f_back)

    def figures(self) -> dict[str, float]:
        seen: set[str] = set()
        returns = 0
        return_pairs: set[tuple[str, str]] = set()
        previous: str | None = None
        for module in self.path:
            if module in seen:
                returns += 1
                if previous is not None:
                    return_pairs.add((previous, module))
            seen.add(module)
            previous = module
        pairs = set(zip(self.path, self.path[1:], strict=False))
        return {
            "round_walk_modules": float(len(seen)),
            "round_walk_returns": float(returns),
            "round_walk_distinct_returns": float(len(return_pairs)),
            "round_walk_transitions": float(max(0, len(self.path) - 1)),
            "round_walk_module_pairs": float(len(pairs)),
        }


def walk_one_round(root: Path) -> Walk:
    """Run the session under ``root`` and trace node a's first model round."""
    fed = _federation(root / "fed")
    config = load_federation(fed / "federation.toml")
    session = Session(
        Store(root / "state.sqlite"), SessionConfig.from_federation(config, config_hash(config))
    )
    ticker = Ticker(session)
    ticker.start()
    walk = Walk()
    failures: dict[str, BaseException] = {}

    def gateway(
        setup: LocalSetup, _options: NodeOptions, _say: Callable[[str], None]
    ) -> CoordinatorGateway:
        return InProcessGateway(session, setup.node_id)

    def run_node(node: str) -> None:
        if node == "a":
            sys.setprofile(walk.profile)
        runner = NodeRunner(
            fed,
            node,
            out=root / f"out-{node}",
            options=NodeOptions(approve="auto", poll_seconds=0.02),
            progress=lambda _line: None,
            gateway=gateway,
        )
        try:
            runner.run()
        except BaseException as error:  # reported below, with the node's name
            failures[node] = error
        finally:
            sys.setprofile(None)

    threads = [threading.Thread(target=run_node, args=(n,), daemon=True) for n in NODES]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=_TIMEOUT)
    finally:
        ticker.stop()
        session.store.close()
    if failures:
        raise RuntimeError(f"the round walk's session failed: {failures}")
    if any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"the round walk's session did not end within {_TIMEOUT:.0f} s")
    if not walk.path:
        raise RuntimeError("the traced node never entered run_model_round")
    return walk


def run(repeats: int = 1) -> dict[str, float]:
    """The walk's figures (one run: ``repeats`` is ignored, see the module docstring)."""
    del repeats
    with tempfile.TemporaryDirectory(prefix="zerosum-walk-") as folder:
        return walk_one_round(Path(folder)).figures()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.round_walk", description=__doc__)
    parser.add_argument("--path", action="store_true", help="also print the module path")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zerosum-walk-") as folder:
        walk = walk_one_round(Path(folder))
    if args.path:
        for module in walk.path:
            print(module)
    print(json.dumps(walk.figures(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
