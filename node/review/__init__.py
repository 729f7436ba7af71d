"""The output checker's side of egress: re-checking a bundle and deciding on it.

``decision`` finds the federation config a bundle belongs to, its node's
output checker keys, and whether an ``approval.json`` in the folder is a
valid, final decision or a refused one that a checker may replace.
"""
