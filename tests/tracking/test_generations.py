"""Sample generations: the deterministic pick, each record's fields (the advantage read back from the
collated batch, multi-turn trajectories whole), the files a run writes and what a resume does to them."""

import json

import pytest

from gyre.data.batching import collate_groups
from gyre.tracking.generations import (
    GenerationRecord,
    GenerationWriter,
    build_record,
    mean_advantages,
    pick_samples,
    read_generations,
)
from gyre.tracking.logger import MetricsLogger
from gyre.types import Group, PromptRecord, RewardResult, Segment, Trajectory, TurnRecord

KEYS = ["step", "split", "group", "sample", "domain", "prompt", "response", "reward", "correct", "advantage",
        "weight_version", "finish_reason", "response_tokens", "turns"]


def decode(ids):
    return "".join(chr(ord("a") + i % 26) for i in ids)


def single(prompt, index, ids, score, version=3):
    return Trajectory(prompt, index, [Segment(ids, [0.0] * len(ids), version)], decode(ids), "eos",
                      RewardResult(score, score > 0.5), "scored")


def group(gid, scores, domain="default"):
    prompt = PromptRecord(gid, f"prompt {gid}", [1, 2], "7", domain=domain)
    samples = [single(prompt, i, [i + 1] * (i + 1), s) for i, s in enumerate(scores)]
    return Group(gid, prompt, len(scores), 0, 3, samples)


def multi_turn(prompt, window=None):
    """Two model turns (tokens 0-1 and 4-6) around a 2-token observation, rewards 0.0 and 1.0."""
    segments = [Segment([10, 11], [0.0, 0.0], 2), Segment([20, 21], [0.0, 0.0], None, trainable=False),
                Segment([12, 13, 14], [0.0] * 3, 3)]
    return Trajectory(prompt, 0, segments, "", "eos", RewardResult(1.0, True), "scored",
                      [TurnRecord(0, 2, 0.0), TurnRecord(4, 7, 1.0)], window)


def test_the_pick_spreads_over_groups_and_shows_both_ends():
    groups = [group(f"g{i}", [0.1 * i, 1.0, 0.0, 0.5]) for i in range(6)]
    picks = pick_samples(groups, 3)  # fewer than groups: groups 0, 2, 4; high, low, high
    assert [(g.group_id, t.sample_index) for g, t in picks] == [("g0", 1), ("g2", 2), ("g4", 1)]
    picks = pick_samples(groups[:2], 5)  # more than groups: 3 + 2, alternating ends within each
    assert [(g.group_id, t.sample_index) for g, t in picks] == [("g0", 1), ("g0", 2), ("g0", 3), ("g1", 2), ("g1", 1)]
    assert pick_samples(groups, 0) == [] and pick_samples([], 4) == []
    assert [id(t) for _, t in pick_samples(groups[:2], 5)] == [id(t) for _, t in picks]  # no randomness


def test_advantage_is_the_mean_over_trained_tokens_of_each_trajectory():
    g0, g1 = group("g0", [1.0, 0.0]), group("g1", [0.5])
    batch, _ = collate_groups([g0, g1], pad_id=0, multiple=4)  # 3 rows and a padding row
    batch.advantages[:] = torch_arange(batch.advantages.shape)
    advantages = mean_advantages([g0, g1], batch)
    for row, t in enumerate([*g0.trajectories, g1.trajectories[0]]):
        mask = batch.response_mask[row]
        assert advantages[id(t)] == pytest.approx(float((batch.advantages[row] * mask).sum() / mask.sum()))
    # by hand: row 1 (sample 1 of g0) trains 2 tokens at positions 2 and 3 of a width-4 batch: 4 + 2, 4 + 3
    assert advantages[id(g0.trajectories[1])] == pytest.approx(6.5)
    record = build_record(4, "train", g0, g0.trajectories[1], decode, advantages[id(g0.trajectories[1])], False)
    assert list(json.loads(json.dumps(record.__dict__))) == KEYS
    assert (record.group, record.sample, record.response, record.reward, record.correct, record.domain) == \
        ("g0", 1, "cc", 0.0, False, None)
    assert (record.weight_version, record.finish_reason, record.response_tokens, record.turns) == (3, "eos", 2, None)


def torch_arange(shape):
    import torch

    return torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape)


def test_a_multi_turn_trajectory_is_written_whole_with_its_step_rows_averaged():
    prompt = PromptRecord("env0", "you are in a maze", [1, 2], "5", domain="maze")
    t = multi_turn(prompt, window=1)  # step-level samples: one row per model turn
    g = Group("e0", prompt, 1, 0, 2, [t])
    batch, _ = collate_groups([g], pad_id=0)
    assert len(batch) == 2
    batch.advantages[0] = 1.0
    batch.advantages[1] = 4.0
    advantage = mean_advantages([g], batch)[id(t)]
    assert advantage == pytest.approx((2 * 1.0 + 3 * 4.0) / 5)  # 2 tokens of turn 1, 3 of turn 2
    record = build_record(1, "train", g, t, decode, advantage, True)
    assert record.turns == [{"role": "assistant", "text": "kl", "reward": 0.0},
                            {"role": "env", "text": "uv", "reward": None},
                            {"role": "assistant", "text": "mno", "reward": 1.0}]
    assert (record.response, record.response_tokens, record.weight_version, record.domain) == \
        ("kluvmno", 5, 2, "maze")


