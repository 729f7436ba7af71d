"""`zerosum federation init`: files, modes, certificates, keys and a real mTLS handshake."""

from __future__ import annotations

import argparse
import csv
import ipaddress
import math
import stat
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.x509 import DNSName, IPAddress
from cryptography.x509.verification import PolicyBuilder, Store

from node.plans.deltab.settings import DeltabSettings
from noise.keys import IdentityKey
from noise.layout import Layout, payload_digest
from noise.stream import stream_fingerprint
from proto import tls
from proto.chunks import PayloadAssembler, payload_chunks, payload_header
from proto.federation import config_hash, load_federation
from proto.zerosum.v1 import session_pb2 as pb
from proto.zerosum.v1 import session_pb2_grpc as pb_grpc
from zerosum.commands import federation as command

FAST = [
    "--n-features",
    "6",
    "--n-components",
    "3",
    "--cohort-sizes",
    "130,110,150",
    "--holdout-size",
    "40",
]


# Bounds for a federation of real cohorts (four named features), which init requires.
REAL = ["--feature-range=-5,5", "--feature-names", "a1,a2,a3,a4", "--n-components", "2"]


def init(*argv: str, real: bool = True) -> int:
    """``zerosum federation init``; with REAL bounds unless the call brings its own (or ``real``
    is False)."""
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    own = {"--synthetic", "--feature-bounds", "--feature-range", "--plan"}
    given = [a for a in argv if a.split("=")[0] in own]
    extra = REAL if real and not given else []
    return command.run(parser.parse_args(["init", *argv, *extra]))


@pytest.fixture(scope="module")
def federation_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fed") / "fed"
    status = init(
        "--nodes", "north,east,south", "--out", str(out), "--synthetic", "--seed", "11", *FAST
    )
    assert status == 0
    return out


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_writes_every_file_with_secret_modes(federation_dir: Path) -> None:
    secret = ["ca/ca.key", "coordinator/server.key"]
    public = ["federation.toml", "ca/ca.pem", "coordinator/server.pem", "holdout.csv"]
    for node_id in ("north", "east", "south"):
        secret += [f"nodes/{node_id}/identity.pem", f"nodes/{node_id}/client.key"]
        public += [f"nodes/{node_id}/client.pem", f"nodes/{node_id}/data.csv"]
    for name in secret:
        assert mode(federation_dir / name) == 0o600, name
    for name in public:
        assert (federation_dir / name).is_file(), name
    assert mode(federation_dir / "ca") == 0o700
    assert mode(federation_dir / "nodes" / "east") == 0o700


def test_config_pins_the_identity_keys_on_disk(federation_dir: Path) -> None:
    config = load_federation(federation_dir / "federation.toml")
    assert config.node_ids == ("east", "north", "south")
    for node_id, public in config.identity_keys.items():
        identity = IdentityKey.read_pem(federation_dir / "nodes" / node_id / "identity.pem")
        assert identity.public_bytes() == public
    assert config.ca_certificate_path == federation_dir.resolve() / "ca" / "ca.pem"
    assert config.ca_certificate_path.is_file()
    # Three nodes: the default collusion threshold is min(1, K - 2) = 1.
    assert config.privacy.collusion_threshold == 1
    assert DeltabSettings.from_tables(config.plan.settings).n_features == 6
    # Complete data: the brain-age fit is one round of uncentred sums.
    assert config.plan.round_names == ("sums",)
    # The installation's reference stream is pinned, so mismatched nodes refuse to start.
    assert config.stream_check == stream_fingerprint()


def test_certificates_chain_to_the_ca_with_the_right_names(federation_dir: Path) -> None:
    ca = x509.load_pem_x509_certificate((federation_dir / "ca" / "ca.pem").read_bytes())
    builder = PolicyBuilder().store(Store([ca]))
    server = x509.load_pem_x509_certificate(
        (federation_dir / "coordinator" / "server.pem").read_bytes()
    )
    builder.build_server_verifier(DNSName("localhost")).verify(server, [])
    builder.build_server_verifier(IPAddress(ipaddress.ip_address("127.0.0.1"))).verify(server, [])
    for node_id in ("north", "east", "south"):
        pem = (federation_dir / "nodes" / node_id / "client.pem").read_bytes()
        client = x509.load_pem_x509_certificate(pem)
        verified = builder.build_client_verifier().verify(client, [])
        assert verified.subjects == [x509.UniformResourceIdentifier(f"zerosum:node/{node_id}")]
        assert tls.node_id_from_certificate(pem) == node_id
        # A node certificate is no server certificate.
        with pytest.raises(x509.verification.VerificationError):
            builder.build_server_verifier(DNSName("localhost")).verify(client, [])


