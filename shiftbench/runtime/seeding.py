"""Named random generators: every random choice draws from a generator seeded by what it is for.

A seed derived from (seed, names) means adding a community or a cell never reshuffles another,
and the same names give the same draws on every machine (SHA-256, not Python's string hash).
"""

from __future__ import annotations

import hashlib

import numpy as np


def rng_for(seed: int, *names: str) -> np.random.Generator:
    digest = hashlib.sha256("|".join([str(seed), *names]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def seed_for(seed: int, *names: str) -> int:
    """A 63-bit integer seed for libraries that take one (torch generators)."""
    digest = hashlib.sha256("|".join([str(seed), *names]).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
