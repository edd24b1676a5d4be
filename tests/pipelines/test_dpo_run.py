"""gyre dpo end to end on a tiny model: the reference role's log-probs, then the trainer learning a synthetic
preference (the right sum over a wrong one); LoRA with the base model as the reference; config errors.
(Two ranks give the same step as one: tests/engines/test_dpo_trainer.py, on gloo, which costs less than
four Ray actors here.)"""

import json
import math

import pytest
import yaml

from gyre.app.dpo_run import train_dpo
from gyre.app.rundir import RunDirError
from gyre.config.derive import make_dpo_plan
from gyre.config.dpo_schema import DPOJobConfig
from gyre.config.load import ConfigError, load_config
from tests.chat_models import with_chat_template
from tests.data.test_sft import TEMPLATE


@pytest.fixture(scope="module")
def chat_model(tiny_model_dir, tmp_path_factory):
    return with_chat_template(tiny_model_dir, tmp_path_factory.mktemp("chat") / "model", TEMPLATE)


def preference_rows(path, n=16, chat=True):
    """``n`` sums a+b with the right answer chosen and a wrong one rejected: conversations (implicit prompt)
    or texts (explicit prompt)."""
    rows = []
    for i in range(n):
        a, b = i % 5, (3 * i) % 4
        right, wrong = str(a + b), str((a + b + 1 + i % 3) % 10)
        if chat:
            user = {"role": "user", "content": f"{a}+{b}="}
            rows.append({"chosen": [user, {"role": "assistant", "content": right}],
                         "rejected": [user, {"role": "assistant", "content": wrong}]})
        else:
            rows.append({"question": f"{a}+{b}=", "chosen": right, "rejected": wrong})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def dpo_config(tmp_path, model, *extra, chat=True):
    data = preference_rows(tmp_path / "pairs.jsonl", chat=chat)
    return load_config(None, [f"run.output_dir={tmp_path / 'dpo'}", f"model.path={model}",
                              f"dpo.train_files=[{data}]", "dpo.steps=5", "dpo.batch_size=8", "dpo.micro_batch_size=2",
                              "dpo.beta=0.5", "dpo.max_tokens=32", "dpo.optimizer.lr=0.003", "logging.progress=false",
                              "logging.trackers=[]", *extra], schema=DPOJobConfig)


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # make test-all (CI time): the LoRA DPO run below keeps DPO end to end
def test_dpo_learns_the_preference(ray_local, chat_model, tmp_path):
    # With the memory levers on (their equality with the plain path is tested in tests/engines).
    cfg = dpo_config(tmp_path, chat_model, "policy.remove_padding=pack", "policy.logprob_chunk_tokens=16")
    lines = []
    summary = train_dpo(cfg, echo=lines.append)
    out = tmp_path / "dpo"
    text = "\n".join(lines)
    assert "data: 16 preference pairs" in lines[0] and "placement: policy on CPU slots [0] " in text
    assert "reference role released" in text
    rows = records(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and {r["phase"] for r in rows} == {"dpo"}
    assert all(r["dpo/pairs"] == 8 for r in rows)
    # Step 1 runs at the starting weights, which the reference role scored: every log-ratio is 0, so the
    # loss is log 2 and no pair is ranked right yet.
    assert rows[0]["dpo_loss"] == pytest.approx(math.log(2.0), abs=1e-4)
    assert rows[0]["rewards/accuracies"] == 0.0 and abs(rows[0]["rewards/margins"]) < 1e-4
    assert summary.last_loss < summary.first_loss and summary.last_accuracy > 0.5
    assert rows[-1]["rewards/margins"] > 0
    final = summary.final_model
    assert final == out / "final_model" and (final / "config.json").exists()
    assert (final / "tokenizer_config.json").read_bytes() == (chat_model / "tokenizer_config.json").read_bytes()
    assert yaml.safe_load((out / "resolved_config.yaml").read_text())["pipeline"] == "dpo"
    with pytest.raises(RunDirError, match="already holds a run"):
        train_dpo(cfg, echo=lines.append)


def test_lora_dpo_takes_its_reference_from_the_base_model(ray_local, tiny_model_dir, tmp_path):
    cfg = dpo_config(tmp_path, tiny_model_dir, "dpo.prompt_key=question", "dpo.loss_type=ipo", "dpo.steps=2",
                     "policy.lora={r: 4, save: both}", "dpo.optimizer.lr=0.01", chat=False)
    lines = []
    summary = train_dpo(cfg, echo=lines.append)
    assert any("log-probs of 16 pairs" in line and "base model" in line for line in lines)
    # At the start the adapters add nothing (B = 0): h = 0 and the IPO loss is (0 - 1 / (2 * 0.5))^2 = 1.
    assert summary.first_loss == pytest.approx(1.0, abs=1e-4)
    assert (tmp_path / "dpo" / "final_adapter" / "adapter_config.json").exists() and summary.final_model.exists()


def test_dpo_configs_are_checked_before_anything_starts(chat_model, tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'dpo.num_train_epochs'; did you mean 'dpo.epochs'"):
        dpo_config(tmp_path, chat_model, "dpo.num_train_epochs=3")
    with pytest.raises(ConfigError, match="steps=5 and epochs=2 both set the length of the DPO run"):
        dpo_config(tmp_path, chat_model, "dpo.epochs=2")
    with pytest.raises(ConfigError, match="label_smoothing has no meaning for loss_type 'hinge'"):
        dpo_config(tmp_path, chat_model, "dpo.loss_type=hinge", "dpo.label_smoothing=0.1")
    cfg = dpo_config(tmp_path, chat_model, "dpo.batch_size=5", "policy.devices=[0,1]")
    with pytest.raises(ConfigError, match="dpo.batch_size=5 must be divisible by the 2 policy devices"):
        make_dpo_plan(cfg, "cpu", 2, 16)
    plan = make_dpo_plan(dpo_config(tmp_path, chat_model), "cpu", 2, 16)
    assert plan.roles == {"policy": (0,), "reference": (0,)} and "frozen copy of model.path" in plan.describe()
    simpo = make_dpo_plan(dpo_config(tmp_path, chat_model, "dpo.loss_type=simpo"), "cpu", 2, 16)
    assert simpo.roles == {"policy": (0,)} and "reference" not in simpo.describe()
    # Epochs over the loaded pairs: ceil(1.5 x 20 / 8) = 4 steps.
    epochs = make_dpo_plan(dpo_config(tmp_path, chat_model, "dpo.steps=null", "dpo.epochs=1.5"), "cpu", 2, 20)
    assert epochs.steps == 4 and "4 optimizer steps (1.5 epoch(s) of 20 pairs, 8 per step)" in epochs.describe()
