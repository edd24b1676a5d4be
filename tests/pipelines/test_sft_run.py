"""gyre sft: a standalone SFT run on chat data (assistant tokens only, packed rows) over two trainer ranks."""

import json

import pytest
import yaml

from gyre.app.rundir import RunDirError
from gyre.app.sft_run import train_sft
from gyre.config.load import ConfigError, load_config
from gyre.config.sft_schema import SFTJobConfig
from tests.chat_models import with_chat_template
from tests.data.test_sft import TEMPLATE


@pytest.fixture(scope="module")
def chat_model(tiny_model_dir, tmp_path_factory):
    return with_chat_template(tiny_model_dir, tmp_path_factory.mktemp("chat") / "model", TEMPLATE)


def conversations(path, n=12):
    rows = []
    for i in range(n):
        a, b = i % 7, (3 * i) % 5
        turns = [("user", f"{a}+{b}="), ("assistant", str(a + b)), ("user", "again"), ("assistant", str(a + b))]
        rows.append({"messages": [{"role": role, "content": text} for role, text in turns]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft_config(tmp_path, model, *extra, length="sft.steps=6"):
    return load_config(None, [f"run.output_dir={tmp_path / 'sft'}", f"model.path={model}",
                              f"sft.train_files=[{conversations(tmp_path / 'chat.jsonl')}]", length,
                              "sft.batch_size=6", "sft.micro_batch_size=2", "sft.packing=true", "sft.max_tokens=128",
                              "sft.optimizer.lr=0.01", "policy.devices=[0,1]", "logging.progress=false",
                              "logging.trackers=[]", *extra], schema=SFTJobConfig)


def test_chat_sft_over_two_ranks_saves_a_model_and_its_metrics(ray_local, chat_model, tmp_path):
    cfg = sft_config(tmp_path, chat_model, "policy.remove_padding=sort", "policy.logprob_chunk_tokens=16",
                     length="sft.epochs=3")  # 3 passes over 12 examples, 6 a step: 6 steps
    lines = []
    summary = train_sft(cfg, echo=lines.append)
    out = tmp_path / "sft"
    assert "data: 12 examples" in lines[0]
    assert ("placement: policy on CPU slots [0, 1] (2 data-parallel ranks); 6 optimizer steps (3 epoch(s) of 12 "
            "examples, 6 per step)") in lines
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6] and {r["phase"] for r in records} == {"sft"}
    # 6 conversations of 4 trained tokens each ("N</s>" twice; 2-digit sums add one) packed into fewer rows.
    assert all(24 <= r["sft/trained_tokens"] <= 30 and r["sft/rows"] < 6 for r in records)
    assert summary.last_loss < summary.first_loss == records[0]["sft_loss"]
    final = summary.final_model
    assert final == out / "final_model" and json.loads((final / "config.json").read_text())["dtype"] == "float32"
    assert (final / "tokenizer_config.json").read_bytes() == (chat_model / "tokenizer_config.json").read_bytes()
    assert yaml.safe_load((out / "resolved_config.yaml").read_text())["pipeline"] == "sft"
    log = (out / "driver.log").read_text()  # pre-flight and plan lines, a line per step
    assert "data: 12 examples" in log and "placement: policy on CPU" in log and "step 6/6" in log
    assert "SFT step" in (out / "report.html").read_text()  # the report of a standalone run, its SFT chart
    with pytest.raises(RunDirError, match="already holds a run"):
        train_sft(cfg, echo=lines.append)


def test_sft_configs_are_strict(chat_model, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'sft.num_train_epochs'; did you mean 'sft.epochs'\? \(TRL"):
        sft_config(tmp_path, chat_model, "sft.num_train_epochs=3")
    with pytest.raises(ConfigError, match="sft: steps=6 and epochs=2 both set the length of the SFT run; remove one of "
                                         r"them. On the command line, .* \(e.g. sft.steps=50 sft.epochs=null\)"):
        sft_config(tmp_path, chat_model, "sft.epochs=2")
    from gyre.config.derive import make_sft_plan

    cfg = sft_config(tmp_path, chat_model, "sft.packing=false", "sft.batch_size=5")
    with pytest.raises(ConfigError, match="sft.batch_size=5 must be divisible by the 2 policy devices"):
        make_sft_plan(cfg, "cpu", 2, 12)
    with pytest.raises(ConfigError, match="impossible placement"):
        make_sft_plan(sft_config(tmp_path, chat_model, "policy.devices=[0,3]"), "cpu", 2, 12)


@pytest.mark.parametrize("length, examples, steps", [
    ({}, 12, 100),                          # neither given: 100 steps
    ({"steps": 7}, 12, 7),                  # steps whatever the data
    ({"epochs": 2}, 12, 6),                 # 2 x 12 / 4 = 6
    ({"epochs": 1.5}, 10, 4),               # 1.5 x 10 / 4 = 3.75: rounded up, the last pass partly
    ({"epochs": 0.1}, 10, 1),               # at least one step
])
def test_epochs_derive_the_steps(length, examples, steps):
    from gyre.config.schema import SFTConfig

    sft = SFTConfig(train_files=["x.jsonl"], batch_size=4, **length)
    assert sft.total_steps(examples) == steps
    described = sft.describe_length(examples)
    assert described.startswith(f"{steps} optimizer steps") and ("epoch(s)" in described) == ("epochs" in length)
