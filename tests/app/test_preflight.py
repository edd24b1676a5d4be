"""Pre-flight notes that need the model's own files."""

import pytest

from gyre.app.preflight import context_note
from gyre.config import load_config


def test_a_context_longer_than_the_models_positions_is_warned_about(tiny_model_dir):
    """The tiny preset knows 1024 positions: 1000 prompt tokens and 100 new ones do not fit."""
    base = [f"model.path={tiny_model_dir}", "data.train_files=[t.jsonl]", "rollout.sampling.max_new_tokens=100"]
    note = context_note(load_config(None, [*base, "data.max_prompt_tokens=1000"]))
    assert note == ("warning: data.max_prompt_tokens=1000 + rollout.sampling.max_new_tokens=100 = 1100 tokens, past "
                    "the model's max_position_embeddings=1024 (its config.json): a sample that long runs past the "
                    "positions the model knows; lower one of them")
    assert context_note(load_config(None, [*base, "data.max_prompt_tokens=924"])) is None  # exactly 1024 fits


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tiny_model_dir, tmp_path):
    """Ids past the embedding would index out of range on the first forward pass (a CUDA assert on a GPU)."""
    import json
    import shutil

    from gyre.app.preflight import check_policy_model
    from gyre.config.schema import ModelConfig
    from gyre.models.loading import ModelPathError

    small = shutil.copytree(tiny_model_dir, tmp_path / "small")
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 50}))
    check_policy_model(ModelConfig(path=str(tiny_model_dir)))  # its own tokenizer fits
    with pytest.raises(ModelPathError, match=r"the tokenizer of model.path has 101 tokens but the model's embedding "
                                             r"has 50 rows .* resize the embeddings"):
        check_policy_model(ModelConfig(path=str(small)))


def test_model_dtype_auto_is_bfloat16_on_gpus_and_float32_on_cpu(tiny_model_dir):
    from gyre.app.preflight import resolve_policy_model
    from gyre.config.derive import make_plan

    base = [f"model.path={tiny_model_dir}", "data.train_files=[t.jsonl]"]
    for device, dtype in (("cpu", "float32"), ("cuda", "bfloat16")):
        cfg = load_config(None, [*base, f"cluster.device={device}"])
        assert cfg.model.dtype == "auto"
        resolve_policy_model(cfg.model, cluster=cfg.cluster)
        assert cfg.model.dtype == dtype
    # Joining a cluster, auto cannot see its GPUs: float32, and the plan warns once it counts them.
    cfg = load_config(None, [*base, "cluster.address=auto"])
    resolve_policy_model(cfg.model, cluster=cfg.cluster)
    assert cfg.model.dtype == "float32"
    notes = make_plan(cfg, "cuda", 2).notes
    assert any(n.startswith("warning: model.dtype=float32 on GPUs") for n in notes)
    assert not any("float32 on GPUs" in n for n in make_plan(cfg, "cpu", 2).notes)


def test_gyre_check_prints_each_roles_memory_and_refuses_a_plan_that_cannot_fit(tiny_model_dir):
    from gyre.app.preflight import with_memory
    from gyre.config import ConfigError
    from gyre.config.derive import make_plan
    from gyre.config.report import format_plan

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "data.train_files=[t.jsonl]", "model.dtype=float32",
                             "policy.devices=[0]", "rollout.devices=[1]"])
    plan = with_memory(cfg, make_plan(cfg, "cpu", 2), local=True)
    report = format_plan(cfg, plan)
    assert "memory per device (estimate" in report and "  policy " in report and "  rollout " in report
    # The tiny model's policy on a GPU of 0.001 GB: refused with the estimate per device.
    cfg.cluster.device_memory_gb = 0.001
    with pytest.raises(ConfigError, match=r"does not fit in device memory[\s\S]*device 0: about"):
        with_memory(cfg, make_plan(cfg, "cuda", 2), local=False)
