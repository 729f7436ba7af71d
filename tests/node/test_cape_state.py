"""CAPE material on disk: round trip, private files, commit order, and damage named clearly."""

from __future__ import annotations

import dataclasses
import json
import stat
from pathlib import Path

import numpy as np
import pytest

from node.records.cape_state import CapeMaterial, CapeStateError, CapeStore, CapeSum
from noise.layout import Layout

SESSION = "0123456789abcdef0123456789abcdef"
CONFIG_HASH = bytes(range(32))
LAYOUT = Layout.of({"n": (), "sum_x": (2, 3)})
IDS = ("a", "b", "c")


def _vector(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**64, size=7, dtype=np.uint64)


def _material(**changes: object) -> CapeMaterial:
    base = CapeMaterial(
        session_id=SESSION,
        node_id="a",
        config_hash=CONFIG_HASH,
        round_name="moments",
        layout=LAYOUT,
        planned=IDS,
        draws=_vector(1),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _load(store: CapeStore, **changes: object) -> CapeMaterial | None:
    arguments: dict[str, object] = {
        "session_id": SESSION,
        "node_id": "a",
        "config_hash": CONFIG_HASH,
        "layout": LAYOUT,
    }
    arguments.update(changes)
    return store.load("moments", **arguments)  # type: ignore[arg-type]


def _same(found: CapeMaterial | None, saved: CapeMaterial) -> None:
    assert found is not None
    assert (found.session_id, found.node_id, found.config_hash, found.round_name) == (
        saved.session_id,
        saved.node_id,
        saved.config_hash,
        saved.round_name,
    )
    assert found.layout == saved.layout and found.planned == saved.planned
    assert np.array_equal(found.draws, saved.draws)
    assert (found.residual is None) == (saved.residual is None)
    if found.residual is not None and saved.residual is not None:
        assert np.array_equal(found.residual, saved.residual)
    assert (found.sum is None) == (saved.sum is None)
    if found.sum is not None and saved.sum is not None:
        assert found.sum.round_index == saved.sum.round_index
        assert found.sum.participants == saved.sum.participants
        assert np.array_equal(found.sum.total, saved.sum.total)


def test_each_piece_round_trips_as_it_is_added(tmp_path: Path) -> None:
    store = CapeStore(tmp_path)
    assert _load(store) is None
    steps = [_material()]
    steps.append(dataclasses.replace(steps[-1], sum=CapeSum(0, IDS, _vector(2))))
    steps.append(dataclasses.replace(steps[-1], residual=_vector(3)))
    for material in steps:
        folder = store.save(material)
        assert folder == tmp_path / "audit" / "cape-moments"
        _same(_load(store), material)
    record = json.loads((folder / "cape.json").read_text())
    assert record["format"] == "zerosum-cape-material" and record["version"] == 1
    assert record["sum"]["round_index"] == 0 and record["sum"]["participants"] == list(IDS)
    assert sorted(p.name for p in folder.iterdir()) == [
        "cape.json",
        "draws.npy",
        "residual.npy",
        "sum-round-0.npy",
    ]


def test_the_files_are_private_to_their_owner(tmp_path: Path) -> None:
    store = CapeStore(tmp_path)
    folder = store.save(_material(residual=_vector(3), sum=CapeSum(0, IDS, _vector(2))))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
    (folder / "draws.npy").chmod(0o644)
    with pytest.raises(CapeStateError, match=r"draws.npy is accessible to other users \(mode 0644"):
        _load(store)


def test_a_rerun_sum_replaces_the_earlier_one(tmp_path: Path) -> None:
    store = CapeStore(tmp_path)
    store.save(_material(sum=CapeSum(0, IDS, _vector(2))))
    rerun = _material(sum=CapeSum(2, ("a", "b"), _vector(4)), residual=_vector(3))
    folder = store.save(rerun)
    _same(_load(store), rerun)
    assert not (folder / "sum-round-0.npy").exists()


def test_only_what_the_record_names_is_read_back(tmp_path: Path) -> None:
    # A crash after a vector file but before the record leaves the previous state.
    store = CapeStore(tmp_path)
    saved = _material()
    folder = store.save(saved)
    (folder / "residual.npy").write_bytes(b"half written")
    _same(_load(store), saved)
    # A folder whose record was never written holds nothing committed.
    (folder / "cape.json").unlink()
    assert _load(store) is None


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda f: (f / "draws.npy").write_bytes((f / "draws.npy").read_bytes()[:-8] + bytes(8)),
            r"draws.npy has sha256 [0-9a-f]{16}…, but .*cape.json records [0-9a-f]{16}…; the "
            "file was changed or damaged",
        ),
        (
            lambda f: (f / "residual.npy").write_bytes(b"\x93NUMPY garbage"),
            r"residual.npy is not a valid .npy file",
        ),
        (lambda f: (f / "sum-round-0.npy").unlink(), r"sum-round-0.npy is missing, but"),
        (lambda f: (f / "cape.json").write_text("{"), r"cape.json is not valid JSON"),
        (
            lambda f: (f / "cape.json").write_text(
                (f / "cape.json").read_text().replace('"size": 6', '"size": 5')
            ),
            r"field 'tensors' is not a tensor layout: tensor 'sum_x' has size 5",
        ),
    ],
    ids=["draws-changed", "residual-truncated", "sum-missing", "record-broken", "layout"],
)
def test_damage_is_named(tmp_path: Path, damage: object, message: str) -> None:
    store = CapeStore(tmp_path)
    folder = store.save(_material(residual=_vector(3), sum=CapeSum(0, IDS, _vector(2))))
    damage(folder)  # type: ignore[operator]
    for path in folder.iterdir():
        path.chmod(0o600)  # write_text may have made a file with the umask's mode
    with pytest.raises(CapeStateError, match=message):
        _load(store)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"session_id": "f" * 32}, r"records session_id '0123.*', not this node's 'ffff"),
        ({"node_id": "b"}, r"records node_id 'a', not this node's 'b'"),
        ({"config_hash": bytes(32)}, r"records config_hash '000102"),
        (
            {"layout": Layout.of({"n": (), "sum_y": (2, 3)})},
            r"was saved for tensors Layout\(n\[\], sum_x\[2, 3\]\)",
        ),
    ],
    ids=["session", "node", "config", "layout"],
)
def test_material_of_another_session_node_or_layout_is_refused(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    store = CapeStore(tmp_path)
    store.save(_material())
    with pytest.raises(CapeStateError, match=message):
        _load(store, **changes)


def test_inconsistent_material_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    store = CapeStore(tmp_path)
    with pytest.raises(CapeStateError, match=r"draws vector of round 'moments' must be 7 uint64"):
        store.save(_material(draws=np.zeros(6, dtype=np.uint64)))
    with pytest.raises(CapeStateError, match=r"node 'a' is not among the planned CAPE"):
        store.save(_material(planned=("b", "c")))
    with pytest.raises(CapeStateError, match=r"covers \['b', 'c'\], which must include node 'a'"):
        store.save(_material(sum=CapeSum(0, ("b", "c"), _vector(2))))
    assert not (tmp_path / "audit").exists()
    with pytest.raises(ValueError, match=r"round name '\.\./x' cannot name a folder"):
        store.folder("../x")


def test_discard_removes_every_cape_folder_and_keeps_the_audit_records(tmp_path: Path) -> None:
    store = CapeStore(tmp_path)
    store.save(_material())
    store.save(_material(round_name="scatter"))
    (tmp_path / "audit" / "round-1").mkdir()
    assert [p.name for p in store.folders()] == ["cape-moments", "cape-scatter"]
    store.discard()
    assert store.folders() == []
    assert [p.name for p in (tmp_path / "audit").iterdir()] == ["round-1"]
    store.discard()  # nothing left: a no-op
