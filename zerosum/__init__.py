"""zerosum: federated brain-age estimation with zero-sum correlated noise."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
