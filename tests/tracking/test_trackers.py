"""Each tracker against its real library, offline: what MetricsLogger hands it (the config, RL and SFT
metrics, a generations table, then a resume from step 2) is read back from what the library wrote."""

import json
import struct
import time

import pytest

from gyre.tracking.logger import MetricsLogger, read_metrics
from gyre.tracking.trackers import TrackerError, TrackerRun, flatten, markdown_table

CONFIG = {"run": {"name": "tiny", "steps": 3}, "algorithm": {"clip_low": 0.2, "estimator": "grpo"}, "tags": [1, 2]}
ROWS = [{"step": 2, "split": "train", "prompt": "1+1=", "response": "2 | two", "reward": 1.0, "turns": None},
        {"step": 2, "split": "train", "prompt": "go", "response": "left", "reward": 0.0,
         "turns": [{"role": "assistant", "text": "left", "reward": 0.0}]}]
RUN_ID = "abc123def456"


def _run(out, tracker: str):
    """Steps 1-3 (and an SFT step) in a first session; a second one resumes from step 2 and runs step 3 again
    (in a later second: W&B names its offline directory by the second it starts)."""
    run = TrackerRun((tracker,), "tiny-run", RUN_ID)
    log = MetricsLogger(out, run, config=CONFIG)
    log.log(1, {"loss": 0.5}, phase="sft")
    for step in range(1, 4):
        log.log(step, {"reward/mean": step / 10, "bad": float("nan")})
    log.log_table("generations", 2, ROWS)
    log.close()
    time.sleep(1.01 - time.time() % 1)
    resumed = MetricsLogger(out, run, resume_step=2, config=CONFIG)
    resumed.log(3, {"reward/mean": 0.33})
    resumed.close()
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 1, 2, 3]  # the JSONL stays the truth


