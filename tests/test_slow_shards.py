"""Rotating shards of the slow tests (tests/slow_shards.py): every slow test is in exactly one shard, the
shards fit the budget, and consecutive commits run the shards in turn."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import slow_shards

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = {"a": 300.0, "b": 145.0, "c": 60.0, "d": 50.0, "e": 40.0, "f": 30.0, "g": 20.0, "h": 5.0}


def test_shards_hold_each_test_once_and_fit_the_budget_unless_one_test_alone_is_longer():
    count = slow_shards.shard_count(DURATIONS, 120.0)
    assert count == 4  # 300 s and 145 s alone, the other 205 s in two
    shards = slow_shards.partition(DURATIONS, count)
    assert sorted(n for shard in shards for n in shard) == sorted(DURATIONS)
    loads = sorted(sum(DURATIONS[n] for n in shard) for shard in shards)
    assert loads == [95.0, 110.0, 145.0, 300.0]
    assert slow_shards.shard_count({"a": 70.0, "b": 60.0, "c": 60.0}, 120.0) == 2  # 190 s, but 70 + 60 > 120
    assert shards == slow_shards.partition(dict(reversed(DURATIONS.items())), count)  # order does not matter


def test_a_test_not_measured_yet_counts_as_the_median():
    assert slow_shards.estimates(["a", "c", "new"], DURATIONS) == {"a": 300.0, "c": 60.0, "new": 180.0}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def test_consecutive_commits_run_every_shard_in_turn(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    count = slow_shards.shard_count(DURATIONS, 120.0)
    runs = []
    for i in range(count):
        git(repo, "commit", "-q", "--allow-empty", "-m", f"landing {i}")
        chosen, note = slow_shards.choose("auto", list(DURATIONS), repo, 120.0, DURATIONS)
        assert f"commit {i + 1} of HEAD's history" in note
        runs += chosen
    assert sorted(runs) == sorted(DURATIONS)  # each slow test once in `count` one-commit landings
    # a shallow clone has no history to count: the day picks the shard
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    assert "day" in slow_shards.choose("auto", list(DURATIONS), shallow, 120.0, DURATIONS)[1]


def test_a_shard_can_be_asked_for_by_number():
    shards = slow_shards.partition(DURATIONS, 3)
    assert slow_shards.choose("2/3", list(DURATIONS), ROOT, measured=DURATIONS)[0] == shards[1]
    for bad in ("0/3", "4/3", "x", "1/0"):
        with pytest.raises(ValueError, match="auto or K/N"):
            slow_shards.choose(bad, list(DURATIONS), ROOT, measured=DURATIONS)


def test_the_measured_durations_name_tests_that_exist():
    """A renamed or deleted slow test leaves a stale entry: remeasure with `make slow-durations`."""
    for nodeid in slow_shards.load_durations():
        path, name = nodeid.split("::")[0], nodeid.split("::")[1].split("[")[0]
        assert f"def {name}(" in (ROOT / path).read_text(), nodeid
