"""One aggregation round of a real session: node processes, coordinator process, mutual TLS.

Everything runs on 127.0.0.1 as separate processes: a federation made by
``zerosum federation init`` in a temporary folder, the coordinator started as
``python -m zerosum.cli coordinator --federation F --state S --listen
127.0.0.1:0`` (a fresh state file, hence a fresh session, each time), and K
node processes (benchmarks/_session_worker.py), each a
:class:`~node.protocol.client.CoordinatorClient` that joins with an ephemeral X25519 key
signed by its Ed25519 identity key, verifies the roster and derives its
pairwise seeds before any timing starts.

**The round** (``round_seconds_k10_d1e6``). K = 10 nodes hold d = 10^6
float64 values each. The clock starts when the parent sends every node its
start line (a barrier: nothing of the round is done before) and stops when
the last node holds the round's aggregate and has checked it. In between
each node

1. encodes its values in fixed point (the federation's ``fixed_point_bits``)
   and adds its pairwise mask over the complete 10-node design
   (``noise.masks.pairwise_mask``: 9 keyed Gaussian streams of 10^6 draws),
   then its uniform self-mask (``noise.self_mask``), and seals its challenge
   contribution for each other node (``noise.aggregate_check``);
2. uploads the 8 MB payload in 1 MiB chunks (header with layout, digest,
   self-mask commitment and sealed contributions first); the coordinator adds
   each chunk into the round's running sum as it arrives, writes it to its
   state folder, checks size and digest and records the upload in SQLite;
3. takes part in the round's unmask step, as every node does every round
   (docs/design.md §4.6): polls ``GetResult`` (a long poll: the
   coordinator answers when something changed), opens the
   contributions sealed for it, expands the secret challenge ρ, seals and
   signs its blinded tags for every other survivor and sends them with its
   signature over the survivor set it is shown; once every survivor's
   signature is there it opens the tags sealed for it and answers with its
   self-mask seed; the coordinator subtracts each revealed self-mask and, on
   the last answer, writes and publishes the sum;
4. downloads the 8 MB aggregate (not hashed: the tags check it), checks every
   upload statement and that the survivors' blinded tags add up to the
   aggregate's tag (the aggregate check, §4.5).

The nodes report when they reach each step, and
``round_until_<phase>_seconds_k10_d1e6`` is, for the headline round, the time
until the last node got there (``masked``, ``uploaded``, ``asked``: saw the
unmask request, ``tagged``: had its sealed tags, ``attested``, ``signed``:
saw every signature, ``answered``, ``result``: held the aggregate), and
``plain_grpc_round_until_uploaded_seconds_k10_d1e6`` the same for the bare
twin's last acknowledged upload (the rest of its round is the download).
``round_cpu_seconds_coordinator_k10_d1e6`` and ``round_cpu_seconds_nodes_k10_d1e6``
are the CPU seconds (user + system, from /proc/<pid>/stat) the coordinator
process and the ten node processes together used during the headline round,
and ``plain_grpc_round_cpu_seconds_{server,nodes}_k10_d1e6`` the same for its
bare twin (the server runs in this process). On a machine with fewer cores
than processes the round is bound by CPU, so these say where its time goes:
the wall-clock ratio follows the ratio of the CPU totals.
``node_protection_cpu_seconds_d1e6`` is what steps 1, 3 and 4 add for the
self-mask and the aggregate check in one node (self-mask, ρ, two tags of 10^6
words; measured in this process, alone), and
``coordinator_self_mask_cpu_seconds_d1e6`` the coordinator's expansion of one
revealed self-mask.

**The protocol's floor** (``round_protocol_floor_cpu_seconds_k10_d1e6``).
The CPU the protocol's own computations take in one round of K = 10,
d = 10^6, beyond what the bare round does, measured here one at a time
(medians, thread CPU clock) and added up for the round: on the coordinator
K payload digests over an upload (BLAKE3, ``noise.layout.payload_digest``),
K self-mask expansions, one digest of the aggregate and 4K Ed25519
verifications (each upload header and attestation signed, and each sender's
one signature over the K − 1 sealed items in it);
on each node its ``node_protection`` work, the digest of its payload (the
aggregate it downloads is checked by the tags, not hashed), 4 signatures and
2(K − 1) verifications (the others' upload statements and attestations; a
sealed item's signature is checked only when the item does not open). Left
out, so the figure is a lower bound: writing the files, sealing and opening
the small messages, TLS, and everything the interpreter does around them.
``round_ratio_floor_vs_plain_grpc``
is (bare CPU + floor) / bare CPU with the bare round's CPU of this run
(server and nodes): on a machine where both rounds keep every core busy, as
here, the ratio ``round_ratio_vs_plain_grpc`` cannot fall below it without
dropping one of those checks.

A mask depends on the pairwise seeds, the round, the layout and the design,
never on data, so a node draws it as soon as it knows those — after the
roster, or after the previous round's result — while it computes its
statistics or waits for the round to open (``node.protocol.masking.MaskPrefetch``, as
``NodeRunner`` does). The headline round therefore adds a mask drawn ahead:
just before the start line every node is told to draw it, and the time all
10 processes take to do so side by side is ``mask_draw_seconds_k10_d1e6``.
Two other kinds of round are measured as well:
``round_seconds_k10_d1e6_masks_in_round`` draws the mask inside the timed
window, after the start line (what a node that cannot draw ahead would pay;
``round_masking_seconds_k10_d1e6`` is the time until the last node finished
step 1 there), and ``round_seconds_k10_d1e6_upload_only`` adds no pairwise mask
(the self-mask, the unmask step and the check remain: what the protocol, the
coordinator and the network cost).

Every node's aggregate is compared with Σ_k q(x_k) computed in the parent:
the masks must cancel bit for bit. A session has as many rounds as the
federation's round plan (``coordinator.config.SessionConfig.plan``: "moments"
and "scatter" under the pairwise construction). In every session the first
round is a drawn-ahead round and the second alternates between the two other
kinds, so the benchmark runs 2 · ``repeats`` + 1 sessions (the first is a
warm-up): ``repeats`` samples of each alternating kind, twice as many of the
headline.

**Baselines.** ``round_ratio_vs_flower_secagg_reference``: the round over
2.2 s, the time Flower's secure aggregation (SecAgg, Bonawitz et al. 2017,
ACM CCS; every node a neighbour of every other) took for the same K and d on
this class of machine: a fixed reference, not re-measured here
(``..._masks_in_round``: the same for the in-window round).
``round_ratio_vs_plain_grpc[_masks_in_round|_upload_only]``: in every
session, right before or after each round (alternating), the same node
processes run the same round — same masking, same bytes, same TLS
certificates — against a bare gRPC sum server (benchmarks/_plain_grpc.py, in
this process: raw-byte messages, no header, checksum, state or polling; a
download blocks until the sum is complete). Each figure is the median of the
per-session ratios session round / bare round, and
``plain_grpc_round_seconds_k10_d1e6[...]`` are the bare rounds' own medians.
Masking is CPU work in the node processes: with 10 of them on a machine with
few cores, drawing inside the window bounds the round from below whatever
the transport.

**Coordinator memory** (``coordinator_peak_rss_mb_k{5,20}_d1e6``). For K = 5
and K = 20 nodes (separate federations), a fresh coordinator process runs one
round of d = 10^6 values per node; once every node holds the aggregate, the
benchmark reads the coordinator's peak resident set size, VmHWM from
/proc/<pid>/status (exact, kept by the kernel), and stops it. Nodes upload
without masks here: masking happens in the node processes and would only
slow the run on a small machine. ``coordinator_rss_ratio_k20_vs_k5`` is the
ratio of the medians; the coordinator keeps one running sum per round, not
one vector per node, so it should stay well under 1.5.

Every wait is bounded (:data:`MEASUREMENT_SECONDS` per session), and every
process started here is stopped when the benchmark ends, whatever happens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from benchmarks._plain_grpc import PlainSumServer
from benchmarks._processes import Deadline, Fleet, coordinator_process
from benchmarks._session_worker import MASK_MODES, PLAIN_TENSOR, TENSOR, node_values
from coordinator.config import SessionConfig
from noise.aggregate_check import blinded_tags, challenge_vectors, tags
from noise.fixed_point import FixedPointCodec, wrapping_sum
from noise.layout import Layout, payload_digest
from noise.self_mask import self_mask
from proto.federation import RoundSpec, config_hash, dump_federation, load_federation

__all__ = ["FLOWER_SECAGG_REFERENCE_SECONDS", "MEASUREMENT_SECONDS", "run"]

FLOWER_SECAGG_REFERENCE_SECONDS = 2.2
MEASUREMENT_SECONDS = 120.0
ROUND_NODES = 10
MEMORY_NODES = (5, 20)
VALUES_PER_NODE = 10**6


BENCH_ROUNDS = ("first", "second")
# What a node reports of a session round (benchmarks/_session_worker.py), in order.
PHASES = ("masked", "uploaded", "asked", "attested", "signed", "tagged", "answered", "result")


def _make_federation(
    folder: Path,
    node_ids: Sequence[str],
    size: int = 0,
    *,
    round_names: Sequence[str] = BENCH_ROUNDS,
    deadline_seconds: float = MEASUREMENT_SECONDS,
) -> Path:
    """``zerosum federation init`` for ``node_ids`` with deadlines far beyond any round.

    The config declares rounds of its own (``round_names``; the benchmark's
    nodes run no model plan), each one tensor of ``size`` values: the
    coordinator takes every round's name and layout from the config.
    """
    from zerosum.cli import main as zerosum_main

    arguments = [
        "federation",
        "init",
        "--nodes",
        ",".join(node_ids),
        "--out",
        str(folder),
        "--coordinator",
        "127.0.0.1:50051",
        "--join-deadline",
        str(deadline_seconds),
        "--round-deadline",
        str(deadline_seconds),
        # The benchmark's nodes run no model plan; init still asks for named bounds.
        "--feature-range=-1,1",
        "--feature-names",
        "x",
        "--n-components",
        "1",
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        code = zerosum_main(arguments)
    if code != 0:
        raise RuntimeError(f"zerosum federation init failed with status {code}.")
    path = folder / "federation.toml"
    made = load_federation(path)
    layout = Layout.of({TENSOR: (size or VALUES_PER_NODE,)})
    rounds = tuple(RoundSpec(name, layout) for name in round_names)
    config = dataclasses.replace(made, plan=dataclasses.replace(made.plan, rounds=rounds))
    path.write_text(dump_federation(config), encoding="utf-8")
    return path


def _plan(federation: Path) -> tuple[str, ...]:
    config = load_federation(federation)
    return SessionConfig.from_federation(config, config_hash(config)).plan()


def _expected_sha256(federation: Path, n_nodes: int, size: int) -> str:
    codec = FixedPointCodec(load_federation(federation).fixed_point_bits)
    total = wrapping_sum(codec.encode(node_values(i, size)) for i in range(n_nodes))
    return hashlib.sha256(total.tobytes()).hexdigest()


def _node_ids(count: int) -> list[str]:
    return [f"tre{i:02d}" for i in range(count)]


def _cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far (/proc/<pid>/stat)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of proc(5))
    return total / os.sysconf("SC_CLK_TCK")


def _timed_round(
    fleet: Fleet,
    command: dict[str, Any],
    expected_sha256: str,
    deadline: Deadline,
    before: Callable[[], None] | None = None,
    *,
    server_pid: int | None = None,
) -> tuple[float, float, dict[str, float]]:
    """(seconds until every node held the aggregate, until every node had masked, phases).

    ``phases``: for each of :data:`PHASES` a node reports (session rounds), the
    seconds until the last node reached it; with ``server_pid`` also
    ``cpu_server`` and ``cpu_nodes``, the CPU seconds the server process and
    the node processes used during the round.
    """
    if before is not None:
        before()
    node_pids = [worker.pid for worker in fleet.workers]
    cpu_before = (_cpu_seconds([server_pid]), _cpu_seconds(node_pids)) if server_pid else None
    start = time.monotonic()
    answers = fleet.broadcast(command, deadline)
    if cpu_before is not None and server_pid is not None:
        cpu_server = _cpu_seconds([server_pid]) - cpu_before[0]
        cpu_nodes = _cpu_seconds(node_pids) - cpu_before[1]
    wrong = [
        worker.node_id
        for worker, answer in zip(fleet.workers, answers, strict=True)
        if answer["sha256"] != expected_sha256
    ]
    if wrong:
        raise RuntimeError(
            f"{command['transport']} round {command['round_index']}: the aggregate received by "
            f"{', '.join(wrong)} is not the sum of the nodes' values."
        )
    phases = {
        phase: max(a[phase] for a in answers) - start
        for phase in PHASES
        if all(phase in a for a in answers)
    }
    if cpu_before is not None:
        phases |= {"cpu_server": cpu_server, "cpu_nodes": cpu_nodes}
    return (
        max(a["done"] for a in answers) - start,
        max(a["masked"] for a in answers) - start,
        phases,
    )


def _prepare(fleet: Fleet, round_index: int, tensor: str, deadline: Deadline) -> float:
    """Every node draws its mask for (round, tensor) ahead; seconds until the last is done."""
    start = time.monotonic()
    answers = fleet.broadcast(
        {"cmd": "prepare", "round_index": round_index, "tensor": tensor}, deadline
    )
    return float(max(a["drawn"] for a in answers)) - start


def _session_kinds(session: int) -> tuple[str, str]:
    """The mask mode of round 0 and round 1 of a session (see the module docstring)."""
    return ("ahead", "in_round" if session % 2 else "none")


def _round_session(
    fleet: Fleet,
    server: PlainSumServer,
    *,
    federation: Path,
    plan: tuple[str, ...],
    expected: str,
    state: Path,
    session: int,
) -> dict[str, float]:
    """One session: two rounds (see :func:`_session_kinds`), each with its bare-gRPC twin."""
    deadline = Deadline(MEASUREMENT_SECONDS, f"session {session} of the round benchmark")

    def reset() -> None:
        server.reset(ROUND_NODES, VALUES_PER_NODE)

    figures: dict[str, float] = {}
    with coordinator_process(federation, state, deadline) as coordinator:
        fleet.broadcast({"cmd": "join", "address": coordinator.address}, deadline)
        for round_index, (round_name, kind) in enumerate(
            zip(plan[:2], _session_kinds(session), strict=True)
        ):
            ours = {
                "cmd": "round",
                "transport": "session",
                "round_index": round_index,
                "round_name": round_name,
                "mask": kind,
            }
            # Alternate which of the pair goes first, so neither always meets
            # the warmer (or the busier) machine.
            order = ("session", "plain")
            if (session // 2 + round_index) % 2:
                order = ("plain", "session")
            for transport in order:
                command = {**ours, "transport": transport}
                if transport == "session":
                    if kind == "ahead":
                        figures["draw"] = _prepare(fleet, round_index, TENSOR, deadline)
                    figures[kind], figures["masking_" + kind], phases = _timed_round(
                        fleet, command, expected, deadline, server_pid=coordinator.pid
                    )
                    if kind == "ahead":
                        figures |= {"phase_" + name: value for name, value in phases.items()}
                else:
                    if kind == "ahead":
                        _prepare(fleet, round_index, PLAIN_TENSOR, deadline)
                    figures["plain_" + kind], _, phases = _timed_round(
                        fleet, command, expected, deadline, reset, server_pid=os.getpid()
                    )
                    if kind == "ahead":
                        figures |= {
                            "plain_" + k: v
                            for k, v in phases.items()
                            if "cpu" in k or k == "uploaded"
                        }
        if len(plan) == 2:
            coordinator.finish(deadline)
    return figures


def _round_figures(work: Path, repeats: int) -> dict[str, float]:
    node_ids = _node_ids(ROUND_NODES)
    federation = _make_federation(work / "k10", node_ids)
    plan = _plan(federation)
    expected = _expected_sha256(federation, ROUND_NODES, VALUES_PER_NODE)
    tls = federation.parent / "coordinator"
    samples: dict[str, list[float]] = {}
    with contextlib.ExitStack() as running:
        server = PlainSumServer(
            certificate=(tls / "server.pem").read_bytes(),
            private_key=(tls / "server.key").read_bytes(),
            ca_certificate=load_federation(federation).ca_certificate_path.read_bytes(),
            max_workers=2 * ROUND_NODES + 4,
            wait_seconds=MEASUREMENT_SECONDS,
        )
        running.callback(server.stop)
        fleet = running.enter_context(
            Fleet(federation, node_ids, VALUES_PER_NODE, federation.parent)
        )
        setup = Deadline(MEASUREMENT_SECONDS, "starting the node processes")
        fleet.wait_ready(setup)
        fleet.broadcast({"cmd": "plain", "address": server.address}, setup)
        # Session 0 warms up; then 2·repeats sessions, so that each of the
        # alternating second rounds ("in_round", "none") gets ``repeats`` samples.
        for session in range(2 * repeats + 1):
            state = work / f"state-k10-{session}.sqlite"
            figures = _round_session(
                fleet,
                server,
                federation=federation,
                plan=plan,
                expected=expected,
                state=state,
                session=session,
            )
            if session == 0:
                continue  # warm-up
            for kind in MASK_MODES:
                if kind in figures:
                    figures["ratio_" + kind] = figures[kind] / figures["plain_" + kind]
            for key, value in figures.items():
                samples.setdefault(key, []).append(value)
    median = {key: statistics.median(values) for key, values in samples.items()}
    return {
        "round_seconds_k10_d1e6": median["ahead"],
        "round_seconds_k10_d1e6_masks_in_round": median["in_round"],
        "round_seconds_k10_d1e6_upload_only": median["none"],
        "mask_draw_seconds_k10_d1e6": median["draw"],
        "round_masking_seconds_k10_d1e6": median["masking_in_round"],
        "round_ratio_vs_flower_secagg_reference": median["ahead"] / FLOWER_SECAGG_REFERENCE_SECONDS,
        "round_ratio_vs_flower_secagg_reference_masks_in_round": median["in_round"]
        / FLOWER_SECAGG_REFERENCE_SECONDS,
        "round_ratio_vs_plain_grpc": median["ratio_ahead"],
        "round_ratio_vs_plain_grpc_masks_in_round": median["ratio_in_round"],
        "round_ratio_vs_plain_grpc_upload_only": median["ratio_none"],
        "plain_grpc_round_seconds_k10_d1e6": median["plain_ahead"],
        "plain_grpc_round_seconds_k10_d1e6_masks_in_round": median["plain_in_round"],
        "plain_grpc_round_seconds_k10_d1e6_upload_only": median["plain_none"],
        "round_cpu_seconds_coordinator_k10_d1e6": median["phase_cpu_server"],
        "round_cpu_seconds_nodes_k10_d1e6": median["phase_cpu_nodes"],
        "plain_grpc_round_cpu_seconds_server_k10_d1e6": median["plain_cpu_server"],
        "plain_grpc_round_cpu_seconds_nodes_k10_d1e6": median["plain_cpu_nodes"],
        "plain_grpc_round_until_uploaded_seconds_k10_d1e6": median["plain_uploaded"],
    } | {
        f"round_until_{phase}_seconds_k10_d1e6": median["phase_" + phase]
        for phase in PHASES
        if "phase_" + phase in median
    }


def _median_seconds(
    work: Callable[[], object],
    repeats: int,
    *,
    clock: Callable[[], float] = time.perf_counter,
    calls: int = 1,
) -> float:
    """Median seconds of one call of ``work`` on ``clock``, each sample over ``calls`` calls."""
    times = []
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            work()
        times.append((clock() - start) / calls)
    return statistics.median(times)


def _node_protection(words: np.ndarray[Any, Any]) -> Callable[[], None]:
    """One node's self-mask, ρ and two tags of ``words`` (its own and the aggregate's)."""
    size = words.shape[0]
    layout = Layout.of({TENSOR: (size,)})
    peers = {f"tre{i:02d}": bytes([i]) * 32 for i in range(1, ROUND_NODES)}
    key = bytes(range(32))

    def node_side() -> None:
        self_mask(key, layout, round_index=0)
        rho = challenge_vectors(key, size, round_index=0)
        blinded_tags(tags(words, rho), "tre00", ["tre00", *peers], peers, round_index=0)
        tags(words, rho)  # the check of the aggregate: one more tag of a vector this size

    return node_side


def _protection_figures(repeats: int) -> dict[str, float]:
    """CPU of the self-mask and the aggregate check at d = 10^6, in this process, one at a time.

    What one node and the coordinator compute per round for them, without the
    sharing of two cores by eleven processes that the round above has.
    """
    layout = Layout.of({TENSOR: (VALUES_PER_NODE,)})
    words = node_values(0, VALUES_PER_NODE).view(np.uint64)
    key = bytes(range(32))
    node = _median_seconds(_node_protection(words), repeats)
    coordinator = _median_seconds(lambda: self_mask(key, layout, round_index=0), repeats)
    return {
        "node_protection_cpu_seconds_d1e6": node,
        "coordinator_self_mask_cpu_seconds_d1e6": coordinator,
        "round_protocol_floor_cpu_seconds_k10_d1e6": _protocol_floor(words, repeats),
    }


def _protocol_floor(words: np.ndarray[Any, Any], repeats: int) -> float:
    """CPU seconds of the protocol's own computations in one round (module docstring)."""
    k = ROUND_NODES
    layout = Layout.of({TENSOR: (words.shape[0],)})
    key = bytes(range(32))
    signer = Ed25519PrivateKey.generate()
    public = signer.public_key()
    message = bytes(200)  # a transcript message is a few hundred bytes
    signature = signer.sign(message)
    cpu = time.thread_time
    digest = _median_seconds(lambda: payload_digest(words), repeats, clock=cpu)
    expansion = _median_seconds(lambda: self_mask(key, layout, round_index=0), repeats, clock=cpu)
    sign = _median_seconds(lambda: signer.sign(message), repeats, clock=cpu, calls=200)
    verify = _median_seconds(
        lambda: public.verify(signature, message), repeats, clock=cpu, calls=200
    )
    protection = _median_seconds(_node_protection(words), repeats, clock=cpu)
    coordinator = k * digest + k * expansion + digest + 4 * k * verify
    node = protection + digest + 4 * sign + 2 * (k - 1) * verify
    return coordinator + k * node


