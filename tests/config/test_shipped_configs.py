"""Every config gyre ships (examples/ and the packaged recipes) loads and plans."""

from pathlib import Path

import pytest

from gyre.config import load_config, make_plan
from gyre.config.report import format_plan, resolved_yaml

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "examples").glob("*.yaml")) + sorted((ROOT / "gyre" / "recipes").glob("*.yaml"))


def test_there_are_shipped_configs():
    assert len(SHIPPED) >= 3


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_config_loads_and_plans(path):
    import yaml

    if yaml.safe_load(path.read_text()).get("pipeline") == "sft":  # a standalone SFT run (gyre sft)
        from gyre.config.derive import make_sft_plan
        from gyre.config.sft_schema import SFTJobConfig

        cfg = load_config(path, schema=SFTJobConfig)
        assert "placement: policy on GPUs" in make_sft_plan(cfg, "cuda", 1 + max(cfg.policy.devices), 1000).describe()
        from gyre.config import validate_config

        assert validate_config(yaml.safe_load(resolved_yaml(cfg)), schema=SFTJobConfig) == cfg
        return
    cfg = load_config(path)
    devices = 1 + max(max(d) for d in (cfg.policy.devices, cfg.rollout.devices, cfg.reference.devices,
                                          cfg.critic.devices))
    plan = make_plan(cfg, "cuda" if "gpu" in path.name or "ppo" in path.name else "cpu", devices)
    assert "placement:" in format_plan(cfg, plan)
    # The resolved YAML round-trips to the same config.
    import yaml

    from gyre.config import validate_config

    assert validate_config(yaml.safe_load(resolved_yaml(cfg))) == cfg
