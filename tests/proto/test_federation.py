"""Federation config: TOML round trip, canonical hash, and errors that name their field."""

from __future__ import annotations

import base64
import dataclasses
import json
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bounded.files import LocalFileError
from noise.layout import Layout
from proto.federation import (
    CONFIG_FORMAT,
    MISSING,
    ConfigError,
    FederationConfig,
    NodeEntry,
    NoiseDesignSpec,
    PrivacyPolicy,
    RoundSpec,
    SessionTimings,
    canonical_encoding,
    config_hash,
    dump_federation,
    load_federation,
    parse_federation,
)
from tests.support.sample_config import KEYS, edited, make_config, make_plan
from tests.support.strategies import node_id_lists

VARIANTS: dict[str, Callable[[], FederationConfig]] = {
    "defaults": make_config,
    "cape+residual": lambda: make_config(
        privacy=PrivacyPolicy(
            epsilon=0.5,
            delta=1e-7,
            residual_dp=True,
            collusion_threshold=2,
            noise_design=NoiseDesignSpec(construction="cape"),
        )
    ),
    "harary+target": lambda: make_config(
        privacy=PrivacyPolicy(
            noise_design=NoiseDesignSpec(graph="harary", degree=2, target_std=0.25)
        ),
        plan=make_plan(settings={"nested": {"inner": {"x": [1, 2.5, "three", True]}}}),
        session=SessionTimings(5, 7.5),
        coordinator_address="[::1]:9000",
        fixed_point_bits=24,
        min_cohort_size=200,
        min_nodes=3,
    ),
    "stream check": lambda: make_config(stream_check="0123456789abcdef" * 4),
    "checker keys": lambda: make_config(
        nodes=(
            NodeEntry("alpha", KEYS["alpha"], (b"\x21" * 32, b"\x22" * 32)),
            *(NodeEntry(n, k) for n, k in KEYS.items() if n != "alpha"),
        )
    ),
    "many features": lambda: make_config(
        plan=make_plan(
            settings={"clipping": {"feature_low": [float(-i) for i in range(1, 21)]}},
            rounds=(RoundSpec("one", Layout.of({f"t{i}": (i, 2) for i in range(12)})),),
        ),
    ),
}


# ----------------------------------------------------------------- round trip


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_dump_then_parse_gives_the_same_config(name: str) -> None:
    config = VARIANTS[name]()
    text = dump_federation(config)
    tomllib.loads(text)  # valid TOML for any reader, not only ours
    again = parse_federation(text)
    assert again == config
    assert dump_federation(again) == text
    assert config_hash(again) == config_hash(config)


def test_load_resolves_paths_against_the_file_folder(tmp_path: Path) -> None:
    path = tmp_path / "fed" / "federation.toml"
    path.parent.mkdir()
    path.write_text(dump_federation(make_config()))
    config = load_federation(path)
    assert config == make_config()
    assert config.base_dir == path.parent.resolve()
    assert config.ca_certificate_path == path.parent.resolve() / "ca" / "ca.pem"
    assert make_config().ca_certificate_path == Path("ca/ca.pem")
    assert make_config(ca_certificate="/etc/ca.pem").ca_certificate_path == Path("/etc/ca.pem")


def test_defaults_follow_the_tre_guidance() -> None:
    config = make_config()
    assert config.privacy == PrivacyPolicy()
    assert (config.privacy.epsilon, config.privacy.delta) == (1.0, 1e-6)
    assert config.privacy.epsilon_budget == 4.0
    assert config.privacy.residual_dp is False
    assert config.privacy.collusion_threshold == 1
    assert config.privacy.noise_design.calibrated
    assert (config.fixed_point_bits, config.min_cohort_size, config.min_nodes) == (32, 100, 2)
    assert config.privacy.delta <= 1 / config.min_cohort_size**2


