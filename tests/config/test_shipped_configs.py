"""Every config gyre ships (examples/, the packaged recipes, the papers' claims in bench/claims/) loads and plans."""

from pathlib import Path

import pytest

from gyre.config import load_config, make_plan
from gyre.config.report import format_plan, resolved_yaml

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = [p for p in sorted((ROOT / "bench" / "claims").glob("*.yaml")) if p.name != "claims.yaml"]
"""Cluster configs of the papers' claims (``bench/paper_claims.py``; claims.yaml lists them)."""
SHIPPED = sorted((ROOT / "examples").glob("*.yaml")) + sorted((ROOT / "gyre" / "recipes").glob("*.yaml")) + CLAIMS


def test_there_are_shipped_configs():
    assert len(SHIPPED) >= 3


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_config_loads_and_plans(path):
    import yaml

    pipeline = yaml.safe_load(path.read_text()).get("pipeline")
    if pipeline in ("sft", "dpo"):  # a standalone SFT or DPO run (gyre sft, gyre dpo)
        from gyre.config.derive import make_dpo_plan, make_sft_plan
        from gyre.config.dpo_schema import DPOJobConfig
        from gyre.config.sft_schema import SFTJobConfig

        schema, make = (SFTJobConfig, make_sft_plan) if pipeline == "sft" else (DPOJobConfig, make_dpo_plan)
        cfg = load_config(path, schema=schema)
        assert "placement: policy on GPUs" in make(cfg, "cuda", 1 + max(cfg.policy.devices), 1000).describe()
        from gyre.config import validate_config

        assert validate_config(yaml.safe_load(resolved_yaml(cfg)), schema=schema) == cfg
        return
    cfg = load_config(path)
    devices = 1 + max(max(d) for d in (cfg.policy.devices, cfg.rollout.devices, cfg.reference.devices,
                                          cfg.critic.devices))
    gpus = "gpu" in path.name or "ppo" in path.name or path in CLAIMS
    plan = make_plan(cfg, "cuda" if gpus else "cpu", devices)
    assert "placement:" in format_plan(cfg, plan)
    # The resolved YAML round-trips to the same config.
    import yaml

    from gyre.config import validate_config

    assert validate_config(yaml.safe_load(resolved_yaml(cfg))) == cfg


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_write_the_current_keys(path, capsys, monkeypatch):
    from gyre.config import aliases

    monkeypatch.setattr(aliases, "_ANNOUNCED", set())  # a key moved since is announced on stderr
    import yaml

    pipeline = yaml.safe_load(path.read_text()).get("pipeline")
    if pipeline not in ("sft", "dpo"):
        load_config(path)
    assert "renamed" not in capsys.readouterr().err
