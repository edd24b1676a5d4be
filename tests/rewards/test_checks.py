"""Too many failed rewards stop a run with the first error; failures show in the progress line."""

from pathlib import Path

import pytest

from gyre.app.cli import main
from gyre.config import load_config
from gyre.rewards.checks import RewardFailureError, check_reward_failures
from gyre.tracking.progress import _summary
from gyre.types import PromptRecord, RewardResult, Segment, Trajectory


def _samples(domain, statuses):
    out = []
    for i, status in enumerate(statuses):
        prompt = PromptRecord(f"train.jsonl:{i + 1}", "q", [1], "4", domain=domain)
        reward = RewardResult(1.0) if status == "ok" else RewardResult.failed(status, f"{status} number {i}")
        out.append(Trajectory(prompt, i, [Segment([2], [0.0], 0)], "x", "eos", reward, "scored"))
    return out


def test_a_step_stops_only_past_the_error_share():
    reward = load_config(None, ["model.path=m", "data.train_files=[d]"]).reward  # max_error_frac 0.5
    check_reward_failures(_samples("default", ["ok", "error", "timeout", "ok"]), reward)  # 2 of 4: not more
    with pytest.raises(RewardFailureError) as exc:
        check_reward_failures(_samples("default", ["ok", "timeout", "error", "error"]), reward)
    message = str(exc.value)
    assert message.startswith("3 of 4 rewards of reward failed in one step, more than reward.max_error_frac=0.5")
    assert "the first, on train.jsonl:2: timeout: timeout number 1" in message and "reward.timeout_s" in message


def test_each_domain_has_its_own_share():
    reward = load_config(None, ["model.path=m", "data.train_files=[d]", "reward.domains.a.max_error_frac=1",
                                "reward.domains.b.max_error_frac=0"]).reward
    check_reward_failures(_samples("a", ["error"] * 4), reward)  # 1: never stops
    with pytest.raises(RewardFailureError, match="1 of 1 rewards of reward.domains.b failed"):
        check_reward_failures(_samples("a", ["ok"]) + _samples("b", ["error"]), reward)


def test_reward_errors_show_in_the_progress_line():
    assert _summary({"reward/mean": 0.25, "reward/errors": 3, "reward/timeouts": 0}) == "reward=0.250 reward_errors=3"


def test_a_run_whose_rewards_fail_stops_with_the_first_error(ray_local, tiny_model_dir, arithmetic_data, tmp_path,
                                                             capsys):
    reward = Path(__file__).parents[1] / "pipelines" / "reward_fns.py"
    code = main(["train", "gyre/recipes/quickstart.yaml", f"run.output_dir={tmp_path / 'run'}", "run.steps=3",
                 f"model.path={tiny_model_dir}", f"data.train_files=[{arithmetic_data['train']}]", "data.val_files=[]",
                 "sft_warmup=null", "rollout.devices=[0]", "policy.devices=[0]", "rollout.prompts_per_step=4",
                 "rollout.samples_per_prompt=2", "policy.micro_batch_size=8", "validation.every=0",
                 "logging.progress=false", "logging.trackers=[]", "reward.type=function",
                 f"reward.function={reward}:fails_on_real_responses"])
    out, err = capsys.readouterr()
    assert code == 2, out[-2000:] + err[-2000:]
    assert "rewards of reward failed in one step, more than reward.max_error_frac=0.5" in err
    assert "reward function returned str" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "final_model").exists()
