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
