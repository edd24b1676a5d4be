"""A multi-domain RLVR run: math, code (sandboxed) and a local LLM judge, mixed by ratio, on real Ray."""

import json
import math

import pytest

from gyre.app import launch
from gyre.config import load_config


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _data(tmp_path):
    code = {"inputs": [""], "outputs": ["3"]}
    rows = ([{"prompt": f"{a}+{a}=", "ground_truth": str(2 * a), "tag": "arithmetic"} for a in range(10, 30)]
            + [{"prompt": f"print {i}:", "ground_truth": json.dumps(code), "tag": "code"} for i in range(6)]
            + [{"prompt": f"say hi {i}:", "ground_truth": "hi", "tag": "chat"} for i in range(6)])
    return _write(tmp_path / "train.jsonl", rows), _write(tmp_path / "val.jsonl", rows[:3] + rows[20:22] + rows[26:28])


@pytest.mark.slow  # make test-all; each domain's scoring is tested through the reward pool
def test_math_code_and_judge_domains_in_one_run(ray_local, tiny_model_dir, tmp_path):
    train, val = _data(tmp_path)
    cfg = load_config(None, [
        f"run.output_dir={tmp_path / 'run'}", "run.steps=2", f"model.path={tiny_model_dir}",
        f"data.train_files=[{train}]", f"data.val_files=[{val}]", "validation.every=2", "logging.progress=false",
        "rollout.devices=[0,1]", "rollout.mode=hybrid", "policy.devices=[0,1]", "rollout.prompts_per_step=4",
        "rollout.samples_per_prompt=2", "rollout.sampling.max_new_tokens=6", "policy.micro_batch_size=8",
        "reward.domains.math.type=math", "reward.domains.math.tags=[arithmetic]", "reward.domains.math.ratio=0.5",
        "reward.domains.code.type=code", "reward.domains.code.ratio=0.25", "reward.domains.code.workers=2",
        "reward.domains.code.adaptive_timeout={t_min: 0.5, t_max: 2.0}",
        "reward.domains.chat.type=judge", "reward.domains.chat.ratio=0.25",
        f"reward.domains.chat.judge.model_path={tiny_model_dir}", "reward.domains.chat.judge.devices=[1]",
        "reward.domains.chat.judge.max_new_tokens=3", "reward.domains.chat.judge.score_pattern=(\\d)",
        # A random tiny judge rarely writes a digit: its unscored replies count as errors, not a reason to stop.
        "reward.domains.chat.max_error_frac=1",
    ])
    launch.train(cfg, echo=lambda s: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["step"] > 0]
    assert len(train_records) == 2
    for r in train_records:
        # 4 prompts x 2 samples at ratios 0.5 / 0.25 / 0.25: 2, 1 and 1 prompts of each domain every step.
        assert (r["math/share"], r["code/share"], r["chat/share"]) == (0.5, 0.25, 0.25)
        for domain in ("math", "code", "chat"):
            assert math.isfinite(r[f"{domain}/reward_mean"]) and r[f"{domain}/reward_latency"] >= 0
        assert r["reward/latency_max"] >= 0
    final = train_records[-1]
    assert "val/math/accuracy" in final and "val/code/accuracy" in final and "val/chat/accuracy" in final
    table = (tmp_path / "run" / "validation.md").read_text()
    assert "| step | accuracy | reward | math accuracy | code accuracy | chat accuracy |" in table
    assert table.count("\n| 2 |") == 1  # the row of the validation after step 2