def test_synthetic_cohorts_differ_and_respect_the_declared_bounds(federation_dir: Path) -> None:
    config = load_federation(federation_dir / "federation.toml")
    clipping = DeltabSettings.from_tables(config.plan.settings).clipping
    low, high = np.array(clipping.feature_low), np.array(clipping.feature_high)
    sizes = {}
    for node_id in ("north", "east", "south"):
        path = federation_dir / "nodes" / node_id / "data.csv"
        with path.open() as handle:
            rows = list(csv.reader(handle))
        assert rows[0][:2] == ["id", "age"]
        values = np.array([[float(v) for v in row[1:]] for row in rows[1:]])
        sizes[node_id] = len(values)
        ages = values[:, 0]
        assert clipping.age_low <= ages.min() and ages.max() <= clipping.age_high
        assert np.all((values[:, 1:] >= low) & (values[:, 1:] <= high))
    assert sizes == {"north": 130, "east": 110, "south": 150}
    with (federation_dir / "holdout.csv").open() as handle:
        assert sum(1 for _ in handle) == 41


def test_refuses_to_overwrite_without_force(
    federation_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (federation_dir / "federation.toml").read_bytes()
    capsys.readouterr()
    assert init("--nodes", "north,east,south", "--out", str(federation_dir)) == 2
    error = capsys.readouterr().err.strip()
    assert "federation.toml already exists; pass --force" in error
    assert error.count("\n") == 0
    assert (federation_dir / "federation.toml").read_bytes() == before


def test_force_replaces_everything(tmp_path: Path) -> None:
    out = tmp_path / "fed"
    assert init("--nodes", "a,b", "--out", str(out)) == 0
    first = load_federation(out / "federation.toml")
    (out / "nodes" / "a" / "client.key").chmod(0o644)
    assert init("--nodes", "a,b", "--out", str(out), "--force", "--epsilon", "0.5") == 0
    second = load_federation(out / "federation.toml")
    assert second.privacy.epsilon == 0.5
    assert config_hash(first) != config_hash(second)
    assert mode(out / "nodes" / "a" / "client.key") == 0o600
    # Two nodes: no coalition can be tolerated, so the default threshold is 0.
    assert second.privacy.collusion_threshold == 0
    key = IdentityKey.read_pem(out / "nodes" / "a" / "identity.pem")
    assert key.public_bytes() == second.identity_keys["a"]


@pytest.mark.parametrize(
    ("nodes", "extra", "message"),
    [
        ("a", [], "at least 2 nodes"),
        ("a,a,b", [], "unique; a repeated"),
        ("a,b c", [], "node id 'b c' is not allowed"),
        ("a,..", [], "node id '..' is not allowed"),
        ("a,", [], "node id '' is not allowed"),
        ("a,b", ["--epsilon", "-1"], "privacy.epsilon = -1.0: must be greater than 0"),
        ("a,b", ["--collusion-threshold", "1"], "privacy.collusion_threshold = 1"),
        ("a,b", ["--coordinator", "nohost"], "coordinator_address = 'nohost'"),
        ("a,b", ["--age-range", "80"], "--age-range '80' must be two numbers"),
        ("a,b", ["--synthetic", "--age-range", "1,2"], "--synthetic sets its own"),
        ("a,b", ["--synthetic", "--cohort-sizes", "50,200"], "node 'a' would get 50 subjects"),
        ("a,b", ["--synthetic", "--cohort-sizes", "200"], "lists 1 sizes for 2 nodes"),
        ("a,b", ["--synthetic", "--cohort-sizes", "x,y"], "must be whole numbers"),
        ("a,b", ["--model-kind", "linear"], "model.kind = 'linear'"),
        ("a,b", ["--synthetic", "--holdout-size", "-1"], "holdout_size must be non-negative"),
    ],
)
def test_bad_input_writes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    nodes: str,
    extra: list[str],
    message: str,
) -> None:
    out = tmp_path / "fed"
    assert init("--nodes", nodes, "--out", str(out), *extra) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


# ----------------------------------------------------------------- mutual TLS


class _Echo(pb_grpc.CoordinatorServicer):
    """Answers GetStatus with the authenticated node id; reassembles uploads."""

    def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.SessionStatus:
        node_id = tls.node_id_from_auth_context(context.auth_context())
        return pb.SessionStatus(session_id=request.session_id, joined_node_ids=[node_id])

    def UploadEgress(
        self, request_iterator: Iterator[pb.UploadChunk], context: grpc.ServicerContext
    ) -> pb.UploadReceipt:
        first = next(request_iterator)
        assembler = PayloadAssembler(first.header.payload)
        for chunk in request_iterator:
            assembler.add(chunk.data)
        data = assembler.finish().astype("<u8").tobytes()
        return pb.UploadReceipt(
            node_id=tls.node_id_from_auth_context(context.auth_context()),
            digest=payload_digest(np.frombuffer(data, dtype="<u8")),
            received_bytes=len(data),
        )


