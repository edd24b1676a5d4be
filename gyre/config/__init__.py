"""Typed, strict run configuration: schema, YAML loading with overrides, derived plan, report."""

from gyre.config.derive import RunPlan, detect_local_devices, make_plan
from gyre.config.load import ConfigError, apply_override, load_config, validate_config
from gyre.config.schema import RLVRConfig

__all__ = [
    "ConfigError", "RLVRConfig", "RunPlan", "apply_override", "detect_local_devices", "load_config",
    "make_plan", "validate_config",
]
