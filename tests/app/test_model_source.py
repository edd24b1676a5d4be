"""What eval, export and generate accept as a model: model directories, cached Hub ids, runs, checkpoints."""

import json
import shutil

import pytest

from gyre.app.model_source import SourceError, resolve_source
from gyre.models.checks import ModelPathError
from tests.hub_cache import cache_model
from tests.models.test_hub import MAIN


def test_model_directories_and_cached_hub_ids(tiny_model_dir, tmp_path, monkeypatch):
    source = resolve_source(str(tiny_model_dir))
    assert (source.kind, source.path, source.run_dir, source.stored_dtype()) == ("model", tiny_model_dir, None,
                                                                                 "float32")
    snapshot = cache_model(tmp_path / "hub", "org/tiny", tiny_model_dir, MAIN)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_source("org/tiny").path == snapshot
    with pytest.raises(ModelPathError, match="`hf download org/other`"):
        resolve_source("org/other")
    with pytest.raises(SourceError, match="does not exist. Give a Hugging Face model directory"):
        resolve_source(str(tmp_path / "nothing"))
    with pytest.raises(SourceError, match="neither a Hugging Face model directory"):
        resolve_source(str(tmp_path))
    with pytest.raises(SourceError, match="--step picks a checkpoint of a run"):
        resolve_source(str(tiny_model_dir), step=1)


def test_a_run_its_checkpoints_and_its_final_model(trained_run, tiny_model_dir):
    final = resolve_source(str(trained_run))
    assert (final.kind, final.path, final.run_dir) == ("model", trained_run / "final_model", trained_run)
    assert final.run_config["run"]["steps"] == 2  # the run's settings come along (eval reuses them)
    latest = resolve_source(str(trained_run / "checkpoints"))
    assert (latest.kind, latest.step, latest.base_model) == ("checkpoint", 2, tiny_model_dir)
    one = resolve_source(str(trained_run), step=1)
    assert one.path == trained_run / "checkpoints" / "step_000001" and one.label.endswith("checkpoint step 1")
    assert resolve_source(str(one.path)) == one
    assert one.tokenizer_dir == tiny_model_dir and one.stored_dtype() == "float32"
    with pytest.raises(SourceError, match="no complete checkpoint of step 5; complete checkpoints: steps 1, 2"):
        resolve_source(str(trained_run), step=5)


def fake_run(root, steps=(), config=True):
    """A run directory holding empty checkpoints of ``steps`` (the layout only)."""
    for step in steps:
        (root / "checkpoints" / f"step_{step:06d}" / "policy").mkdir(parents=True)
        (root / "checkpoints" / f"step_{step:06d}" / "driver.json").write_text(json.dumps({"step": step}))
    root.mkdir(parents=True, exist_ok=True)
    (root / "run.json").write_text("{}")
    if config:
        (root / "resolved_config.yaml").write_text("model: {path: /gone/model}\n")
    return root


def test_runs_that_cannot_be_read_say_why(tmp_path, trained_run):
    with pytest.raises(SourceError, match="neither a final model .* nor a complete checkpoint"):
        resolve_source(str(fake_run(tmp_path / "empty")))
    torn = fake_run(tmp_path / "torn", steps=(3,))
    (torn / "checkpoints" / "step_000003").rename(torn / "checkpoints" / "step_000004.tmp")
    with pytest.raises(SourceError, match="incomplete checkpoint .* the run has no complete checkpoint"):
        resolve_source(str(torn / "checkpoints" / "step_000004.tmp"))
    with pytest.raises(SourceError, match=r"the run's model /gone/model \(model.path in"):
        resolve_source(str(fake_run(tmp_path / "moved", steps=(1,))))
    with pytest.raises(SourceError, match="resolved_config.yaml \\(which names it\\) is missing"):
        resolve_source(str(fake_run(tmp_path / "bare", steps=(1,), config=False)))
    copy = tmp_path / "copy"
    shutil.copytree(trained_run / "checkpoints" / "step_000001", copy / "checkpoints" / "step_000001")
    (copy / "checkpoints" / "step_000001" / "driver.json").unlink()
    with pytest.raises(SourceError, match="not a complete checkpoint"):
        resolve_source(str(copy / "checkpoints" / "step_000001"))