def _peak_rss_mb(work: Path, n_nodes: int, repeats: int) -> float:
    node_ids = _node_ids(n_nodes)
    federation = _make_federation(work / f"k{n_nodes}", node_ids)
    command = {
        "cmd": "round",
        "transport": "session",
        "round_index": 0,
        "round_name": _plan(federation)[0],
        "mask": "none",
    }
    expected = _expected_sha256(federation, n_nodes, VALUES_PER_NODE)
    peaks: list[float] = []
    with Fleet(federation, node_ids, VALUES_PER_NODE, federation.parent) as fleet:
        fleet.wait_ready(Deadline(MEASUREMENT_SECONDS, f"starting {n_nodes} node processes"))
        for session in range(repeats):
            deadline = Deadline(MEASUREMENT_SECONDS, f"memory run {session} with K = {n_nodes}")
            state = work / f"state-k{n_nodes}-{session}.sqlite"
            with coordinator_process(federation, state, deadline) as coordinator:
                fleet.broadcast({"cmd": "join", "address": coordinator.address}, deadline)
                _timed_round(fleet, command, expected, deadline)
                peaks.append(coordinator.peak_rss_mb())
    return statistics.median(peaks)


def run(repeats: int) -> dict[str, float]:
    """Measure the figures of the module docstring; medians over ``repeats`` runs each."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1; got {repeats}.")
    if not Path("/proc/self/status").exists():
        raise RuntimeError("the session benchmark reads /proc/<pid>/status and needs Linux.")
    with tempfile.TemporaryDirectory(prefix="zerosum-session-bench-") as folder:
        work = Path(folder)
        figures = _round_figures(work, repeats) | _protection_figures(repeats)
        bare = (
            figures["plain_grpc_round_cpu_seconds_server_k10_d1e6"]
            + figures["plain_grpc_round_cpu_seconds_nodes_k10_d1e6"]
        )
        floor = figures["round_protocol_floor_cpu_seconds_k10_d1e6"]
        figures["round_ratio_floor_vs_plain_grpc"] = (bare + floor) / bare
        small, large = (_peak_rss_mb(work, k, repeats) for k in MEMORY_NODES)
    figures["coordinator_peak_rss_mb_k5_d1e6"] = small
    figures["coordinator_peak_rss_mb_k20_d1e6"] = large
    figures["coordinator_rss_ratio_k20_vs_k5"] = large / small
    return figures


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 5), indent=2))
