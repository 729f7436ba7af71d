"""The brain-age plan (deltab): every module of its own, in one folder.

* ``plan`` — the public rounds from the settings, one node's side of each
  round (:class:`~node.plans.deltab.plan.DeltabPlan`), and the plan's
  ``PLAN`` (its :class:`~node.plans.interface.PlanDefinition`);
* ``settings`` — ``[plan.model]``, ``[plan.clipping]``, ``[plan.delta_summary]``;
* ``cohort`` — reading a node's cohort table against the declared features;
* ``delta_summary``, ``summary_bundle``, ``summary_release``,
  ``summary_review`` — the optional Laplace summary of the deltas after the
  model: its statistics, its bundle, its release (the plan's
  ``post_model_release``) and its review;
* ``units`` — the reviewer's reading of the released sums in real units.

The model itself is the library ``node.deltab`` (also ``zerosum deltab``).
The plan's code digest covers every module here and of that library
(``plan._modules``).
"""