@pytest.fixture(scope="module")
def mtls_server(federation_dir: Path) -> Iterator[int]:
    folder = federation_dir / "coordinator"
    credentials = grpc.ssl_server_credentials(
        [((folder / "server.key").read_bytes(), (folder / "server.pem").read_bytes())],
        root_certificates=(federation_dir / "ca" / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_CoordinatorServicer_to_server(_Echo(), server)  # type: ignore[abstract]
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    yield port
    server.stop(grace=None)


def _channel(
    federation_dir: Path, target: str, node_id: str | None, ca_dir: Path | None = None
) -> grpc.Channel:
    ca = (federation_dir / "ca" / "ca.pem").read_bytes()
    if node_id is None:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
    else:
        folder = (ca_dir or federation_dir) / "nodes" / node_id
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(folder / "client.key").read_bytes(),
            certificate_chain=(folder / "client.pem").read_bytes(),
        )
    return grpc.secure_channel(target, credentials)


@pytest.mark.integration
@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_server_accepts_a_node_certificate(
    federation_dir: Path, mtls_server: int, host: str
) -> None:
    with _channel(federation_dir, f"{host}:{mtls_server}", "east") as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        status = stub.GetStatus(pb.GetStatusRequest(session_id="s1"), timeout=10)
    assert list(status.joined_node_ids) == ["east"]


def _assert_unavailable(channel: grpc.Channel) -> None:
    """The server refuses the channel's TLS handshake: a status call is UNAVAILABLE."""
    with pytest.raises(grpc.RpcError) as caught:
        pb_grpc.CoordinatorStub(channel).GetStatus(pb.GetStatusRequest(session_id="s1"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.integration
def test_server_rejects_a_client_without_certificate(
    federation_dir: Path, mtls_server: int
) -> None:
    with _channel(federation_dir, f"localhost:{mtls_server}", None) as channel:
        _assert_unavailable(channel)


@pytest.mark.integration
def test_server_rejects_a_certificate_from_another_ca(
    federation_dir: Path, mtls_server: int, tmp_path: Path
) -> None:
    stranger = tmp_path / "other"
    assert init("--nodes", "east,west", "--out", str(stranger)) == 0
    with _channel(federation_dir, f"localhost:{mtls_server}", "east", ca_dir=stranger) as channel:
        _assert_unavailable(channel)


@pytest.mark.integration
def test_a_20_mb_upload_streams_under_the_default_message_limit(
    federation_dir: Path, mtls_server: int
) -> None:
    rng = np.random.default_rng(5)
    tensors = {
        "sums": rng.integers(0, 2**64, size=(1600, 1600), dtype=np.uint64),
        "n": np.array(412, dtype=np.uint64),
    }
    layout = Layout.of_tensors(tensors)
    words = layout.build(lambda slot: tensors[slot.name])
    data = words.astype("<u8").tobytes()
    assert len(data) > 20_000_000
    header = pb.UploadHeader(
        session_id="s1",
        round_index=1,
        round_name="sums",
        node_id="south",
        payload=payload_header(words, layout, fixed_point_bits=32),
    )

    def messages() -> Iterator[pb.UploadChunk]:
        yield pb.UploadChunk(header=header)
        for chunk in payload_chunks(data):
            yield pb.UploadChunk(data=chunk)

    with _channel(federation_dir, f"localhost:{mtls_server}", "south") as channel:
        receipt = pb_grpc.CoordinatorStub(channel).UploadEgress(messages(), timeout=60)
    assert receipt.node_id == "south"
    assert receipt.received_bytes == len(data)
    assert receipt.digest == payload_digest(np.frombuffer(data, dtype="<u8"))


@pytest.mark.parametrize(
    ("nodes", "extra", "expected"),
    [
        ("a,b,c", [], (3, "with 3 nodes no node may drop out")),
        ("a,b,c,d", [], (3, "with 4 nodes at most 1 node may drop out of a round")),
        ("a,b,c,d,e", ["--collusion-threshold", "2"], (4, "at most 1 node may drop out")),
        ("a,b,c,d", ["--min-nodes", "4"], (4, "with 4 nodes no node may drop out")),
        ("a,b,c", ["--collusion-threshold", "0"], (2, "at most 1 node may drop out")),
        ("a,b,c,d,e,f", ["--graph", "harary", "--degree", "4"], (4, "at most 2 nodes")),
        ("a,b", [], (2, "with 2 nodes no node may drop out")),
    ],
)
def test_init_sets_min_nodes_so_no_dropout_leaves_a_class_unbounded(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    nodes: str,
    extra: list[str],
    expected: tuple[int, str],
) -> None:
    min_nodes, says = expected
    assert init("--nodes", nodes, "--out", str(tmp_path / "fed"), *extra) == 0
    out = capsys.readouterr().out
    config = load_federation(tmp_path / "fed" / "federation.toml")
    assert config.min_nodes == min_nodes
    line = [x for x in out.splitlines() if x.startswith(f"min_nodes = {min_nodes}:")]
    assert len(line) == 1 and "no dropout leaves an observer class without noise" in line[0]
    assert says in line[0]


def test_init_refuses_a_min_nodes_that_lets_a_dropout_unbound_a_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The old default: 3 nodes, T = 1, min_nodes = 2. A survivor of one dropout
    # would reveal its pair term with it, and one colluder holds the other.
    assert init("--nodes", "a,b,c", "--out", str(tmp_path / "fed"), "--min-nodes", "2") == 2
    err = capsys.readouterr().err
    assert "--min-nodes 2 is below 3" in err and "collusion threshold 1" in err
    assert not (tmp_path / "fed" / "federation.toml").exists()


def test_a_budget_below_one_session_is_refused_naming_the_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from noise.accounting import gaussian_epsilon, gaussian_mu

    out = tmp_path / "fed"
    # With the default rerun cap (2) each of the two plan rounds (means, sums)
    # may be released 3 times: 6 releases that each meet (1, 1e-6) against one
    # colluding node are charged.
    worst = gaussian_epsilon(gaussian_mu(1.0, 1e-6) * 6**0.5, 1e-6)
    assert (
        init(
            "--nodes",
            "a,b,c,d",
            "--out",
            str(out),
            "--nan-policy",
            "mean",
            "--epsilon-budget",
            "2.5",
        )
        == 2
    )
    assert (
        "--epsilon-budget 2.5 is below the cost of one session against an outsider with 1 "
        f"colluding node (colluders:1): ε = {worst:.4g} over 6 releases at δ = 1e-06"
    ) in capsys.readouterr().err
    # Without reruns (--max-reruns 0): two releases.
    one_session = gaussian_epsilon(gaussian_mu(1.0, 1e-6) * 2**0.5, 1e-6)
    common = ["--nodes", "a,b,c,d", "--out", str(out), "--nan-policy", "mean", "--max-reruns", "0"]
    assert init(*common, "--epsilon-budget", "1.4") == 2
    err = capsys.readouterr().err
    assert (
        "--epsilon-budget 1.4 is below the cost of one session against an outsider with 1 "
        f"colluding node (colluders:1): ε = {one_session:.4g} over 2 releases at δ = 1e-06"
    ) in err
    assert f"pass --epsilon-budget {math.ceil(one_session * 100) / 100:g} or more" in err
    assert not out.exists()
    # With residual noise the coordinator's classes are held to the budget too.
    assert init(*common, "--epsilon-budget", "1.5", "--residual-dp") == 2
    assert "against the coordinator with 1 colluding node (coalition:1)" in capsys.readouterr().err
    # Without it they are unbounded by design and not checked: one session's cost is enough.
    assert init(*common, "--epsilon-budget", repr(one_session)) == 0
    config = load_federation(out / "federation.toml")
    assert config.privacy.epsilon_budget == one_session


# ----------------------------------------------------------------- output checker keys


def test_each_node_gets_an_output_checker_key_apart_from_the_node(federation_dir: Path) -> None:
    from zerosum.pki import read_ed25519_public_key

    config = load_federation(federation_dir / "federation.toml")
    for node_id in ("north", "east", "south"):
        folder = federation_dir / "checkers" / node_id
        checker = IdentityKey.read_pem(folder / "checker.pem")
        assert mode(folder / "checker.pem") == 0o600
        assert mode(folder) == 0o700
        assert config.checker_keys[node_id] == (checker.public_bytes(),)
        assert read_ed25519_public_key(folder / "checker.pub") == checker.public_bytes()
        # The private key is nowhere in the node's folder or the config.
        assert not (federation_dir / "nodes" / node_id / "checker.pem").exists()
    text = (federation_dir / "federation.toml").read_text()
    assert "PRIVATE" not in text


def test_a_given_checker_public_key_is_pinned_and_none_is_generated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerosum.pki import ed25519_public_pem

    mine = IdentityKey.from_private_bytes(bytes([5]) * 32)
    second = IdentityKey.from_private_bytes(bytes([6]) * 32)
    pem = tmp_path / "a.pub"
    pem.write_bytes(ed25519_public_pem(mine.public_bytes()))
    hexed = tmp_path / "a2.pub"
    hexed.write_text(second.public_bytes().hex() + "\n")
    out = tmp_path / "fed"
    assert (
        init(
            "--nodes", "a,b", "--out", str(out),
            "--checker-key", f"a={pem}", "--checker-key", f"a={hexed}",
        )
        == 0
    )  # fmt: skip
    config = load_federation(out / "federation.toml")
    assert config.checker_keys["a"] == (mine.public_bytes(), second.public_bytes())
    assert not (out / "checkers" / "a").exists()
    assert len(config.checker_keys["b"]) == 1 and (out / "checkers" / "b" / "checker.pem").exists()
    assert "the key given with --checker-key" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("a", "must be NODE=PUBFILE"),
        ("z=FILE", "names node 'z', which is not in --nodes"),
        ("a=MISSING", "cannot read"),
        ("a=GARBAGE", "holds no Ed25519 public key"),
    ],
)
def test_a_bad_checker_key_option_is_named_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, words: str
) -> None:
    garbage = tmp_path / "garbage.pub"
    garbage.write_text("not a key")
    option = option.replace("GARBAGE", str(garbage)).replace("MISSING", str(tmp_path / "none"))
    out = tmp_path / "fed"
    assert init("--nodes", "a,b", "--out", str(out), "--checker-key", option) == 2
    assert words in capsys.readouterr().err
    assert not out.exists()


