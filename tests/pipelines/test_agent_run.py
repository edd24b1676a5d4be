"""A real run trains an unmodified agent program: the openai client in environment workers, the endpoint,
engines sampling the turns, the trainer updating the policy; every episode in a sandboxed workspace."""

import json
from pathlib import Path

import pytest

pytest.importorskip("openai")

from gyre.app import launch  # noqa: E402
from gyre.config import load_config  # noqa: E402
from tests.chat_models import with_chat_template  # noqa: E402
from tests.envs.test_context import TOOL_TEMPLATE  # noqa: E402

AGENTS = Path(__file__).parents[1] / "envs" / "agents_for_tests.py"


def test_an_agent_program_trains_through_the_endpoint(ray_local, tiny_model_dir, tmp_path):
    model = with_chat_template(tiny_model_dir, tmp_path / "model", TOOL_TEMPLATE)
    cfg = load_config(None, [
        f"run.output_dir={tmp_path / 'run'}", "run.steps=2", "run.seed=1", f"model.path={model}",
        "env.id=gyre:agent", f"env.agent.entry={AGENTS}:two_turn_agent", f"env.agent.tasks={AGENTS}:tasks",
        "env.agent.turn_timeout_s=25", "env.agent.workspace={disk_mb: 2}", "env.max_turns=3", "env.turn_tokens=8",
        "env.context_tokens=400", "env.slots_per_worker=4", "env.val_episodes=2", "env.step_timeout_s=40",
        "env.reset_timeout_s=40", "rollout.devices=[0,1]", "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=2", "policy.devices=[0,1]", "policy.micro_batch_size=2", "validation.every=2",
        "logging.progress=false"])
    launch.train(cfg)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        # four episodes a step, each two model turns the agent asked for through the endpoint
        assert r["agent/requests"] == 8 and r["env/steps"] == 8 and r["batch/rows"] == 4
        assert r["agent/errors"] == 0 and r["agent/history_mismatch"] == 0
        assert 0.0 <= r["reward/mean"] <= 1.0
    episodes = [json.loads(line) for line in (tmp_path / "run" / "generations" / "step_2.jsonl").read_text()
                .splitlines()]
    assert all([t["role"] for t in e["turns"]] == ["assistant", "env", "assistant"] for e in episodes)
