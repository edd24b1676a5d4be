"""Seeds for every random stream, derived from the one run seed.

``derive_seed(run_seed, "rollout", step, prompt)`` gives the same value on every machine and in every
process (unlike Python's salted ``hash``), so a run with the same seed reproduces its samples and a
resumed run continues the same streams.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # non-negative int64