def test_the_writer_follows_its_schedule_and_a_resume_overwrites_its_steps(tmp_path):
    groups = [group("g0", [1.0, 0.0]), group("g1", [0.5, 0.25])]
    batch, _ = collate_groups(groups, pad_id=0)
    logger = MetricsLogger(tmp_path)
    writer = GenerationWriter(tmp_path / "generations", logger, every=2, samples=3, decode=decode,
                              multi_domain=False, last_step=5)
    for step in range(1, 6):
        writer.train(step, groups, batch)
    writer.validation(0, groups)
    assert sorted(p.name for p in (tmp_path / "generations").iterdir()) == \
        ["step_2.jsonl", "step_4.jsonl", "step_5.jsonl", "val_step_0.jsonl"]
    first = read_generations(tmp_path / "generations" / "step_4.jsonl")
    assert [(r.group, r.sample, r.split) for r in first] == [("g0", 0, "train"), ("g0", 1, "train"), ("g1", 1, "train")]
    assert all(r.advantage == 0.0 for r in first)  # nothing filled the advantages here
    assert all(r.advantage is None and r.split == "val" for r in read_generations(
        tmp_path / "generations" / "val_step_0.jsonl"))
    batch.advantages[:] = 1.0
    writer.train(4, groups, batch)  # the resumed run's step 4: replaces the file, no duplicates
    again = read_generations(tmp_path / "generations" / "step_4.jsonl")
    assert len(again) == 3 and all(r.advantage == 1.0 for r in again)
    off = GenerationWriter(tmp_path / "off", logger, every=0, samples=3, decode=decode, multi_domain=False,
                           last_step=5)
    off.train(5, groups, batch)
    off.validation(5, groups)
    assert not (tmp_path / "off").exists()
    logger.close()
    assert isinstance(first[0], GenerationRecord)


def test_a_grpo_run_writes_its_generations(trained_run):
    """The session's 2-step GRPO run (2 prompts x 2 samples per step, 6 validation prompts, validation and
    generations at every step, 3 samples each)."""
    out = trained_run / "generations"
    assert sorted(p.name for p in out.iterdir()) == ["step_1.jsonl", "step_2.jsonl", "val_step_0.jsonl",
                                                     "val_step_1.jsonl", "val_step_2.jsonl"]
    for step in (1, 2):
        lines = (out / f"step_{step}.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        assert len(rows) == 3 and all(list(r) == KEYS for r in rows)
        for r in rows:
            assert r["step"] == step and r["split"] == "train" and r["turns"] is None and r["domain"] is None
            assert r["weight_version"] == step - 1  # synchronous: sampled by the previous step's weights
            assert 1 <= r["response_tokens"] <= 3 and r["finish_reason"] in ("eos", "length", "stop")
            assert 0.0 <= r["reward"] <= 1.0 and isinstance(r["correct"], bool) and r["prompt"]
            assert isinstance(r["advantage"], float) and abs(r["advantage"]) < 10
        assert len({r["group"] for r in rows}) == 2  # both groups of the step
    val = [json.loads(line) for line in (out / "val_step_2.jsonl").read_text().splitlines()]
    assert len(val) == 3 and all(r["split"] == "val" and r["advantage"] is None and r["weight_version"] == 2
                                 for r in val)
    _the_trackers_got_the_tables(trained_run)


def _the_trackers_got_the_tables(run_dir):
    """The run logged to every tracker: its tables are where each library put them."""
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard" / "rl"), size_guidance={"tensors": 0}).Reload()
    assert [e.step for e in events.Tensors("generations/text_summary")] == [1, 2]
    assert [e.step for e in events.Tensors("val/generations/text_summary")] == [0, 1, 2]
    client = MlflowClient(tracking_uri=(run_dir / "mlflow").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("gyre").experiment_id])
    assert {a.path for a in client.list_artifacts(run.info.run_id, "generations")} == \
        {"generations/step_1.json", "generations/step_2.json"}
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/accuracy")] == [0, 1, 2]
    assert len(list(run_dir.glob("wandb/offline-run-*/files/media/table/generations_*.table.json"))) == 2


def test_a_resumed_run_drops_its_generation_files_after_the_checkpoint(tmp_path):
    from gyre.tracking.generations import drop_generations_after

    names = ["step_10.jsonl", "step_20.jsonl", "val_step_20.jsonl", "val_step_30.jsonl", "notes.jsonl"]
    for name in names:
        (tmp_path / name).write_text("{}\n")
    drop_generations_after(tmp_path, 20)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.jsonl", "step_10.jsonl", "step_20.jsonl",
                                                          "val_step_20.jsonl"]
    drop_generations_after(tmp_path, None)  # a restart from scratch: every step runs again
    assert [p.name for p in tmp_path.iterdir()] == ["notes.jsonl"]  # not gyre's: left alone


def test_files_written_before_the_rename_still_read(tmp_path):
    """generations.jsonl called the reward's verdict 'passed' before it became 'correct'."""
    row = {"step": 1, "split": "train", "group": "g", "sample": 0, "domain": None, "prompt": "p", "response": "r",
           "reward": 1.0, "passed": True, "advantage": 0.5, "weight_version": 0, "finish_reason": "eos",
           "response_tokens": 1, "turns": None}
    (tmp_path / "step_1.jsonl").write_text(json.dumps(row) + "\n")
    (record,) = read_generations(tmp_path / "step_1.jsonl")
    assert record.correct is True
