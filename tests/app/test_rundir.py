"""One run per output directory: fresh, resume, resume auto and overwrite; run ids; nothing deleted."""

import json

import pytest

from gyre.app.rundir import RunDirError, begin, decide_start, read_run_id
from gyre.training.checkpoint import CheckpointManager, DriverState, ResumeError


def _checkpoint(out, step, run_id, keep_last=5):
    mgr = CheckpointManager(out, keep_last=keep_last, run_id=run_id)
    tmp = mgr.begin(step)
    return mgr.commit(tmp, DriverState(step=step, data={}, weight_version=step, run_steps=9))


def _start(out, mode, messages=None):
    return begin(decide_start(out, mode), "t", (messages if messages is not None else []).append)


def test_fresh_start_records_a_run_id_and_refuses_a_used_directory(tmp_path):
    out = tmp_path / "run"
    start = _start(out, "fresh")
    assert start.checkpoint is None and read_run_id(out) == start.run_id
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match="--resume.*--overwrite"):
        decide_start(out, "fresh")
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'  # refused: nothing touched


def test_files_gyre_did_not_write_do_not_make_a_run(tmp_path):
    out = tmp_path / "quickstart"
    for name in ("model", "data"):
        (out / name).mkdir(parents=True)
    assert decide_start(out, "fresh").set_aside == ()


def test_overwrite_moves_the_run_aside_and_keeps_other_files(tmp_path):
    out = tmp_path / "run"
    first = _start(out, "fresh")
    _checkpoint(out, 2, first.run_id)
    (out / "metrics.jsonl").write_text("old\n")
    (out / "model").mkdir()
    messages = []
    second = _start(out, "overwrite", messages)
    aside = tmp_path / messages[0].split(" to ")[1].split(";")[0]
    assert aside.name.startswith("run.old-") and (aside / "metrics.jsonl").read_text() == "old\n"
    assert (aside / "checkpoints" / "step_000002" / "driver.json").is_file()
    assert read_run_id(aside) == first.run_id and read_run_id(out) == second.run_id != first.run_id
    assert sorted(p.name for p in out.iterdir()) == ["model", "run.json"]


def test_resume_needs_a_checkpoint_and_names_the_directory(tmp_path):
    out = tmp_path / "run"
    _start(out, "fresh")
    with pytest.raises(ResumeError, match=f"no checkpoint in {out / 'checkpoints'}"):
        decide_start(out, "resume")
    with pytest.raises(ResumeError, match="no checkpoint"):
        decide_start(tmp_path / "never", "resume")


def test_resume_auto_resumes_or_sets_a_partial_run_aside(tmp_path):
    out = tmp_path / "run"
    assert decide_start(out, "auto").checkpoint is None  # nothing there: fresh
    first = _start(out, "fresh")
    messages = []
    partial = _start(out, "auto", messages)  # files but no checkpoint: set aside, fresh
    assert "no checkpoint" in messages[0] and "moved" in messages[0] and partial.run_id != first.run_id
    path = _checkpoint(out, 4, partial.run_id)
    resumed = _start(out, "auto")
    assert (resumed.checkpoint, resumed.run_id) == (path, partial.run_id)


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    out = tmp_path / "run"
    _start(out, "fresh")
    _checkpoint(out, 2, "someoneelse0")
    with pytest.raises(ResumeError, match="written by run someoneelse0"):
        decide_start(out, "resume")


def test_checkpoints_without_a_run_json_are_adopted(tmp_path):
    out = tmp_path / "run"
    _checkpoint(out, 2, "")  # written before run ids existed
    start = _start(out, "resume")
    assert start.checkpoint.name == "step_000002" and read_run_id(out) == start.run_id


def test_pruning_goes_by_step_number_and_spares_latest(tmp_path):
    for step in (999999, 1000000, 1000001):  # name order would put 1000000 before 999999
        _checkpoint(tmp_path, step, "r", keep_last=2)
    mgr = CheckpointManager(tmp_path, keep_last=1, run_id="r")
    assert [p.name for _, p in mgr.complete()] == ["step_1000000", "step_1000001"]
    # A run resumed from an older checkpoint than the highest on disk: the one latest names stays.
    (mgr.root / "latest").write_text("step_1000000")
    mgr._prune()
    assert [p.name for _, p in mgr.complete()] == ["step_1000000", "step_1000001"]


def test_latest_falls_back_to_the_highest_complete_checkpoint(tmp_path):
    mgr = CheckpointManager(tmp_path, run_id="r")
    _checkpoint(tmp_path, 2, "r")
    _checkpoint(tmp_path, 4, "r")
    (mgr.root / "latest").write_text("step_000009")  # stale: names a deleted checkpoint
    assert mgr.latest().name == "step_000004"
    (mgr.root / "latest").unlink()
    (mgr.root / "step_000006").mkdir()  # incomplete (no driver.json): never a resume point
    assert mgr.latest().name == "step_000004"
    assert json.loads((mgr.latest() / "driver.json").read_text())["run_id"] == "r"


def test_an_ablation_directory_is_refused_resumed_or_set_aside(tmp_path):
    from gyre.app.ablation import prepare_ablation_dir

    out = tmp_path / "ablation"
    (out / "data").mkdir(parents=True)  # the quickstart task, not an ablation's output
    assert prepare_ablation_dir(out, "fresh", print) is False
    with pytest.raises(ResumeError, match="no ablation"):
        prepare_ablation_dir(out, "resume", print)
    (out / "grpo" / "seed0").mkdir(parents=True)
    (out / "grpo" / "seed0" / "metrics.jsonl").write_text("{}\n")
    (out / "ablation.md").write_text("# table")
    with pytest.raises(RunDirError, match="already holds an ablation"):
        prepare_ablation_dir(out, "fresh", print)
    assert prepare_ablation_dir(out, "resume", print) is True
    messages = []
    prepare_ablation_dir(out, "overwrite", messages.append)
    assert sorted(p.name for p in out.iterdir()) == ["data"] and "moved" in messages[0]
    aside = next(tmp_path.glob("ablation.old-*"))
    assert sorted(p.name for p in aside.iterdir()) == ["ablation.md", "grpo"]


def test_a_new_run_records_its_hub_snapshots_and_a_resumed_one_keeps_them(tmp_path):
    from gyre.app.rundir import read_hub_pins
    from gyre.models.hub import HubPin

    out = tmp_path / "run"
    pins = {"model.path": HubPin("org/tiny", "v2", "b" * 40)}
    start = begin(decide_start(out, "fresh"), "t", [].append, pins)
    assert read_hub_pins(out) == pins
    _checkpoint(out, 1, start.run_id)
    begin(decide_start(out, "resume"), "t", [].append, {"model.path": HubPin("org/tiny", "v2", "c" * 40)})
    assert read_hub_pins(out) == pins  # the record of the run's start, not of the resume
    (out / "run.json").write_text(json.dumps({"run_id": start.run_id}))  # a run recorded before hub_models
    assert read_hub_pins(out) == {} and read_hub_pins(tmp_path / "none") == {}