# ----------------------------------------------------------- per-feature bounds


def _bounds_file(folder: Path, text: str) -> Path:
    path = folder / "bounds.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_per_feature_bounds_from_a_file_reach_the_config(tmp_path: Path) -> None:
    bounds = _bounds_file(
        tmp_path, "feature,low,high\ncortical_thickness,1.5,4.5\nventricles,0,80\n\nwm_hypo,-3,3\n"
    )
    out = tmp_path / "fed"
    argv = ["--nodes", "a,b", "--out", str(out), "--n-features", "3", "--n-components", "2"]
    assert init(*argv, "--feature-bounds", str(bounds), "--age-range", "45,80") == 0
    settings = DeltabSettings.from_tables(load_federation(out / "federation.toml").plan.settings)
    assert settings.clipping.feature_low == (1.5, 0.0, -3.0)
    assert settings.clipping.feature_high == (4.5, 80.0, 3.0)
    assert (settings.clipping.age_low, settings.clipping.age_high) == (45.0, 80.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("low,high\n1,2\n1,2\n", "the first line must be the header feature,low,high"),
        ("", "got 'an empty file'"),
        ("feature,low,high\nx,1,2\n", "1 feature row(s) for a model of --n-features 2"),
        ("feature,low,high\nx,1,2\ny,one,2\n", "line 3 ('y'): low 'one' is not a number"),
        ("feature,low,high\nx,1,2\ny,3,3\n", "line 3 ('y'): high 3 must exceed low 3"),
        ("feature,low,high\nx,1,inf\ny,0,1\n", "line 2 ('x'): high must be finite"),
        ("feature,low,high\nx,1,2,3\ny,0,1\n", "line 2: 3 fields feature,low,high; got 4"),
    ],
)
def test_a_bad_bounds_file_is_named_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    bounds = _bounds_file(tmp_path, text)
    out = tmp_path / "fed"
    argv = ["--nodes", "a,b", "--out", str(out), "--n-features", "2", "--n-components", "1"]
    assert init(*argv, "--feature-bounds", str(bounds)) == 2
    err = capsys.readouterr().err
    assert f"--feature-bounds {bounds}" in err and message in err, err
    assert not out.exists()


def test_bounds_file_and_range_or_synthetic_exclude_each_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bounds = _bounds_file(tmp_path, "feature,low,high\nx,0,1\n")
    out = tmp_path / "fed"
    argv = ["--nodes", "a,b", "--out", str(out), "--feature-bounds", str(bounds)]
    assert init(*argv, "--feature-range=-1,1") == 2
    assert "not both" in capsys.readouterr().err
    assert init(*argv, "--synthetic") == 2
    assert "--synthetic sets its own clipping bounds" in capsys.readouterr().err
    assert init(*argv[:-1], str(tmp_path / "missing.csv")) == 2
    assert "cannot read it" in capsys.readouterr().err
    assert not out.exists()
