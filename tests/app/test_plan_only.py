"""gyre check --plan-only: a cluster run planned from a machine without its GPUs, model or data (a laptop):
the placement and each role's memory per device, a refusal with the numbers when it cannot fit, and a list
of what was not checked here instead of errors."""

import re
from pathlib import Path

import pytest

from gyre.app.cli import main
from gyre.app.planning import guess_size

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "grpo_gpu_cluster.yaml")
NOT_HERE = ("not checked here (planning mode): model directory /shared/models/my-model (model.path); data files "
            "/shared/data/math_train.jsonl, /shared/data/math_val.jsonl")


@pytest.fixture(autouse=True)
def _no_cluster_storage():
    if Path("/shared/models/my-model").exists():
        pytest.skip("this machine holds the example's cluster paths")


def test_the_cluster_example_planned_from_here_fits_a_7b_model_on_80_gb(capsys):
    assert main(["check", EXAMPLE, "--plan-only", "--model-shape", "7b", "--device", "h100"]) == 0
    out = capsys.readouterr().out
    assert "placement: 8 GPU(s) named by the device lists (not counted here), layout disaggregated" in out
    memory = out.split("memory per device (estimate: gyre.config.memory):\n")[1]
    assert "  model shape          7b: 7.6B parameters, 28 layers" in memory
    assert "  device memory        80 GB per device (--device h100)" in memory
    for role in ("policy", "rollout"):
        assert re.search(rf"^  {role} +\d+\.\d GB \(weights ", memory, re.M), role
    assert NOT_HERE in out
    # No device size anywhere: the estimate, and no verdict (a 32b policy passes, unrefused).
    assert main(["check", EXAMPLE, "--plan-only", "--model-shape", "32b"]) == 0
    out = capsys.readouterr().out
    assert "device memory        unknown here, so no fit verdict: give --device" in out
    assert re.search(r"^  policy +\d+\.\d GB", out, re.M)


def test_a_plan_that_cannot_fit_is_refused_with_the_numbers(capsys):
    # --model-shape implies --plan-only; cluster.device_memory_gb is the device size without --device.
    assert main(["check", EXAMPLE, "--model-shape", "32b", "cluster.device_memory_gb=80"]) == 2
    err = capsys.readouterr().err
    assert "the plan does not fit in device memory" in err
    assert re.search(r"device 0: about \d+\.\d GB estimated, more than 90% of its 80 GB", err)
    assert "32b: 32.5B parameters" in err and "80 GB per device (cluster.device_memory_gb)" in err
    assert re.search(r"^  policy +\d+\.\d GB \(weights ", err, re.M) and "shard the policy" in err


def test_a_shape_is_guessed_from_the_models_name_and_said_to_be_a_guess(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # the Hub id is cached on the cluster, not here
    assert main(["check", EXAMPLE, "--plan-only", "model.path=Qwen/Qwen2.5-7B-Instruct", "--device", "80"]) == 0
    out = capsys.readouterr().out
    assert "model shape          7b: 7.6B parameters" in out
    assert "(guessed from the name Qwen/Qwen2.5-7B-Instruct, which is not on this machine: give --model-shape" in out
    assert "Hub model Qwen/Qwen2.5-7B-Instruct (model.path; not in the Hugging Face cache here)" in out
    # A name that states no size: the plan without an estimate, and what to give.
    assert main(["check", EXAMPLE, "--plan-only"]) == 0
    out = capsys.readouterr().out
    assert "memory per device" not in out and NOT_HERE in out
    assert ("no memory estimate: model.path=/shared/models/my-model is not on this machine and its name states no "
            "size; give --model-shape") in out


def test_only_an_unambiguous_catalog_size_is_guessed():
    assert guess_size("Qwen/Qwen2.5-7B-Instruct") == ("7b", "")
    assert guess_size("/models/Qwen2.5-Math-1.5B")[0] == "1.5b" and guess_size("qwen2.5-0.5b-chat")[0] == "0.5b"
    assert guess_size("mistralai/Mixtral-8x7B-v0.1") == (None, "its name states no size")
    assert guess_size("Qwen/Qwen3-30B-A3B") == (None, "its name states 30b, a size the catalog lacks")
    assert guess_size("merge-7b-14b")[1] == "its name states several sizes (14b, 7b)"


def test_what_is_here_is_checked_and_read(tiny_model_dir, capsys):
    """The model directory here: checked, its config.json is the shape (and --model-shape may name a
    config.json); the data files absent: listed, not read."""
    assert main(["check", EXAMPLE, "--plan-only", f"model.path={tiny_model_dir}", "model.dtype=float32"]) == 0
    out = capsys.readouterr().out
    assert "model shape          tiny: " in out and f"({tiny_model_dir}/config.json)" in out
    assert ("not checked here (planning mode): data files /shared/data/math_train.jsonl, /shared/data/math_val.jsonl"
            in out) and "model directory" not in out.split("not checked here")[1]
    assert main(["check", EXAMPLE, "--model-shape", f"{tiny_model_dir}/config.json", "--device", "a100"]) == 0
    assert f"(--model-shape {tiny_model_dir}/config.json)" in capsys.readouterr().out


def test_a_reward_function_file_not_here_is_listed_not_imported(capsys):
    assert main(["check", EXAMPLE, "--plan-only", "--model-shape", "7b", "reward.type=function",
                 "reward.function=/shared/rewards/mine.py:score"]) == 0
    assert "; reward function file /shared/rewards/mine.py (reward.domains.default)." in capsys.readouterr().out


def test_without_the_flag_a_missing_path_is_an_error_naming_planning_mode(capsys):
    assert main(["check", EXAMPLE]) == 2
    err = capsys.readouterr().err
    assert "model.path='/shared/models/my-model' does not exist" in err and "add --plan-only" in err


def test_planning_flags_name_what_to_give(capsys):
    assert main(["check", EXAMPLE, "--plan-only", "--device", "h5"]) == 2
    assert "--device h5: give a device class (h100, h800" in capsys.readouterr().err
    assert main(["check", EXAMPLE, "--model-shape", "13b"]) == 2
    assert "--model-shape 13b: neither a catalog size (0.5b, 1.5b, 3b, 7b" in capsys.readouterr().err
    assert main(["check", EXAMPLE, "--plan-only", "--address", "auto"]) == 2
    assert "--plan-only joins no cluster: drop --address" in capsys.readouterr().err
    sft = str(Path(EXAMPLE).parent / "sft_chat.yaml")
    assert main(["check", sft, "--plan-only"]) == 2
    assert "--plan-only plans RL runs" in capsys.readouterr().err
