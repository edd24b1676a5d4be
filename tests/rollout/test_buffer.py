"""The staleness window of the async ratio alpha (ROLL Flash rules 1-2), on hand-made committed groups."""

import pytest

from gyre.rollout.buffer import GroupBuffer, oldest_quota, staleness_limit
from gyre.types import Group, PromptRecord


def buffer_of(versions):
    buf = GroupBuffer()
    for seq, v in enumerate(versions):
        buf.put(seq, Group(f"g{seq}", PromptRecord(f"p{seq}", "q", [1], "0"), 2, seq, v))
    return buf


def test_limits_and_quota():
    assert [staleness_limit(a) for a in (0, 0.5, 1, 1.5, 2)] == [0, 1, 1, 2, 2]
    # alpha 1.5, batch 8: at most floor(0.5 * 8) = 4 groups exactly 2 versions old; integer alpha: no quota.
    assert oldest_quota(1.5, 8) == 4 and oldest_quota(2, 8) == 8 and oldest_quota(0.25, 6) == 1


def test_synchronous_takes_only_the_current_version():
    buf = buffer_of([3, 4, 4, 4])
    assert not buf.ready(5, 4, 0)  # step 5 trains version 4: the version-3 group is one step stale
    taken = buf.take(5, 3, 0)
    assert [g.group_id for g in taken] == ["g1", "g2", "g3"] and len(buf) == 1


def test_fractional_alpha_caps_the_oldest_share():
    # Step 6 trains version 5; alpha 1.5 allows lags 0..2, lag 2 (version 3) for at most 2 of 4 groups.
    buf = buffer_of([3, 3, 3, 4, 5, 5, 2])
    taken = buf.take(6, 4, 1.5)
    assert [g.admitted_version for g in taken] == [3, 3, 4, 5]  # oldest first, the third version-3 group waits
    assert [g.group_id for g in buf.drop_expired(7, 1.5)] == ["g2", "g6"]  # lag 3 at step 7: out for good
    assert buf.expired == 2


def test_take_refuses_a_short_batch():
    with pytest.raises(RuntimeError, match="needs 3 groups"):
        buffer_of([0, 0]).take(1, 3, 0)