def test_accessors() -> None:
    config = make_config(nodes=tuple(NodeEntry(n, k) for n, k in reversed(KEYS.items())))
    assert config.node_ids == ("alpha", "beta", "delta", "gamma")
    assert config.identity_keys["gamma"] == KEYS["gamma"]
    assert config.node("beta").identity_public_key == KEYS["beta"]
    with pytest.raises(KeyError, match="node 'omega' is not part of federation 'trial-1'"):
        config.node("omega")
    assert (config.coordinator_host, config.coordinator_port) == ("coord.example.org", 50051)
    v6 = make_config(coordinator_address="[2001:db8::1]:443")
    assert (v6.coordinator_host, v6.coordinator_port) == ("2001:db8::1", 443)
    assert config.plan.round_names == ("means", "sums")
    assert config.plan.round("sums").layout.size == 15
    with pytest.raises(KeyError, match="plan 'test-plan' has no round 'x' \\(means, sums\\)"):
        config.plan.round("x")
    table = config.plan.table("clipping")
    table["age_low"] = 0.0
    assert config.plan.table("clipping")["age_low"] == 45.0
    assert config.plan.table("absent") == {}


def test_identity_keys_may_be_hex_or_base64() -> None:
    text = dump_federation(make_config())
    hex_key = KEYS["beta"].hex()
    b64_key = base64.b64encode(KEYS["beta"]).decode()
    assert parse_federation(text.replace(hex_key, b64_key)) == make_config()
    assert parse_federation(text.replace(hex_key, hex_key.upper())) == make_config()


# ----------------------------------------------------------------- hashing


def test_hash_is_sha256_of_sorted_compact_json() -> None:
    config = make_config()
    encoded = canonical_encoding(config)
    assert b" " not in encoded and b"\n" not in encoded
    document = json.loads(encoded)
    assert document["format"] == CONFIG_FORMAT
    assert json.dumps(document, sort_keys=True, separators=(",", ":")).encode() == encoded
    assert document["nodes"][0] == {"identity_public_key": KEYS["alpha"].hex(), "node_id": "alpha"}
    assert len(config_hash(config)) == 32


def test_formatting_comments_and_order_leave_the_hash_alone() -> None:
    config = make_config()
    text = dump_federation(config)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    reformatted = "\n".join(
        line.replace(" = ", "=") + ("   # a note" if "=" in line else "") for line in lines
    )
    # [[nodes]] blocks in another order, integers where floats were written.
    head, *blocks = reformatted.split("[[nodes]]")
    reordered = head + "".join("[[nodes]]" + b.rstrip("\n") + "\n" for b in reversed(blocks))
    reordered = reordered.replace("epsilon=1.0", "epsilon=1")
    again = parse_federation(reordered)
    assert config_hash(again) == config_hash(config)


