"""torch's generators seeded for a run: each backend seeds its own framework (core seeds Python's and NumPy's:
core/policies/seeding.py), with the plan's seed, as its fit starts."""

from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what cuBLAS needs to be deterministic (torch's docs)


def seed_torch(seed: int, deterministic: bool) -> None:
    """Seed torch's generators (every device's) with `seed`; with `deterministic`, torch's deterministic algorithms
    (a warning where an operation has none) and the cuBLAS workspace setting they need (unless the caller set one)."""
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        os.environ.setdefault(*CUBLAS_WORKSPACE)
