"""Finding the plan a federation names among those installed in this TRE, and checking it.

Plans are Python packages installed in the TRE; each announces itself in the
entry-point group ``zerosum.plans`` (name = the plan's name, value = a
:class:`~node.plans.interface.PlanDefinition`). This project's own plans are
announced the same way in its ``pyproject.toml`` and are also known without
the installed metadata, so a source checkout finds them too.

A node runs only the code its governance approved: the federation config
names the plan, its version and the SHA-256 of its code (``digest``,
``node.plans.interface.code_digest``), and :func:`plan_for` refuses a plan
that is not installed, whose version differs, or whose code digest differs —
one sentence naming both digests. A config that pins no digest is accepted
with a warning (as for ``stream_check``): it cannot say which code it approved.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from node.errors import NodeError
from node.plans.interface import PlanDefinition
from proto.federation import ConfigError, FederationConfig

__all__ = [
    "ENTRY_POINT_GROUP",
    "PlanMismatch",
    "installed_plan",
    "installed_plans",
    "plan_for",
]

ENTRY_POINT_GROUP = "zerosum.plans"


class PlanMismatch(NodeError, ConfigError):
    """The plan the federation names is not the one installed here; says how they differ."""


def _builtin() -> dict[str, PlanDefinition]:
    from node.plans.deltab.plan import PLAN as DELTAB
    from node.plans.logreg import PLAN as LOGREG

    return {DELTAB.name: DELTAB, LOGREG.name: LOGREG}


def installed_plans() -> dict[str, PlanDefinition]:
    """Every plan this installation can run, by name (entry points over the built-ins)."""
    plans = _builtin()
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            found = point.load()
        except Exception as error:  # a broken third-party plan must not hide the others
            raise ConfigError(
                "plan.name", point.name, f"the installed plan cannot be loaded: {error}"
            ) from None
        if not isinstance(found, PlanDefinition) or found.name != point.name:
            raise ConfigError(
                "plan.name",
                point.name,
                f"entry point {point.value!r} of group {ENTRY_POINT_GROUP} is not the "
                "PlanDefinition of a plan of that name",
            )
        plans[point.name] = found
    return plans


def installed_plan(config: FederationConfig) -> PlanDefinition | None:
    """The installed plan of the config's name, unchecked; None if there is none to be had.

    For the output checker's read-only views (real units, clipping), which
    show less rather than fail when the plan is not installed here or the
    installed plans cannot be listed; a node uses :func:`plan_for`.
    """
    try:
        return installed_plans().get(config.plan.name)
    except ConfigError:
        return None


def plan_for(
    config: FederationConfig, *, warn: Callable[[str], None] | None = None
) -> PlanDefinition:
    """The installed plan the config names, checked against its version and digest."""
    spec = config.plan
    plans = installed_plans()
    if spec.name not in plans:
        raise PlanMismatch(
            "plan.name",
            spec.name,
            f"no such plan is installed here (installed: {', '.join(sorted(plans))})",
        )
    plan = plans[spec.name]
    if spec.version != plan.version:
        raise PlanMismatch(
            "plan.version",
            spec.version,
            f"this TRE has plan {plan.name!r} version {plan.version!r} installed",
        )
    installed = plan.digest()
    if not spec.digest:
        if warn is not None:
            warn(
                f"the federation config pins no digest for plan {plan.name!r}, so this node "
                f"cannot confirm it runs the approved code (installed digest {installed}); "
                "`zerosum federation init` pins one"
            )
    elif spec.digest != installed:
        raise PlanMismatch(
            "plan.digest",
            spec.digest,
            f"the federation approved plan {plan.name!r} {plan.version} with code digest "
            f"{spec.digest}, but the code installed here has digest {installed}; install the "
            "approved code, or have the federation re-approve this one",
        )
    plan.check_spec(config)
    return plan
