"""A run whose model is a Hub id in a local Hugging Face cache: resolved once on the driver, printed,
trained through Ray actors, and saved in the input's dtype with the user's tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gyre.app import launch
from gyre.app.cli import main
from gyre.config import load_config
from tests.hub_cache import cache_model
from tests.models.test_hub import MAIN, V2, user_model

REWARD = Path(__file__).with_name("reward_fns.py")


@pytest.fixture(scope="module")
def cache(tmp_path_factory, tiny_model_dir):
    """org/tiny (a bfloat16 model, custom tokenizer config) in a Hub cache of its own."""
    root = tmp_path_factory.mktemp("hub")
    model = user_model(root / "user_model", tiny_model_dir)
    cache_model(root / "hub", "org/tiny", model, MAIN)
    return root / "hub", model


def run_args(tmp_path, data, *extra):
    return [f"run.output_dir={tmp_path / 'run'}", "run.steps=1", "model.path=org/tiny",
            f"data.train_files=[{data['train']}]", "rollout.mode=hybrid", "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2", "rollout.sampling.max_new_tokens=3", "policy.micro_batch_size=4",
            "reward.type=function", f"reward.function={REWARD}:digit_fraction", "logging.progress=false",
            "logging.trackers=[]", "logging.plot=false", "cluster.cpu_slots=2", *extra]


def test_check_prints_the_resolved_snapshot_and_dtypes(cache, arithmetic_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(cache[0]))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": {"path": "org/tiny", "revision": "main"}}))
    assert main(["check", str(config), *run_args(tmp_path, arithmetic_data)[1:]]) == 0
    out = capsys.readouterr().out
    snapshot = cache[0] / "models--org--tiny" / "snapshots" / MAIN
    assert f"path: {snapshot}" in out and "save_dtype: bfloat16" in out
    assert f"org/tiny at commit {MAIN[:12]}" in out and "final model saved in bfloat16" in out


def test_an_uncached_id_stops_the_run_before_ray_with_the_download_command(arithmetic_data, tmp_path, monkeypatch,
                                                                           capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    args = run_args(tmp_path, arithmetic_data, "model.path=Qwen/Qwen2.5-0.5B-Instruct")
    assert main(["train", str(_empty_config(tmp_path)), *args]) == 2
    err = capsys.readouterr().err
    assert "`hf download Qwen/Qwen2.5-0.5B-Instruct`" in err and "init-model" not in err
    assert not (tmp_path / "run").exists()


def _empty_config(tmp_path: Path) -> Path:
    path = tmp_path / "empty.yaml"
    path.write_text("{}\n")
    return path


@pytest.mark.slow  # make test-all; the README walkthrough test trains a Hub id run by default
def test_a_hub_id_run_saves_the_input_dtype_and_resumes_with_its_first_snapshot(ray_local, cache, tiny_model_dir,
                                                                               arithmetic_data, tmp_path, monkeypatch,
                                                                               capsys):
    """The run records the commit main pointed to; main then moves to another snapshot (a float32 model), and
    the resumed run still loads the first (bfloat16) one; once the cache loses it, resuming is refused."""
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    first = cache_model(hub, "org/tiny", cache[1], MAIN)
    args = run_args(tmp_path, arithmetic_data, "model.attn_implementation=eager", "checkpoint.every=1")
    launch.train(load_config(None, args), echo=lambda s: None)
    run = tmp_path / "run"
    assert json.loads((run / "run.json").read_text())["hub_models"] == {
        "model.path": {"repo_id": "org/tiny", "revision": None, "commit": MAIN}}
    cache_model(hub, "org/tiny", tiny_model_dir, V2)  # main moves on
    lines = []
    summary = launch.train(load_config(None, [*args, "run.steps=2"]), mode="resume", echo=lines.append)
    assert f"model.path=org/tiny: commit {MAIN[:12]}, the snapshot this run started from (run.json)" in lines
    assert not any("config differs" in line for line in lines)
    resolved = yaml.safe_load((run / "resolved_config.yaml").read_text())
    assert resolved["model"]["path"] == str(first) and resolved["model"]["save_dtype"] == "bfloat16"
    out = Path(summary.final_model)
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.bfloat16"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (cache[1] / name).read_bytes(), name
    # The first snapshot leaves the cache: resuming stops before Ray, saying how to get it back.
    first.rename(first.with_name("gone"))
    assert main(["train", str(_empty_config(tmp_path)), *args, "run.steps=3", "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"this run started from commit {MAIN[:12]} of org/tiny" in err and "no longer holds that snapshot" in err
    assert f"`hf download org/tiny --revision {MAIN}`" in err
