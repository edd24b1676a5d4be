"""Shared fixtures: a tiny model directory and one local Ray instance per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised 'tiny' preset model + char tokenizer, built once per session."""
    from gyre.models.presets import init_model

    return init_model("tiny", tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def arithmetic_data(tmp_path_factory):
    from gyre.tasks.arithmetic import ArithmeticSpec, write_arithmetic_task

    return write_arithmetic_task(tmp_path_factory.mktemp("data"), ArithmeticSpec(val_size=50, sft_size=200))


@pytest.fixture(scope="session")
def ray_local():
    """One embedded Ray for every test that needs actors (starting Ray costs seconds)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        # "local": a private instance even when another Ray is registered on the machine.
        ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    ray.shutdown()
