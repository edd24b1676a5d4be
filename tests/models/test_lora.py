"""LoRA's pieces that need no process group: the merge arithmetic, the adapter records, config checks,
the plan (no reference role) and what `gyre check` prints."""

import pytest
import torch

from gyre.app.cli import main
from gyre.config import ConfigError, load_config, make_plan
from gyre.models.lora import (
    AdapterMerger,
    AdapterWeights,
    LoraTarget,
    LoraTargetError,
    apply_lora,
    lora_size,
    lora_targets,
    merged_state_dict,
    merged_weight,
    resume_problem,
    write_marker,
)
from gyre.models.specs import LoraSpec

pytest.importorskip("peft")


def test_merged_weight_is_base_plus_scaled_product():
    base = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    a = torch.tensor([[1.0, 0.0]])  # [r=1, in=2]
    b = torch.tensor([[2.0], [-1.0]])  # [out=2, r=1]
    # B @ A = [[2, 0], [-1, 0]]; scale 0.5 -> [[1, 0], [-0.5, 0]]
    assert torch.equal(merged_weight(base, a, b, LoraTarget(0.5)), torch.tensor([[2.0, 2.0], [2.5, 4.0]]))
    # GPT-2's Conv1D stores W as [in, out]: the product is transposed.
    assert torch.equal(merged_weight(base, a, b, LoraTarget(0.5, fan_in_fan_out=True)),
                       torch.tensor([[2.0, 1.5], [3.0, 4.0]]))


def test_scale_follows_peft():
    assert LoraSpec(r=8, alpha=16).scale == 2.0
    assert LoraSpec(r=16, alpha=8, rslora=True).scale == 2.0  # alpha / sqrt(r)


