"""Multi-domain data: route each prompt to its reward domain by ``tag``, and draw every training batch
with the configured share of each domain.

Shares are turned into counts by largest-remainder rounding (the rounding error is spread over the
domains with the largest fractional parts, not dumped on the last one as ROLL's floor-and-remainder
does), and each domain walks its own prompts with its own resumable sampler.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gyre.config.reward_schema import RewardConfig
from gyre.data.prompts import DataError
from gyre.data.sampler import EpochSampler
from gyre.seeding import derive_seed
from gyre.types import PromptRecord


def route_domains(records: Sequence[PromptRecord], reward: RewardConfig) -> None:
    """Set ``record.domain`` from its tag; a tag (or a missing tag) no domain scores is a load-time error."""
    if reward.single:
        for record in records:
            record.domain = "default"
        return
    owner = {tag: name for name in reward.domains for tag in reward.tags_of(name)}
    for record in records:
        name = owner.get(record.tag) if record.tag is not None else None
        if name is None:
            what = f"tag {record.tag!r}" if record.tag is not None else "no tag"
            raise DataError(f"{record.uid}: the prompt has {what}, which no reward domain scores (tags: "
                            f"{', '.join(sorted(owner))}); add it to a domain's reward.domains.<name>.tags")
        record.domain = name


def largest_remainder(total: int, shares: Mapping[str, float]) -> dict[str, int]:
    """Integer counts summing to ``total`` and proportional to ``shares`` (largest-remainder method;
    ties go to the domain listed first)."""
    weight = sum(shares.values())
    exact = {name: total * s / weight for name, s in shares.items()}
    counts = {name: math.floor(v) for name, v in exact.items()}
    order = sorted(exact, key=lambda n: -(exact[n] - counts[n]))
    for name in order[:total - sum(counts.values())]:
        counts[name] += 1
    return counts


class DomainSampler:
    """Per-domain epoch samplers and the per-step counts of a ratio-mixed batch."""

    def __init__(self, records: Sequence[PromptRecord], shares: Mapping[str, float], seed: int, shuffle: bool):
        self.members = {name: [i for i, r in enumerate(records) if r.domain == name] for name in shares}
        empty = [name for name, idx in self.members.items() if not idx]
        if empty:
            raise DataError(f"reward domains {empty} have a ratio but no training prompts tagged for them")
        self.shares = dict(shares)
        self.samplers = {name: EpochSampler(len(idx), derive_seed(seed, "domain", name), shuffle)
                         for name, idx in self.members.items()}

    def take(self, k: int) -> list[int]:
        """Indices into the full record list: each domain's count of prompts, domain after domain."""
        out: list[int] = []
        for name, count in largest_remainder(k, self.shares).items():
            out.extend(self.members[name][j] for j in self.samplers[name].take(count))
        return out

    def state_dict(self) -> dict:
        return {"domains": {name: s.state_dict() for name, s in self.samplers.items()}}

    def load_state_dict(self, state: dict) -> None:
        domains = state.get("domains")
        if domains is None or set(domains) != set(self.samplers):
            raise ValueError(f"the checkpointed data position is for domains {sorted(domains or [])}, this run has "
                             f"{sorted(self.samplers)}")
        for name, sampler in self.samplers.items():
            sampler.load_state_dict(domains[name])