MUTATIONS: dict[str, Callable[[FederationConfig], FederationConfig]] = {
    "federation_id": lambda c: dataclasses.replace(c, federation_id="trial-2"),
    "coordinator_address": lambda c: dataclasses.replace(c, coordinator_address="coord:50052"),
    "ca_certificate": lambda c: dataclasses.replace(c, ca_certificate="ca/other.pem"),
    "fixed_point_bits": lambda c: dataclasses.replace(c, fixed_point_bits=31),
    "min_cohort_size": lambda c: dataclasses.replace(c, min_cohort_size=101),
    "min_nodes": lambda c: dataclasses.replace(c, min_nodes=3),
    "stream_check": lambda c: dataclasses.replace(c, stream_check="ab" * 32),
    "node key": lambda c: dataclasses.replace(
        c, nodes=(NodeEntry("alpha", b"\x09" * 32), *c.nodes[1:])
    ),
    "node id": lambda c: dataclasses.replace(
        c, nodes=(NodeEntry("alpha2", c.nodes[0].identity_public_key), *c.nodes[1:])
    ),
    "node removed": lambda c: dataclasses.replace(c, nodes=c.nodes[:3]),
    "node checker key": lambda c: dataclasses.replace(
        c, nodes=(NodeEntry("alpha", KEYS["alpha"], (b"\x21" * 32,)), *c.nodes[1:])
    ),
    "privacy.epsilon": lambda c: dataclasses.replace(
        c, privacy=dataclasses.replace(c.privacy, epsilon=0.9)
    ),
    "privacy.delta": lambda c: dataclasses.replace(
        c, privacy=dataclasses.replace(c.privacy, delta=2e-6)
    ),
    "privacy.epsilon_budget": lambda c: dataclasses.replace(
        c, privacy=dataclasses.replace(c.privacy, epsilon_budget=3.0)
    ),
    "privacy.residual_dp": lambda c: dataclasses.replace(
        c, privacy=dataclasses.replace(c.privacy, residual_dp=True)
    ),
    "privacy.collusion_threshold": lambda c: dataclasses.replace(
        c, privacy=dataclasses.replace(c.privacy, collusion_threshold=0)
    ),
    "privacy.noise_design.construction": lambda c: dataclasses.replace(
        c, privacy=dataclasses.replace(c.privacy, noise_design=NoiseDesignSpec("cape"))
    ),
    "privacy.noise_design.graph": lambda c: dataclasses.replace(
        c,
        privacy=dataclasses.replace(
            c.privacy, noise_design=NoiseDesignSpec(graph="harary", degree=3)
        ),
    ),
    "privacy.noise_design.target_std": lambda c: dataclasses.replace(
        c, privacy=dataclasses.replace(c.privacy, noise_design=NoiseDesignSpec(target_std=1.0))
    ),
    "plan.name": lambda c: dataclasses.replace(c, plan=make_plan(name="other-plan")),
    "plan.version": lambda c: dataclasses.replace(c, plan=make_plan(version="4")),
    "plan.rounds": lambda c: dataclasses.replace(
        c, plan=make_plan(rounds=(RoundSpec("sums", Layout.of({"n": ()})),))
    ),
    "plan.settings.model.kind": lambda c: dataclasses.replace(
        c, plan=make_plan(settings={"model": {"kind": "simple"}})
    ),
    "plan.settings.clipping.age_low": lambda c: dataclasses.replace(
        c, plan=make_plan(settings={"clipping": {"age_low": 44.0}})
    ),
    "session.join_deadline_seconds": lambda c: dataclasses.replace(
        c, session=SessionTimings(121, 600)
    ),
    "session.round_deadline_seconds": lambda c: dataclasses.replace(
        c, session=SessionTimings(120, 601)
    ),
    "session.max_reruns": lambda c: dataclasses.replace(c, session=SessionTimings(120, 600, 3)),
}


@pytest.mark.parametrize("field", sorted(MUTATIONS))
def test_changing_any_setting_changes_the_hash(field: str) -> None:
    config = make_config()
    changed = MUTATIONS[field](config)
    assert changed != config
    assert config_hash(changed) != config_hash(config)


def test_every_setting_is_covered_by_a_mutation() -> None:
    leaves: set[str] = set()

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}{key}.", inner)
        else:
            leaves.add(prefix.rstrip("."))

    # stream_check appears in the document only when set.
    walk("", json.loads(canonical_encoding(make_config(stream_check="cd" * 32))))
    leaves -= {"format", "nodes"}
    # A plan's tables are hashed as a whole; two of their leaves stand for them.
    leaves = {leaf for leaf in leaves if not leaf.startswith("plan.settings.")}
    leaves |= {"plan.settings.model.kind", "plan.settings.clipping.age_low"}
    # degree changes together with graph (it exists only for harary graphs).
    missing = leaves - set(MUTATIONS) - {"privacy.noise_design.degree"}
    assert missing == set()


@settings(max_examples=25, deadline=None)
@given(node_id_lists(min_size=2, max_size=6), st.randoms(use_true_random=False))
def test_hash_ignores_node_order(ids: list[str], random: object) -> None:
    entries = [NodeEntry(n, bytes([i + 1]) * 32) for i, n in enumerate(ids)]
    shuffled = list(entries)
    random.shuffle(shuffled)  # type: ignore[attr-defined]
    a = make_config(nodes=tuple(entries), privacy=PrivacyPolicy(collusion_threshold=0))
    b = make_config(nodes=tuple(shuffled), privacy=PrivacyPolicy(collusion_threshold=0))
    assert a == b
    assert config_hash(a) == config_hash(b)
    assert dump_federation(a) == dump_federation(b)


