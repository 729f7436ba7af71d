"""deltab: brain-age delta estimation (Smith et al. 2019, NeuroImage 200:528-539).

The estimator (:class:`BrainAgeModel`), its sufficient-statistics form for
federated fitting (one release of uncentred sums: ``node.deltab.sums`` for the
public layout and sensitivities, ``node.deltab.uncentred`` for the node sums
and the fit from their aggregate; the earlier centred two-round form in
``node.deltab.stats``; all driven round by round through ``node.deltab.plan``),
the seed documents' coefficient-averaging comparison mode
(``node.deltab.fedavg``) and JSON persistence (``node.deltab.persist``).
Only numpy is needed on this path.
"""

from __future__ import annotations

from node.deltab._params import MODELS
from node.deltab.exceptions import DeltabWarning, ModelFileError, NotFittedError
from node.deltab.model import BrainAgeModel
from node.deltab.persist import load_model, save_model
from node.deltab.scaling import Bounds, ClipCounts, Standardisation

__all__ = [
    "MODELS",
    "Bounds",
    "BrainAgeModel",
    "ClipCounts",
    "DeltabWarning",
    "ModelFileError",
    "NotFittedError",
    "Standardisation",
    "load_model",
    "save_model",
]
