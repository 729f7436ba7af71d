"""The noise scales a federation pins once, for everyone: S_t = ⌈σ_t·2^F⌉ per round and tensor.

``zerosum federation init`` calls :func:`pin_noise` before it writes the
config: for every plan round it takes the tensors' public sensitivities Δ_t
(``PlanDefinition.public_sensitivities``, from the declared clipping bounds),
adds the grid's rounding (√d_t·2^-F, ``node.egress.release``), and sets

* calibrated policy: σ_t = Δ_t·√M/μ*(ε, δ) — the release of M tensors is then
  μ*-GDP against an outsider, μ* from the analytic Gaussian mechanism
  (Balle & Wang 2018);
* fixed policy: σ_t = the configured ``target_std``;

and pins S_t = ⌈σ_t·2^F⌉ grid units as an integer in the round's
``noise_std`` table. Rounding up only adds noise. Nodes take S_t from the
config and turn it into every variance they draw with in exact rational
arithmetic (``noise.exact_noise``); the floating-point work above happens once,
here, so a node whose libm or scipy differs in the last bit still draws the
same integers as its pair partners.
"""

from __future__ import annotations

import math
from dataclasses import replace

from node.egress.release import _grid_sensitivity
from noise.accounting import gaussian_mu
from proto.federation import ConfigError, FederationConfig
from proto.federation.schema import MAX_NOISE_STD_UNITS

__all__ = ["pin_noise", "pinned"]


def pinned(config: FederationConfig) -> bool:
    """Whether every round of the plan has its noise scales pinned."""
    return all(spec.pinned for spec in config.plan.rounds)


def pin_noise(config: FederationConfig) -> FederationConfig:
    """``config`` with S_t pinned for every tensor of every plan round (module docstring)."""
    from node.plans.registry import installed_plans

    definition = installed_plans()[config.plan.name]
    privacy = config.privacy
    target = privacy.noise_design.target_std
    mu_star = gaussian_mu(privacy.epsilon, privacy.delta)
    bits = config.fixed_point_bits
    rounds = []
    for spec in config.plan.rounds:
        sizes = {slot.name: slot.size for slot in spec.layout}
        sensitivities = definition.public_sensitivities(config, spec.name)
        m = len(sensitivities)
        stds: dict[str, int] = {}
        for t in sensitivities:
            if target == "calibrated":
                delta_t = _grid_sensitivity(t, sizes[t.name], bits).sensitivity
                sigma = delta_t * math.sqrt(m) / mu_star
            else:
                sigma = float(target)
            units = math.ceil(math.ldexp(sigma, bits))
            if units > MAX_NOISE_STD_UNITS:
                raise ConfigError(
                    f"plan.rounds[{spec.name}].noise_std.{t.name}",
                    units,
                    f"noise of σ = {sigma:.4g} is {units} grid units at fixed_point_bits = {bits}, "
                    "above the samplers' 2^50; lower fixed_point_bits or tighten the bounds",
                )
            stds[t.name] = max(1, units)
        rounds.append(replace(spec, noise_std={slot.name: stds[slot.name] for slot in spec.layout}))
    return replace(config, plan=replace(config.plan, rounds=tuple(rounds)))
