"""Slow tests in rotating shards, so that CI runs every one of them regularly within its time budget.

``make test`` leaves the tests marked slow out; ``make test-all`` runs them all (about half an hour on a
2-core CPU), too long for every landing. ``pytest --slow-shard=auto`` (CI: ``make test SLOW_SHARD=auto``)
adds one shard of them to the run: the slow tests collected are packed into shards of at most
``--slow-budget`` seconds each (longest first, each to the emptiest shard; a test longer than that alone
in one) by their measured durations
(``slow_durations.json``; a test not measured yet counts as the median), and the shard is the number of
commits in HEAD's history modulo the number of shards. Every landing adds at least one commit, so
consecutive landings run different shards and one commit per landing runs every shard in turn. Without
the history (a shallow clone, no git) the day number picks the shard instead. ``--slow-shard=K/N`` runs
shard K (1-based) of N shards; the same commit and table always give the same shard.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import time
from pathlib import Path

DURATIONS = Path(__file__).with_name("slow_durations.json")
"""nodeid -> seconds (setup, call and teardown) of each slow test, from ``make slow-durations``."""
BUDGET_S = 120.0
MARK = "slow_shard"


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def estimates(nodeids: list[str], measured: dict[str, float]) -> dict[str, float]:
    known = [measured[n] for n in nodeids if n in measured]
    default = statistics.median(known) if known else BUDGET_S / 4
    return {n: measured.get(n, default) for n in nodeids}


def partition(durations: dict[str, float], count: int) -> list[list[str]]:
    """``count`` shards of about equal total duration: longest first, each into the emptiest shard (the
    first of equals), so the packing depends only on the durations and the node ids."""
    shards: list[list[str]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for nodeid in sorted(durations, key=lambda n: (-durations[n], n)):
        i = loads.index(min(loads))
        shards[i].append(nodeid)
        loads[i] += durations[nodeid]
    return shards


def shard_count(durations: dict[str, float], budget_s: float) -> int:
    """The fewest shards that keep each within ``budget_s``, but for a test longer than that alone in one."""
    alone = sum(d > budget_s for d in durations.values())
    count = max(1, alone + math.ceil(sum(d for d in durations.values() if d <= budget_s) / budget_s))
    while count < len(durations) and any(
            sum(durations[n] for n in shard) > budget_s for shard in partition(durations, count) if len(shard) > 1):
        count += 1
    return count


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=30).stdout


def rotation(root: Path) -> tuple[int, str]:
    """The number that picks the shard, and what it is: HEAD's commit count, or the day number."""
    try:
        if _git(root, "rev-parse", "--is-shallow-repository").strip() == "false":
            count = int(_git(root, "rev-list", "--count", "HEAD"))
            return count, f"commit {count} of HEAD's history"
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    day = int(time.time() // 86400)
    return day, f"day {day} (no commit history here)"


def choose(spec: str, nodeids: list[str], root: Path, budget_s: float = BUDGET_S,
           measured: dict[str, float] | None = None) -> tuple[list[str], str]:
    """The node ids of the shard ``spec`` ("auto" or "K/N") picks among ``nodeids``, and a line saying which."""
    durations = estimates(nodeids, load_durations() if measured is None else measured)
    if spec == "auto":
        count = shard_count(durations, budget_s)
        number, why = rotation(root)
        index = number % count
    else:
        try:
            k, n = (int(x) for x in spec.split("/"))
        except ValueError:
            raise ValueError(f"--slow-shard={spec}: give auto or K/N (shard K of N, 1 <= K <= N)") from None
        if not 1 <= k <= n:
            raise ValueError(f"--slow-shard={spec}: give auto or K/N (shard K of N, 1 <= K <= N)")
        count, index, why = n, k - 1, "asked for"
    chosen = partition(durations, count)[index]
    total = sum(durations[n] for n in chosen)
    return chosen, (f"slow shard {index + 1} of {count} ({why}): {len(chosen)} of {len(nodeids)} slow tests, "
                    f"about {total:.0f} s measured")


def record(path: Path, seconds: dict[str, float]) -> None:
    """Merge measured durations into the table (rounded; sorted for a readable diff)."""
    table = load_durations(path)
    table.update({k: round(v, 1) for k, v in seconds.items()})
    path.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