def test_adapter_weights_round_trip_and_merge_from_the_base_each_time():
    """The engine merges every version into the base it loaded, never into the previous merge."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False))
    model[0].weight.data = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    targets = {"0": LoraTarget(1.0)}
    merger = AdapterMerger()
    for scale_b in (1.0, 3.0):
        adapter = AdapterWeights({"0": (torch.tensor([[1.0, 1.0]]), torch.tensor([[scale_b], [0.0]]))}, targets)
        flat = adapter.tensors()
        assert set(flat) == {"0.lora_A", "0.lora_B"}
        merger.merge(model, AdapterWeights.from_tensors(flat, targets))
    assert torch.equal(model[0].weight.data, torch.tensor([[4.0, 5.0], [3.0, 4.0]]))  # base + 3, not + 1 + 3


def test_merged_state_dict_renames_and_merges():
    state = {"l.base_layer.weight": torch.ones(2, 2), "l.base_layer.bias": torch.zeros(2),
             "l.lora_A.default.weight": torch.ones(1, 2), "l.lora_B.default.weight": torch.ones(2, 1),
             "n.original_module.weight": torch.zeros(2), "n.modules_to_save.default.weight": torch.full((2,), 5.0),
             "other.weight": torch.ones(3)}
    out = merged_state_dict(state, {"l": LoraTarget(0.5)})
    assert set(out) == {"l.weight", "l.bias", "n.weight", "other.weight"}
    assert torch.equal(out["l.weight"], torch.full((2, 2), 1.5)) and torch.equal(out["n.weight"], torch.full((2,), 5.0))


def test_lora_size_counts_the_adapters(tiny_model_dir):
    """tiny: 2 layers of q, k, v, o (128 -> 128), gate, up (128 -> 256), down (256 -> 128); r (in + out) each."""
    size = lora_size(tiny_model_dir, LoraSpec(r=4))
    per_layer = 4 * (4 * 256) + 4 * (2 * 384 + 384)
    assert size.layers == 14 and size.trainable == 2 * per_layer == 17408
    with_norms = lora_size(tiny_model_dir, LoraSpec(r=4, modules_to_save=("norm",)))
    assert with_norms.trainable == 17408 + 5 * 128  # two norms per layer and the final one, in full


def test_targets_that_cannot_be_adapted_are_refused(tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    def fresh():
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir))

    with pytest.raises(LoraTargetError, match=r"linear layers are named down_proj, gate_proj, .*q_proj"):
        apply_lora(fresh(), LoraSpec(target_modules=["qkv"]))
    with pytest.raises(LoraTargetError, match="embed_tokens, a Embedding: gyre merges adapters into linear layers"):
        apply_lora(fresh(), LoraSpec(target_modules=["q_proj", "embed_tokens"]))
    with pytest.raises(LoraTargetError, match="lm_head, which this model ties to its input embeddings"):
        apply_lora(fresh(), LoraSpec(modules_to_save=["lm_head"]))
    model = fresh()
    apply_lora(model, LoraSpec(target_modules=["q_proj", "v_proj"], r=2, alpha=3))
    assert lora_targets(model) == {f"model.layers.{i}.self_attn.{m}": LoraTarget(1.5) for i in (0, 1)
                                   for m in ("q_proj", "v_proj")}


BASE = ["model.path=m", "data.train_files=[t.jsonl]"]


def test_the_reference_is_the_base_model_on_the_policy_ranks():
    plan = make_plan(load_config(None, [*BASE, "policy.lora={}", "algorithm.kl.loss_coef=0.01",
                                        "reference.devices=[1]"]), "cpu", 4)
    assert plan.use_reference and plan.reference_on_policy and "reference" not in plan.roles
    assert any("adapters switched off" in n and "reference section has no effect" in n for n in plan.notes)
    full = make_plan(load_config(None, [*BASE, "algorithm.kl.loss_coef=0.01"]), "cpu", 4)
    assert "reference" in full.roles and not full.reference_on_policy


def test_lora_config_is_strict_and_other_frameworks_names_are_known():
    with pytest.raises(ConfigError, match=r"policy\.lora\.alpha"):
        load_config(None, [*BASE, "policy.lora.lora_alpha=16"])
    with pytest.raises(ConfigError, match=r"policy\.lora\.r"):
        load_config(None, [*BASE, "lora_rank=16"])
    with pytest.raises(ConfigError, match="dropout"):
        load_config(None, [*BASE, "policy.lora.dropout=1.5"])


def test_check_prints_what_lora_trains_and_refuses_bad_targets(tiny_model_dir, arithmetic_data, capsys):
    args = ["check", "gyre/recipes/quickstart.yaml", f"model.path={tiny_model_dir}",
            f"data.train_files=[{arithmetic_data['train']}]", f"data.val_files=[{arithmetic_data['val']}]",
            f"sft_warmup.train_files=[{arithmetic_data['sft']}]", "cluster.cpu_slots=2",
            "policy.lora={r: 4, alpha: 8}", "algorithm.kl.loss_coef=0.01"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "LoRA                 r=4, alpha=8 (scale 2) on 14 all-linear layers: 17,408 of" in out
    assert "reference model      the base model: LoRA adapters off, on the policy ranks" in out
    assert main([*args, "policy.lora.target_modules=[qkv]"]) == 2
    assert "linear layers are named" in capsys.readouterr().err


def test_resume_needs_the_lora_config_the_checkpoint_was_trained_with(tmp_path):
    assert resume_problem(tmp_path, None) is None  # a full-weight checkpoint, a full-weight run
    assert "holds every weight (policy.lora was not set); remove policy.lora" in resume_problem(tmp_path, LoraSpec())
    write_marker(tmp_path, LoraSpec(r=4))
    assert "holds LoRA adapters only (policy.lora was set); set policy.lora as it was" in resume_problem(tmp_path, None)
    assert "'r': 4" in resume_problem(tmp_path, LoraSpec(r=8))
    assert resume_problem(tmp_path, LoraSpec(r=4, save="merged")) is None
