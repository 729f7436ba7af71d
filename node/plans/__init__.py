"""Plans: what the nodes compute, round by round, over zero-sum masked sums.

A plan names its rounds and each round's public tensor layout from the
federation config alone (the coordinator checks every payload against those
layouts), computes a node's tensors for a round from its local data and the
earlier aggregates, states each tensor's sensitivity from public bounds, and
takes in each aggregate. The brain-age fit (``deltab``) is one plan.
"""

from __future__ import annotations
