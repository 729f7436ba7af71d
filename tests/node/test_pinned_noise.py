"""Noise scales fixed once in the config: every node draws the same integers whatever its floats."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

import node.egress.release as release_module
from node.egress.pinned_noise import pin_noise, pinned
from node.egress.release import plan_release
from node.protocol.masking import pairwise_masks
from noise import accounting
from noise.fixed_point import FixedPointCodec
from proto.federation import ConfigError, config_hash, dump_federation, parse_federation
from tests.support.made_up_federation import _config, _seeds

IDS = ["a", "b", "c", "d"]
CODEC = FixedPointCodec(32)


def test_init_pins_an_integer_scale_for_every_tensor_of_every_round() -> None:
    config = _config(IDS)
    assert pinned(config)
    for spec in config.plan.rounds:
        assert list(spec.noise_std) == [slot.name for slot in spec.layout]
        assert all(isinstance(v, int) and v >= 1 for v in spec.noise_std.values())
    text = dump_federation(config)
    assert "noise_std = {" in text
    again = parse_federation(text)
    assert again == config
    assert config_hash(again) == config_hash(config)
    bumped = replace(
        config,
        plan=replace(
            config.plan,
            rounds=tuple(
                replace(s, noise_std={k: v + 1 for k, v in s.noise_std.items()})
                for s in config.plan.rounds
            ),
        ),
    )
    assert config_hash(bumped) != config_hash(config)


def test_a_pinned_scale_is_sigma_in_grid_units_rounded_up() -> None:
    config = _config(IDS)
    spec = config.plan.rounds[0]
    name = spec.layout.names[0]
    noise = plan_release(
        config, IDS, "a", release_module_sensitivities(config, spec.name), spec.name
    )
    # What any T colluders leave on an egress (the floor) is the pinned S·2^-F; an
    # outsider alone sees more (here K = 4, T = 1: c² = S²/2 on each of 3 pairs).
    floor = math.ldexp(spec.noise_std[name], -32)
    assert math.sqrt(noise.floor_variance(name)) == pytest.approx(floor, rel=1e-12)
    assert noise.sigma(name) == pytest.approx(floor * math.sqrt(1.5), rel=1e-12)
    units = noise.pair_variances(name)
    assert set(units) == {"b", "c", "d"}
    assert all(v == Fraction(spec.noise_std[name] ** 2, 2) for v in units.values())


def release_module_sensitivities(config, name):  # type: ignore[no-untyped-def]
    from node.plans.registry import installed_plans

    return installed_plans()[config.plan.name].public_sensitivities(config, name)


def _perturbed_by_one_ulp(monkeypatch: pytest.MonkeyPatch) -> None:
    original = accounting.gaussian_mu

    def nudged(epsilon: float, delta: float) -> float:
        return math.nextafter(original(epsilon, delta), math.inf)

    monkeypatch.setattr(accounting, "gaussian_mu", nudged)
    monkeypatch.setattr(release_module, "gaussian_mu", nudged)


def test_a_one_ulp_different_calibration_draws_the_same_integers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _config(IDS, residual_dp=True)
    spec = config.plan.rounds[0]
    sensitivities = release_module_sensitivities(config, spec.name)
    seeds = _seeds(IDS)
    before = {n: plan_release(config, IDS, n, sensitivities, spec.name) for n in IDS}
    masks_before = {
        n: pairwise_masks(before[n], seeds[n], spec.layout, round_index=3, codec=CODEC) for n in IDS
    }
    _perturbed_by_one_ulp(monkeypatch)
    after = plan_release(config, IDS, "b", sensitivities, spec.name)
    # The node's own floats moved ...
    assert not np.array_equal(
        after.unit.design.pair_variances, before["b"].unit.design.pair_variances
    )
    # ... but every variance it draws with is the same exact fraction,
    for name in spec.layout.names:
        assert after.pair_variances(name) == before["b"].pair_variances(name)
        assert after.residual_variance_units(name) == before["b"].residual_variance_units(name)
        assert isinstance(next(iter(after.pair_variances(name).values())), Fraction)
    # so its mask is the same bits and the federation's masks still cancel exactly.
    mask_after = pairwise_masks(after, seeds["b"], spec.layout, round_index=3, codec=CODEC)
    assert np.array_equal(mask_after, masks_before["b"])
    total = sum((masks_before[n] for n in IDS if n != "b"), mask_after)
    assert not np.any(total)


def test_a_round_the_config_does_not_pin_is_refused() -> None:
    config = _config(IDS)
    bare = replace(
        config,
        plan=replace(
            config.plan, rounds=tuple(replace(s, noise_std={}) for s in config.plan.rounds)
        ),
    )
    spec = bare.plan.rounds[0]
    with pytest.raises(ConfigError, match=r"pins no noise scale.*federation init"):
        plan_release(bare, IDS, "a", release_module_sensitivities(bare, spec.name), spec.name)
    assert pinned(pin_noise(bare))


def test_a_config_of_the_previous_format_is_refused_with_how_to_remake_it() -> None:
    text = dump_federation(_config(IDS)).replace(
        'format = "zerosum/v2/federation"', 'format = "zerosum/v1/federation"'
    )
    with pytest.raises(
        ConfigError, match=r"older zerosum.*Remake it with `zerosum federation init`"
    ):
        parse_federation(text)
    missing = dump_federation(_config(IDS)).replace('format = "zerosum/v2/federation"\n', "")
    with pytest.raises(ConfigError, match=r"^format = 'none"):
        parse_federation(missing)
