"""Shared fixtures: a tiny model directory and one local Ray instance per test session."""

from __future__ import annotations

import os
from collections import defaultdict

import pytest

from tests import slow_shards

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_addoption(parser):
    group = parser.getgroup("slow shards", "rotating shards of the tests marked slow (tests/slow_shards.py)")
    group.addoption("--slow-shard", default=None, metavar="auto|K/N",
                    help="also run one shard of the slow tests: auto (CI: rotates with the commit) or shard K of N")
    group.addoption("--slow-budget", type=float, default=slow_shards.BUDGET_S, metavar="SECONDS",
                    help="measured seconds of slow tests per shard, which sets the number of shards for auto")
    group.addoption("--record-slow-durations", action="store_true",
                    help=f"write the durations of the slow tests that passed to {slow_shards.DURATIONS.name}")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{slow_shards.MARK}: a slow test that --slow-shard adds to this run")
    if config.getoption("slow_shard") and config.option.markexpr:  # the shard runs whatever -m leaves out
        config.option.markexpr = f"({config.option.markexpr}) or {slow_shards.MARK}"
    if config.getoption("record_slow_durations"):
        config.pluginmanager.register(_DurationRecorder(), "slow-durations")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    spec = config.getoption("slow_shard")
    if not spec:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    try:
        chosen, note = slow_shards.choose(spec, [item.nodeid for item in slow], config.rootpath,
                                          config.getoption("slow_budget"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    chosen = set(chosen)
    for item in slow:
        if item.nodeid in chosen:
            item.add_marker(slow_shards.MARK)
    config.stash[_SHARD_NOTE] = f"{note}: {', '.join(sorted(chosen)) or 'none'}"


def pytest_report_collectionfinish(config):
    return config.stash.get(_SHARD_NOTE, None)


def pytest_terminal_summary(terminalreporter, config):
    if _SHARD_NOTE in config.stash:
        terminalreporter.write_line(config.stash[_SHARD_NOTE])


_SHARD_NOTE = pytest.StashKey[str]()


class _DurationRecorder:
    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.unmeasured: set[str] = set()
        """Failed or skipped: their times say nothing about a passing run's."""

    def pytest_runtest_logreport(self, report):
        if "slow" in report.keywords:
            self.seconds[report.nodeid] += report.duration
            if report.failed or report.skipped:
                self.unmeasured.add(report.nodeid)

    def pytest_sessionfinish(self):
        passed = {k: v for k, v in self.seconds.items() if k not in self.unmeasured}
        if passed:
            slow_shards.record(slow_shards.DURATIONS, passed)


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


@pytest.fixture(scope="session")
def trained_run(ray_local, tiny_model_dir, arithmetic_data, tmp_path_factory):
    """A finished 2-step GRPO run (two FSDP2 ranks, so its checkpoints are sharded; a rollout engine beside
    them; a function reward) that validated greedily before and after each step and checkpointed after
    each, logging to every tracker and writing generations at every step: what eval, export, generate and
    the generation tests read."""
    from pathlib import Path

    from gyre.app import launch
    from gyre.config import load_config

    out = tmp_path_factory.mktemp("runs") / "grpo"
    reward = Path(__file__).parent / "pipelines" / "reward_fns.py"
    cfg = load_config(None, [
        f"run.output_dir={out}", "run.steps=2", "run.max_restarts=0", f"model.path={tiny_model_dir}",
        f"data.train_files=[{arithmetic_data['train']}]", f"data.val_files=[{arithmetic_data['val']}]",
        "data.max_val_prompts=6", "policy.devices=[0,1]", "policy.strategy=fsdp2", "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=2", "rollout.sampling.max_new_tokens=3", "policy.micro_batch_size=2",
        "policy.optimizer.lr=0.01", "validation.every=1", "checkpoint.every=1", "checkpoint.keep_last=3",
        "reward.type=function", f"reward.function={reward}:digit_fraction", "logging.progress=false",
        "logging.trackers=[tensorboard,wandb,mlflow,trackio]", "logging.plot=false", "logging.generations_every=1",
        "logging.generations_samples=3"])
    launch.train(cfg, echo=lambda s: None)
    return out
