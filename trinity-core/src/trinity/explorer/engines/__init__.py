"""Rollout engines; see :mod:`trinity.explorer.engines.base` for the interface."""
