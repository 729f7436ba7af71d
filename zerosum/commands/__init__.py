"""Subcommands of the zerosum CLI (one module each, imported lazily)."""
