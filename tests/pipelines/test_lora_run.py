"""RL with LoRA through Ray actors: two FSDP2 policy ranks training adapters, rollout engines merging each
published adapter, the KL reference scored by the policy ranks with the adapters off; then a resume from
a checkpoint that reproduces the run, and the final model in both forms."""

import json
import math
import shutil
from pathlib import Path

import pytest
from torch.distributed.checkpoint import FileSystemReader

from gyre.app import launch
from gyre.cluster.chaos import compare_runs
from tests.pipelines.test_rlvr_integration import quick_config

pytest.importorskip("peft")


@pytest.mark.slow  # 35-65 s; adapter sync, resume and saving are also covered by tests/engines/test_lora_trainer.py
def test_a_lora_run_syncs_adapters_resumes_exactly_and_saves_both_forms(ray_local, tiny_model_dir, arithmetic_data,
                                                                        tmp_path):
    reward = Path(__file__).with_name("reward_fns.py")
    args = ["policy.lora={r: 4, alpha: 8}", "policy.strategy=fsdp2", "algorithm.kl.loss_coef=0.01",
            "validation.every=0", "checkpoint.every=1", "logging.plot=false", "logging.trackers=[]",
            "reward.type=function", f"reward.function={reward}:digit_fraction"]
    lines = []
    summary = launch.train(quick_config(tmp_path, tiny_model_dir, arithmetic_data, *args), echo=lines.append)
    out = tmp_path / "run"
    assert "reference model      the base model: LoRA adapters off, on the policy ranks" in "\n".join(lines)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["weight_version"] for r in records] == [1, 2, 3]
    # The engines sample with the merged adapters: their log-probs are the trainer's (float noise only),
    # after the policy has moved away from the base model (the reference).
    assert all(r["logprob_mismatch"] < 1e-5 for r in records)
    assert all(math.isfinite(r["kl_ref"]) for r in records) and records[-1]["kl_ref"] > 0
    policy_ckpt = out / "checkpoints" / "step_000003" / "policy"
    saved = FileSystemReader(str(policy_ckpt)).read_metadata().state_dict_metadata
    weights = [k for k in saved if k.startswith("model.")]
    assert len(weights) == 28 and all(".lora_" in k for k in weights)  # the adapters, never a base weight
    assert (policy_ckpt / "lora.json").is_file()
    # Final model: merged (plain transformers) and the adapter (peft), the same weights.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert summary.final_model == out / "final_model"
    merged = AutoModelForCausalLM.from_pretrained(out / "final_model").state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    adapted = PeftModel.from_pretrained(base, out / "final_adapter").merge_and_unload().state_dict()
    assert merged.keys() == adapted.keys() and all((merged[k] - adapted[k]).abs().max() < 1e-6 for k in merged)
    # Resume from step 2 in a copy of the run: step 3 and the final weights come out the same.
    again = tmp_path / "again"
    shutil.copytree(out, again)
    shutil.rmtree(again / "checkpoints" / "step_000003")
    launch.train(quick_config(tmp_path, tiny_model_dir, arithmetic_data, *args, f"run.output_dir={again}"),
                 mode="resume", echo=lambda s: None)
    assert compare_runs(out, again) == []


@pytest.mark.slow  # ~14 s; hybrid sampling through the adapters is also tested in tests/engines/test_lora_trainer.py
def test_hybrid_lora_ranks_sample_with_their_adapters(ray_local, tiny_model_dir, arithmetic_data, tmp_path):
    """rollout.mode hybrid: the policy rank samples with its own model, adapters included; the weight
    sync is a version stamp. policy.lora.save=adapter writes the adapter alone."""
    reward = Path(__file__).with_name("reward_fns.py")
    cfg = quick_config(tmp_path, tiny_model_dir, arithmetic_data, "rollout.mode=hybrid", "rollout.devices=[0]",
                       "policy.devices=[0]", "run.steps=2", "policy.lora={r: 4, save: adapter}",
                       "algorithm.kl.loss_coef=0.01", "validation.every=0", "logging.plot=false",
                       "logging.trackers=[]", "reward.type=function", f"reward.function={reward}:digit_fraction")
    summary = launch.train(cfg, echo=lambda s: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["sample_weight_version"] for r in records] == [0, 1]
    assert all(r["logprob_mismatch"] < 1e-5 for r in records) and records[-1]["kl_ref"] > 0
    assert summary.final_model == tmp_path / "run" / "final_adapter"
    assert (summary.final_model / "adapter_config.json").is_file() and not (tmp_path / "run" / "final_model").exists()
