"""Checkpointed records: a group's prompt keeps its data columns through a checkpoint's JSON."""

import json

from gyre.types import Group, PromptRecord, RewardResult, Segment, Trajectory


def test_a_group_round_trips_through_json_with_its_prompt_columns():
    prompt = PromptRecord("f.jsonl:1", "2+2=", [5, 6], "4", tag="math",
                          columns={"difficulty": 2, "tests": {"asserts": ["assert f() == 4"]}, "note": None})
    sample = Trajectory(prompt=prompt, sample_index=0, segments=[Segment([7], [-0.5], 0)], response_text="4",
                        finish_reason="eos", reward=RewardResult(1.0, True), status="scored")
    group = Group("g0", prompt, size=1, seed=3, admitted_version=0, trajectories=[sample])
    back = Group.from_dict(json.loads(json.dumps(group.to_dict())))
    assert back == group and back.prompt.columns["tests"] == {"asserts": ["assert f() == 4"]}
    # A checkpoint written before prompts had columns still loads.
    old = group.to_dict()
    del old["prompt"]["columns"]
    assert Group.from_dict(old).prompt.columns == {}


def test_metric_sums_keep_tensors_on_their_device_until_read_and_agree_with_floats():
    import pickle

    import torch

    from gyre.types import MetricSums

    lazy, eager = MetricSums(), MetricSums()
    for total, count in ((torch.tensor(1.5), torch.tensor(3)), (torch.tensor(-0.25), torch.tensor(2.0))):
        lazy.add("loss", total * 2, count)  # a graph-free copy is kept, not a float yet
        eager.add("loss", float(total * 2), float(count))
    lazy.add("lr", 0.1)
    assert len(lazy._pending) == 2 and lazy.sums == {"lr": 0.1}
    grad = torch.tensor(2.0, requires_grad=True)
    lazy.add("kl", grad * 3, 1.0)
    assert not lazy._pending[-1][1].requires_grad  # detached on entry
    shipped = pickle.loads(pickle.dumps(lazy))  # crossing to the driver settles first
    assert shipped._pending == [] and shipped.means() == {"loss": (3.0 - 0.5) / 5, "lr": 0.1, "kl": 6.0}
    assert lazy.means()["loss"] == eager.means()["loss"]
