"""Optimizer semantics and the lr schedule, defined once for every backend."""
