import pytest
import torch

from gyre.data.batching import balanced_shards, collate, gather_rows, split_for_ranks


def test_collate_aligns_per_token_fields_with_input_ids():
    b = collate([[5, 6], [7]], [[8, 9, 2], [3]], pad_id=0, advantages=[1.5, -1.0],
                rollout_logprobs=[[-0.1, -0.2, -0.3], [-0.4]])
    assert b.input_ids.tolist() == [[5, 6, 8, 9, 2], [7, 3, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert b.response_mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]
    assert b.advantages[0].tolist() == [0, 0, 1.5, 1.5, 1.5]
    assert torch.allclose(b.rollout_logprobs[1], torch.tensor([0, -0.4, 0, 0, 0]))


def test_balanced_shards_equal_counts_and_balanced_tokens():
    lengths = [10, 1, 9, 2, 8, 3]
    b = collate([[1] * n for n in lengths], [[2]] * 6, pad_id=0)
    shards = balanced_shards(b, 2)
    assert [len(s) for s in shards] == [3, 3]
    loads = [sum(lengths[i] + 1 for i in s.tolist()) for s in shards]
    # Token loads (length + 1 response token) 11, 2, 10, 3, 9, 4 sum to 39; with three rows per rank the best
    # split is 18 / 21 ({11, 4, 3} vs {10, 9, 2}), which the greedy assignment finds.
    assert sorted(loads) == [18, 21]
    assert sorted(torch.cat(shards).tolist()) == list(range(6))


def test_gather_rows_inverts_split():
    b = collate([[1, 2, 3], [4], [5, 6], [7]], [[8], [9, 9], [1], [2]], pad_id=0)
    parts, index = split_for_ranks(b, 2)
    back = gather_rows([p.input_ids for p in parts], index, len(b))
    assert torch.equal(back, b.input_ids)


def test_unequal_shards_for_forward_only_workers():
    b = collate([[1]] * 7, [[2]] * 7, pad_id=0)
    shards = balanced_shards(b, 3, equal=False)
    assert sorted(len(s) for s in shards) == [2, 2, 3]
    assert sorted(torch.cat(shards).tolist()) == list(range(7))


def test_groups_collate_with_a_non_contiguous_trainable_mask_and_token_versions():
    from gyre.data.batching import GroupLayout, collate_groups
    from gyre.types import Group, PromptRecord, Segment, Trajectory

    p = PromptRecord("p", "q", [1, 2], "0")
    # A two-turn trajectory: model tokens (version 3), an observation (not trained), model tokens (version 4).
    turns = Trajectory(p, 0, [Segment([5, 6], [-0.1, -0.2], 3), Segment([9], [0.0], None, trainable=False),
                              Segment([7], [-0.3], 4)])
    single = Trajectory(p, 1, [Segment([8], [-0.4], 4)])
    other = Trajectory(PromptRecord("r", "q", [3], "0"), 0, [Segment([4, 4], [-1.0, -1.0], 4)])
    groups = [Group("g0", p, 2, 0, 3, [turns, single]), Group("g1", other.prompt, 1, 0, 4, [other])]
    batch, layout = collate_groups(groups, pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 5, 6, 9, 7], [1, 2, 8, 0, 0, 0], [3, 4, 4, 0, 0, 0]]
    assert batch.response_mask.tolist()[0] == [0, 0, 1, 1, 0, 1]
    assert batch.versions.tolist()[0] == [-1, -1, 3, 3, -1, 4]
    assert batch.rollout_logprobs[0].tolist() == pytest.approx([0, 0, -0.1, -0.2, 0, -0.3])
    assert turns.weight_version == 3 and turns.response_ids == [5, 6, 9, 7]
    assert layout == GroupLayout(((0, 1), (2,)))
    with pytest.raises(ValueError, match="unequal sizes"):
        layout.gather(torch.zeros(3))
    equal = GroupLayout(((2, 0), (1, 3)))  # rows need not be contiguous: statistics follow the layout
    grouped = equal.gather(torch.tensor([10.0, 11.0, 12.0, 13.0]))
    assert grouped.tolist() == [[12.0, 10.0], [11.0, 13.0]]
    assert equal.scatter(grouped).tolist() == [10.0, 11.0, 12.0, 13.0]