# ----------------------------------------------------------------- errors


def appended(section: str, line: str) -> str:
    return edited(f"{section}\n", f"{section}\n{line}\n")


TOML_ERRORS: list[tuple[str, str, str]] = [
    # (edited TOML, field named, words of the reason)
    (edited("epsilon = 1.0", "epsilon = -1.0"), "privacy.epsilon", "greater than 0"),
    (edited("epsilon = 1.0", 'epsilon = "one"'), "privacy.epsilon", "must be a number"),
    (edited("epsilon = 1.0", "epsilon = nan"), "privacy.epsilon", "finite"),
    (edited("epsilon = 1.0", "epsilon = 5.0"), "privacy.epsilon", "total budget"),
    (edited("delta = 1e-06", "delta = 0.0"), "privacy.delta", "strictly between 0 and 1"),
    (edited("delta = 1e-06", "delta = 0.001"), "privacy.delta", "at most 1/N²"),
    (edited("epsilon_budget = 4.0", "epsilon_budget = 0"), "privacy.epsilon_budget", "than 0"),
    (edited("residual_dp = false", "residual_dp = 1"), "privacy.residual_dp", "true or false"),
    (
        edited("collusion_threshold = 1", "collusion_threshold = 3"),
        "privacy.collusion_threshold",
        "at most 2 with 4 nodes",
    ),
    (
        edited("collusion_threshold = 1", "collusion_threshold = true"),
        "privacy.collusion_threshold",
        "whole number",
    ),
    (
        edited('construction = "pairwise"', 'construction = "shamir"'),
        "privacy.noise_design.construction",
        "one of 'pairwise', 'cape'",
    ),
    (
        edited('graph = "complete"', 'graph = "ring"'),
        "privacy.noise_design.graph",
        "one of 'complete', 'harary'",
    ),
    (
        edited('graph = "complete"', 'graph = "harary"'),
        "privacy.noise_design.degree",
        "required when graph = 'harary'",
    ),
    (
        edited('graph = "complete"', 'graph = "complete"\ndegree = 2'),
        "privacy.noise_design.degree",
        "applies only to graph = 'harary'",
    ),
    (
        edited('graph = "complete"', 'graph = "harary"\ndegree = 4'),
        "privacy.noise_design.degree",
        "at most 3",
    ),
    (
        edited('graph = "complete"', 'graph = "harary"\ndegree = 1'),
        "privacy.noise_design.degree",
        "at least 2",
    ),
    (
        edited('graph = "complete"', 'graph = "harary"\ndegree = 2').replace(
            "collusion_threshold = 1", "collusion_threshold = 2"
        ),
        "privacy.noise_design.degree",
        "must exceed privacy.collusion_threshold = 2",
    ),
    (
        edited(
            'construction = "pairwise"\ngraph = "complete"',
            'construction = "cape"\ngraph = "harary"\ndegree = 2',
        ),
        "privacy.noise_design.graph",
        "always uses the complete graph",
    ),
    (
        edited('target_std = "calibrated"', 'target_std = "loud"'),
        "privacy.noise_design.target_std",
        "must be a number",
    ),
    (
        edited('target_std = "calibrated"', "target_std = -0.5"),
        "privacy.noise_design.target_std",
        "greater than 0",
    ),
    (edited('name = "test-plan"', 'name = "a plan"'), "plan.name", "1 to 64"),
    (edited('version = "3"', "version = 3"), "plan.version", "non-empty string"),
    (edited('name = "sums"', 'name = "cape-sum/sums"'), "plan.rounds[1].name", "1 to 64"),
    (edited('name = "sums"', 'name = "means"'), "plan.rounds.name", "listed twice"),
    (
        edited('{ name = "sum_xx", shape = [10] }', '{ name = "sum_xx", shape = [-1] }'),
        "plan.rounds[1].tensors",
        "every dimension must be a whole number >= 0",
    ),
    (
        edited('{ name = "sum_xx", shape = [10] }', '{ name = "n", shape = [10] }'),
        "plan.rounds[1].tensors",
        "listed twice",
    ),
    (
        edited(
            'tensors = [\n    { name = "n", shape = [] },\n    { name = "sum_x", shape = [4] },\n]',
            'tensors = "none"',
        ),
        "plan.rounds[0].tensors",
        "list of tensors",
    ),
    (edited("tensors = [\n", "extra = 1\ntensors = [\n"), "plan.rounds[0].extra", "unknown"),
    (edited("[plan.model]\n", "[plan.model]\nwhen = 1979-05-27\n"), "plan.model.when", "number"),
    (edited("[plan.model]\n", "[plan.model]\nx = nan\n"), "plan.model.x", "finite"),
    (edited("[plan]\n", "[plan]\nloose = 3\n"), "plan.loose", "must be a table"),
    (
        edited("join_deadline_seconds = 120.0", "join_deadline_seconds = 0"),
        "session.join_deadline_seconds",
        "greater than 0",
    ),
    (
        edited("join_deadline_seconds = 120.0", "join_deadline_seconds = 0.001"),
        "session.join_deadline_seconds",
        "between 1 s and",
    ),
    (
        edited("round_deadline_seconds = 600.0", "round_deadline_seconds = 1e308"),
        "session.round_deadline_seconds",
        "(30 days)",
    ),
    (
        edited("max_reruns = 2", "max_reruns = 11"),
        "session.max_reruns",
        "must be between 0 and 10",
    ),
    (
        edited("max_reruns = 2", "max_reruns = 2.0"),
        "session.max_reruns",
        "must be a whole number",
    ),
    (edited('federation_id = "trial-1"', 'federation_id = "../x"'), "federation_id", "1 to 64"),
    (
        edited('coordinator_address = "coord.example.org:50051"', 'coordinator_address = "coord"'),
        "coordinator_address",
        "host:port",
    ),
    (
        edited(
            'coordinator_address = "coord.example.org:50051"', 'coordinator_address = "c:70000"'
        ),
        "coordinator_address",
        "between 1 and 65535",
    ),
    (
        edited('coordinator_address = "coord.example.org:50051"', 'coordinator_address = "[zz]:1"'),
        "coordinator_address",
        "bracketed IPv6",
    ),
    (
        edited('coordinator_address = "coord.example.org:50051"', 'coordinator_address = "a_b:1"'),
        "coordinator_address",
        "DNS name",
    ),
    (edited('ca_certificate = "ca/ca.pem"', 'ca_certificate = ""'), "ca_certificate", "PEM"),
    (edited("fixed_point_bits = 32", "fixed_point_bits = 63"), "fixed_point_bits", "16 and 40"),
    (edited("fixed_point_bits = 32", "fixed_point_bits = 60"), "fixed_point_bits", "2^(63-F)"),
    (
        edited("min_cohort_size = 100", "min_cohort_size = 0"),
        "min_cohort_size",
        "between 1 and 1000000000",
    ),
    (edited("min_nodes = 2", "min_nodes = 5"), "min_nodes", "between 2 and 4"),
    (edited('node_id = "beta"', 'node_id = "be ta"'), "nodes[1].node_id", "A-Z"),
    (edited('node_id = "beta"', 'node_id = "alpha"'), "nodes.node_id", "listed twice"),
    (
        edited(KEYS["beta"].hex(), KEYS["alpha"].hex()),
        "nodes.beta.identity_public_key",
        "also the identity key of node 'alpha'",
    ),
    (edited(KEYS["beta"].hex(), "abcd"), "nodes[1].identity_public_key", "64 hex digits"),
    (
        edited(KEYS["beta"].hex(), base64.b64encode(b"x" * 31).decode()),
        "nodes[1].identity_public_key",
        "32-byte",
    ),
    (
        edited(f'identity_public_key = "{KEYS["beta"].hex()}"', "identity_public_key = 5"),
        "nodes[1].identity_public_key",
        "32-byte",
    ),
    (edited('node_id = "beta"\n', ""), "nodes[1].node_id", "every node needs an id"),
    (appended("[privacy]", "epsilom = 1.0"), "privacy.epsilom", "unknown setting"),
    (appended("[[nodes]]", "site = 3"), "nodes[0].site", "unknown setting"),
    (edited("[plan]\n", "[plann]\n"), "plann", "unknown setting"),
    (edited('version = "3"\n', ""), "plan.version", "is missing"),
    (edited('federation_id = "trial-1"\n', ""), "federation_id", "is missing"),
    (
        "format = 'zerosum/v2/federation'\nfederation_id = 'x'\nprivacy = 3\n",
        "privacy",
        "must be a table",
    ),
    (
        "format = 'zerosum/v2/federation'\nfederation_id = 'x'\nnodes = 3\n",
        "nodes",
        "array of [[nodes]] tables",
    ),
    (
        "format = 'zerosum/v2/federation'\nfederation_id = 'x'\nnodes = [3]\n",
        "nodes[0]",
        "must be a table",
    ),
    (
        "[[nodes]]".join(dump_federation(make_config()).split("[[nodes]]")[:2]),
        "nodes",
        "at least 2 nodes",
    ),
    ("\n".join(dump_federation(make_config()).split("[[nodes]]")[:1]), "nodes", "is missing"),
    ("federation_id = ", "file", "not valid TOML"),
]


