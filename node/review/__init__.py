"""The output checker's side of egress: re-checking a bundle and deciding on it.

* ``decision``: the federation config a bundle belongs to, its node's output
  checker keys, and whether an ``approval.json`` is a valid, final decision
  or a refused one that a checker may replace;
* ``checks``: files and checksums, schema against the config, SDC
  thresholds (``sdc``), every ε recomputed from σ and sensitivity;
* ``noise_test``: the χ² test, against the audit record, that the egress
  carries noise of the declared scale;
* ``report`` runs them all into a :class:`~node.review.report.Review`;
  ``render`` prints it as text, JSON or HTML; ``findings`` holds the levels
  and the exit code (0 pass, 1 needs a human look, 2 fail).
"""