def test_tensorboard_purges_resumed_steps_and_shows_the_table(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _run(tmp_path, "tensorboard")
    rl = EventAccumulator(str(tmp_path / "tensorboard" / "rl"), size_guidance={"tensors": 0, "scalars": 0}).Reload()
    assert [(e.step, round(e.value, 3)) for e in rl.Scalars("reward/mean")] == [(1, 0.1), (2, 0.2), (3, 0.33)]
    assert "bad" not in rl.Tags()["scalars"]
    table = rl.Tensors("generations/text_summary")[0]
    text = table.tensor_proto.string_val[0].decode()
    assert table.step == 2 and "| step | split | prompt |" in text and "2 \\| two" in text
    assert '"estimator": "grpo"' in rl.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    sft = EventAccumulator(str(tmp_path / "tensorboard" / "sft")).Reload()
    assert [(e.step, e.value) for e in sft.Scalars("loss")] == [(1, 0.5)]


def _wandb_records(path):
    """The protobuf records of a .wandb file (a LevelDB-style log of 32 KiB blocks, 7-byte record headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the rest of a block too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def test_wandb_offline_resume_is_a_second_run_of_the_same_group(tmp_path):
    _run(tmp_path, "wandb")
    # W&B cannot resume offline (a sync of a second directory with the same id replaces the first one's
    # history): the resumed session is run <id>-r1, grouped with the first under gyre's run id.
    files = [next((tmp_path / "wandb").glob(f"offline-run-*-{i}/run-{i}.wandb")) for i in (RUN_ID, f"{RUN_ID}-r1")]
    history, config, tables = [], {}, []
    for path in files:
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                assert (record.run.project, record.run.display_name, record.run.run_group) == (
                    "gyre", "tiny-run", RUN_ID)
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                history.append({k: v for k, v in row.items() if not k.startswith("_")})
    points = [(h["step"], h["reward/mean"]) for h in history if "reward/mean" in h]
    assert points == [(1, 0.1), (2, 0.2), (3, 0.3), (3, 0.33)]
    assert [(h["sft/step"], h["sft/loss"]) for h in history if "sft/loss" in h] == [(1, 0.5)]
    tables = [h for h in history if "generations/_type" in h]
    assert len(tables) == 1 and tables[0]["step"] == 2 and tables[0]["generations/nrows"] == 2
    table_file = next(tmp_path.glob("wandb/offline-run-*/files/media/table/generations_*.table.json"))
    table = json.loads(table_file.read_text())
    assert table["columns"][:3] == ["step", "split", "prompt"] and table["data"][1][-1] == json.dumps(ROWS[1]["turns"])
    assert config["algorithm"] == {"clip_low": 0.2, "estimator": "grpo"} and config["tags"] == [1, 2]


def test_mlflow_file_store_in_the_run_directory(tmp_path):
    from mlflow import MlflowClient

    _run(tmp_path, "mlflow")
    client = MlflowClient(tracking_uri=(tmp_path / "mlflow").resolve().as_uri())
    experiment = client.get_experiment_by_name("gyre")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "tiny-run" and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.data.tags["gyre.run_id"] == RUN_ID
    assert run.data.params["algorithm.estimator"] == "grpo" and run.data.params["tags"] == "[1, 2]"
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.1), (2, 0.2), (3, 0.3), (3, 0.33)]
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "sft/loss")] == [(1, 0.5)]
    local = client.download_artifacts(run.info.run_id, "generations/step_2.json", str(tmp_path / "dl"))
    table = json.loads(open(local).read())
    assert table["columns"][:3] == ["step", "split", "prompt"] and table["data"][0][3] == "2 | two"


def test_trackio_database_in_the_run_directory(tmp_path, monkeypatch):
    import sys

    own_dir = "trackio" not in sys.modules  # trackio fixes its directory at import: only then is it the run's
    if own_dir:
        monkeypatch.setenv("TRACKIO_DIR", "-")  # restored after the test; unset, the tracker sets it
        monkeypatch.delenv("TRACKIO_DIR")
    _run(tmp_path, "trackio")
    from trackio.sqlite_storage import SQLiteStorage

    if own_dir:
        assert (tmp_path / "trackio" / "gyre.db").is_file()
    assert "tiny-run" in SQLiteStorage.get_runs("gyre")
    logs = SQLiteStorage.get_logs("gyre", "tiny-run")
    assert [(r["step"], r["reward/mean"]) for r in logs if "reward/mean" in r] == [(1, 0.1), (2, 0.2), (3, 0.3),
                                                                                    (3, 0.33)]
    assert [(r["step"], r["sft/loss"]) for r in logs if "sft/loss" in r] == [(1, 0.5)]
    table = next(r["generations"] for r in logs if "generations" in r)
    assert table["_type"] == "trackio.table" and table["_value"][0]["response"] == "2 | two"
    config = SQLiteStorage.get_run_config("gyre", "tiny-run")
    assert config["algorithm.estimator"] == "grpo" and config["run.steps"] == 3


def test_the_start_of_a_run_says_where_each_tracker_writes(tmp_path, monkeypatch):
    monkeypatch.delenv("TRACKIO_DIR", raising=False)
    line = TrackerRun(("tensorboard", "wandb", "mlflow", "trackio"), "n", project="p").describe(tmp_path)
    assert f"tensorboard --logdir {tmp_path / 'tensorboard'}" in line
    assert f"W&B project p, offline in {tmp_path / 'wandb'}" in line
    assert f"MLflow experiment p at {(tmp_path / 'mlflow').as_uri()}" in line and "trackio project p in" in line
    assert TrackerRun((), "n").describe(tmp_path) == f"metrics: {tmp_path / 'metrics.jsonl'}"


def test_a_tracker_that_cannot_start_names_itself_and_the_fix(tmp_path):
    (tmp_path / "mlflow").write_text("a file where the store's directory should be")
    with pytest.raises(TrackerError, match=r"logging.trackers: mlflow could not start .*mlflow_tracking_uri"):
        MetricsLogger(tmp_path, TrackerRun(("tensorboard", "mlflow"), "n"))


def test_flatten_and_markdown_table():
    assert flatten({"a": {"b": 1, "c": {}}, "d": [1]}) == {"a.b": 1, "a.c": {}, "d": [1]}
    assert markdown_table([{"x": "a|b", "y": None}]) == "| x | y |\n|---|---|\n| a\\|b | null |"


def test_a_missing_tracker_library_is_a_config_error(monkeypatch):
    import importlib.util

    from gyre.config import load_config
    from gyre.config.load import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"selects wandb.*pip install 'gyre\[trackers\]'"):
        load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", "logging.trackers=[tensorboard,wandb]"])