@pytest.mark.parametrize(("text", "field", "reason"), TOML_ERRORS)
def test_every_bad_setting_names_its_field(text: str, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_federation(text)
    error = caught.value
    assert error.field == field, str(error)
    assert reason in str(error)
    assert str(error).startswith(field)


def test_message_shows_the_bad_value() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_federation(edited("epsilon = 1.0", "epsilon = -1.0"))
    assert str(caught.value) == "privacy.epsilon = -1.0: must be greater than 0"
    assert caught.value.value == -1.0
    missing = ConfigError("model.kind", MISSING, "is required")
    assert str(missing) == "model.kind is missing: is required"
    long = ConfigError("x", "y" * 200, "too long")
    assert "..." in str(long) and len(str(long)) < 120


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: PrivacyPolicy(epsilon=0), "privacy.epsilon"),
        (lambda: PrivacyPolicy(noise_design="cape"), "privacy.noise_design"),  # type: ignore[arg-type]
        (lambda: NodeEntry("a", b"short"), "nodes.identity_public_key"),
        (lambda: make_plan(rounds=()), "plan.rounds"),
        (lambda: make_plan(settings={"model": 3}), "plan.model"),
        (
            lambda: SessionTimings(round_deadline_seconds=float("inf")),
            "session.round_deadline_seconds",
        ),
        (lambda: SessionTimings(max_reruns=-1), "session.max_reruns"),
        (lambda: make_config(nodes=["alpha"]), "nodes"),
        (lambda: make_config(nodes=(NodeEntry("a", KEYS["alpha"]),)), "nodes"),
        (lambda: make_config(plan="big"), "plan"),
        (lambda: RoundSpec("r", "layout"), "plan.rounds[r].tensors"),  # type: ignore[arg-type]
    ],
)
def test_constructing_bad_dataclasses_raises_too(build: Callable[[], object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build()
    assert caught.value.field == field


def test_load_reports_unreadable_files(tmp_path: Path) -> None:
    bad = tmp_path / "federation.toml"
    bad.write_bytes(b'federation_id = "\xff"\n')
    with pytest.raises(LocalFileError, match="is not UTF-8 text"):
        load_federation(bad)
    bad.write_text("this is not toml")
    with pytest.raises(ConfigError) as caught:
        load_federation(bad)
    assert caught.value.value == str(bad)
    with pytest.raises(LocalFileError, match=r"absent\.toml does not exist"):
        load_federation(tmp_path / "absent.toml")
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(ConfigError, match="nests arrays or tables more than 64 levels deep"):
        load_federation(deep)


def test_strings_are_escaped_in_the_dump() -> None:
    config = make_config(ca_certificate='certs\\"odd"\tname\x7f.pem')
    again = parse_federation(dump_federation(config))
    assert again.ca_certificate == config.ca_certificate


def test_the_missing_marker_reads_as_such() -> None:
    assert repr(MISSING) == "<missing>"
    text = edited(KEYS["beta"].hex(), "!" * 44)
    with pytest.raises(ConfigError, match=r"nodes\[1\]\.identity_public_key = '!!!"):
        parse_federation(text)


def test_an_unset_stream_check_is_absent_from_the_hashed_document() -> None:
    # Federations written before the check existed keep their config hash.
    assert b"stream_check" not in canonical_encoding(make_config())
    assert "stream_check" not in dump_federation(make_config())
    checked = make_config(stream_check="ef" * 32)
    assert b'"stream_check":"' + b"ef" * 32 + b'"' in canonical_encoding(checked)


@pytest.mark.parametrize("value", ["AB" * 32, "ab" * 31, "xy" * 32, 7])
def test_a_bad_stream_check_names_the_field(value: object) -> None:
    with pytest.raises(ConfigError, match=r"stream_check = .*64 lowercase hexadecimal digits"):
        make_config(stream_check=value)


# ----------------------------------------------------------------- output checker keys

CHECKER = b"\x21" * 32


def _with_checkers(alpha: tuple[bytes, ...]) -> FederationConfig:
    nodes = tuple(NodeEntry(n, k, alpha if n == "alpha" else ()) for n, k in KEYS.items())
    return make_config(nodes=nodes)


def test_checker_keys_are_read_listed_and_hashed_per_node() -> None:
    config = _with_checkers((CHECKER, b"\x22" * 32))
    text = dump_federation(config)
    assert f'checker_public_keys = ["{CHECKER.hex()}", "{"22" * 32}"]' in text
    again = parse_federation(text)
    assert again.checker_keys["alpha"] == (CHECKER, b"\x22" * 32)
    assert again.checker_keys["beta"] == ()
    document = json.loads(canonical_encoding(config))
    assert document["nodes"][0]["checker_public_keys"] == [CHECKER.hex(), "22" * 32]
    # A node without checker keys is encoded as before they existed.
    assert "checker_public_keys" not in document["nodes"][1]
    assert config_hash(make_config()) == config_hash(_with_checkers(()))
    # The order in which a node's checker keys are listed does not matter.
    swapped = _with_checkers((b"\x22" * 32, CHECKER))
    assert config_hash(swapped) == config_hash(config)
    base64_key = base64.b64encode(CHECKER).decode()
    written = text.replace(f'"{CHECKER.hex()}"', f'"{base64_key}"')
    assert parse_federation(written).checker_keys["alpha"][0] == CHECKER


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ('checker_public_keys = "ab"', "nodes[0].checker_public_keys", "must be an array"),
        ('checker_public_keys = ["ab"]', "nodes[0].checker_public_keys[0]", "32-byte Ed25519"),
        (
            f'checker_public_keys = ["{KEYS["alpha"].hex()}"]',
            "nodes[0].checker_public_keys",
            "the node's own identity key",
        ),
        (
            f'checker_public_keys = ["{CHECKER.hex()}", "{CHECKER.hex()}"]',
            "nodes[0].checker_public_keys",
            "listed twice",
        ),
        (
            f'checker_public_keys = ["{KEYS["beta"].hex()}"]',
            "nodes.alpha.checker_public_keys",
            "identity key of node 'beta'",
        ),
    ],
)
def test_a_bad_checker_key_names_its_field(line: str, field: str, reason: str) -> None:
    alpha = f'identity_public_key = "{KEYS["alpha"].hex()}"'
    with pytest.raises(ConfigError) as caught:
        parse_federation(edited(alpha, f"{alpha}\n{line}"))
    assert caught.value.field == field, str(caught.value)
    assert reason in str(caught.value)
