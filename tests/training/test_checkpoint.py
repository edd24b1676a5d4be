from gyre.training.checkpoint import CheckpointManager, DriverState


def _save(mgr, step):
    tmp = mgr.begin(step)
    (tmp / "policy" / "shard").write_text(str(step))
    return mgr.commit(tmp, DriverState(step=step, data={"epoch": 0, "index": step}, weight_version=step, run_steps=9))


def test_commit_publishes_latest_and_prunes(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    assert mgr.latest() is None
    for step in (2, 4, 6):
        _save(mgr, step)
    assert mgr.latest().name == "step_000006"
    assert sorted(p.name for p in mgr.root.glob("step_*")) == ["step_000004", "step_000006"]
    assert mgr.load_state(mgr.latest()).data == {"epoch": 0, "index": 6}


def test_torn_checkpoint_is_ignored(tmp_path):
    mgr = CheckpointManager(tmp_path)
    _save(mgr, 2)
    tmp = mgr.begin(4)  # killed while writing step 4: never committed
    (tmp / "policy" / "shard").write_text("partial")
    assert mgr.latest().name == "step_000002"
    mgr.clean_partial()
    assert not tmp.exists()
