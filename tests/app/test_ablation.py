"""The ablation runner's pieces: variant parsing, per-run configs, the summary table."""

import pytest

from gyre.app.ablation import RunResult, Variant, summary_table, variant_config
from gyre.config import ConfigError, load_config


def test_variant_parsing():
    assert Variant.parse("lite_ppo") == Variant("lite_ppo", "lite_ppo")
    assert Variant.parse("nokl=grpo") == Variant("nokl", "grpo")
    with pytest.raises(ConfigError, match="unknown preset 'gpro'"):
        Variant.parse("gpro")


def test_variant_config_starts_from_the_shared_model(tmp_path):
    base = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", "algorithm.loss.clip_high=0.28",
                              "sft_warmup.train_files=[s.jsonl]"])
    v = Variant("ppo", "ppo", ["critic.optimizer.lr=0.001"])
    cfg = variant_config(base, v, seed=2, steps=50, model="warm", out=tmp_path / "x")
    assert cfg.sft_warmup is None and cfg.model.path == "warm" and cfg.run.seed == 2 and cfg.run.steps == 50
    # The variant's preset replaces the base algorithm section entirely; its own overrides apply on top.
    assert cfg.algorithm.preset == "ppo" and cfg.algorithm.loss.clip_high == 0.2 and cfg.critic.optimizer.lr == 0.001


@pytest.mark.parametrize("preset", ["reinforce_pp", "reinforce_pp_baseline"])
def test_the_reinforce_pp_presets_are_ablation_variants(tmp_path, preset):
    # The quickstart's base (GRPO-like, groups of 8) takes either preset; the paper's normalisation is on.
    base = load_config("gyre/recipes/quickstart.yaml", ["data.train_files=[t.jsonl]"])
    cfg = variant_config(base, Variant.parse(preset), seed=0, steps=5, model="warm", out=tmp_path / "x")
    a = cfg.algorithm
    assert a.advantage.whiten and a.advantage.norm_std == "none" and a.kl.reward_coef > 0


def test_asyppo_variant_gets_its_two_critics_unless_the_base_sets_them(tmp_path):
    base = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]"])
    cfg = variant_config(base, Variant.parse("asyppo"), seed=0, steps=5, model="m", out=tmp_path / "a")
    assert cfg.algorithm.preset == "asyppo" and cfg.critic.num_critics == 2
    assert cfg.algorithm.critic.adv_mask_low_pct == 0.2
    base = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", "critic.num_critics=4"])
    cfg = variant_config(base, Variant.parse("asyppo"), seed=0, steps=5, model="m", out=tmp_path / "b")
    assert cfg.critic.num_critics == 4
    grpo = variant_config(base, Variant.parse("grpo"), seed=0, steps=5, model="m", out=tmp_path / "c")
    assert grpo.critic.num_critics == 4  # kept as written (it has no effect without a critic)


def test_summary_table():
    results = [RunResult("grpo", 0, [(0, 0.1), (10, 0.5)], 1.0), RunResult("grpo", 1, [(0, 0.1), (10, 0.7)], 1.0)]
    table = summary_table(results)
    # final mean 60%, sample std of (50, 70) = 14.1%; best mean 60%
    assert "| grpo | 2 | 10.0% | 60.0% ± 14.1% | 60.0% | 50.0%, 70.0% | 1.0 |" in table
