import json
import subprocess
import sys
from pathlib import Path

from gyre.app.cli import main


def test_import_is_light_and_side_effect_free(tmp_path):
    code = ("import sys, gyre, gyre.config, gyre.algos, gyre.types; "
            "heavy = [m for m in ('ray', 'transformers') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.strip() == "[]"
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_init_model_and_init_data(tmp_path, capsys):
    assert main(["init-model", "--preset", "tiny", "--out", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "config.json").exists()
    assert main(["init-data", "--out", str(tmp_path / "d")]) == 0
    row = json.loads((tmp_path / "d" / "train.jsonl").read_text().splitlines()[0])
    assert set(row) == {"prompt", "ground_truth", "tag"}


def test_check_prints_config_and_plan(tmp_path, tiny_model_dir, arithmetic_data, capsys):
    args = ["check", "gyre/recipes/quickstart.yaml", f"model.path={tiny_model_dir}",
            f"data.train_files=[{arithmetic_data['train']}]", f"data.val_files=[{arithmetic_data['val']}]",
            f"sft_warmup.train_files=[{arithmetic_data['sft']}]", "cluster.cpu_slots=2", "data.max_prompt_tokens=5",
            "data.overlong_prompts=truncate_left", "sft_warmup.steps=null", "sft_warmup.epochs=2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "# resolved configuration" in out and "layout hybrid" in out and "rollout batch" in out
    # The warm-up's length in epochs: 2 passes over its 200 examples at 64 a step, ceil(400 / 64) = 7 steps.
    assert "; SFT warm-up: 200 examples" in out
    assert "after an SFT warm-up of 7 optimizer steps (2 epoch(s) of 200 examples, 64 per step)" in out
    # Every arithmetic prompt ("67+38=") is one character over: all are cut, and counted.
    total = sum(len(open(arithmetic_data[k]).readlines()) for k in ("train", "val"))
    assert (f"held-out prompts ({total} truncated to their last 5 tokens: longer than data.max_prompt_tokens=5)"
            in out)


def test_errors_are_one_clear_line(tmp_path, tiny_model_dir, arithmetic_data, capsys):
    assert main(["check", "gyre/recipes/quickstart.yaml", "policy.optimizer.lr=x"]) == 2
    assert "policy.optimizer.lr" in capsys.readouterr().err
    assert main(["check", "gyre/recipes/quickstart.yaml", f"model.path={tmp_path / 'missing'}"]) == 2
    assert "gyre init-model" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "ground_truth": "2"}\n{"prompt": 3}\n')
    assert main(["check", "gyre/recipes/quickstart.yaml", f"model.path={tiny_model_dir}", f"data.train_files=[{bad}]",
                 "validation.every=0", "cluster.cpu_slots=2"]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    assert main(["check", "gyre/recipes/quickstart.yaml", f"model.path={tiny_model_dir}",
                 f"data.train_files=[{arithmetic_data['train']}]", f"data.val_files=[{arithmetic_data['val']}]",
                 "cluster.cpu_slots=1"]) == 2
    assert "impossible placement" in capsys.readouterr().err


def test_init_commands_report_bad_arguments_in_one_line(tmp_path, capsys):
    assert main(["init-model", "--preset", "huge", "--out", str(tmp_path / "m")]) == 2
    assert "choose one of" in capsys.readouterr().err


def test_the_resume_command_replaces_the_start_flags():
    from gyre.app.restart import resume_command

    assert resume_command(["train", "my run.yaml", "a=1", "--overwrite"]) == "gyre train 'my run.yaml' a=1 --resume"
    assert resume_command(["quickstart", "--resume", "auto", "--out", "x"]) == "gyre quickstart --out x --resume"
    assert resume_command(["train", "c.yaml", "--resume"], auto=True) == "gyre train c.yaml --resume auto"


def test_check_builds_the_environment_of_an_agentic_run(tiny_model_dir, capsys, tmp_path):
    assert main(["check", "examples/agentic_guess_number.yaml", f"model.path={tiny_model_dir}",
                 "cluster.cpu_slots=2"]) == 0
    out = capsys.readouterr().out
    assert "env: gyre:guess_number built and reset once" in out and "env        gyre:guess_number" in out
    assert main(["check", "examples/agentic_guess_number.yaml", f"model.path={tiny_model_dir}",
                 "env.kwargs={low: 5, high: 2}", "cluster.cpu_slots=2"]) == 2
    assert "cannot be built with {'low': 5, 'high': 2}: ValueError" in capsys.readouterr().err
    assert main(["check", "examples/agentic_guess_number.yaml", f"model.path={tiny_model_dir}",
                 "env.id=gyre:chess", "cluster.cpu_slots=2"]) == 2
    assert "no built-in environment 'chess'" in capsys.readouterr().err
    # A reset that hangs or kills its process is reported, not a hung or killed launcher.
    hostile = Path(__file__).parents[1] / "envs" / "hostile_envs.py"
    assert main(["check", "examples/agentic_guess_number.yaml", f"model.path={tiny_model_dir}",
                 f"env.id={hostile}:StuckReset", "env.reset_timeout_s=1", "cluster.cpu_slots=2"]) == 2
    assert "StuckReset': reset(seed=0) did not return within 1 s (env.reset_timeout_s" in capsys.readouterr().err
    assert main(["check", "examples/agentic_guess_number.yaml", f"model.path={tiny_model_dir}",
                 f"env.id={hostile}:ExitingReset", "cluster.cpu_slots=2"]) == 2
    assert "its process died during reset() (exit code 4)" in capsys.readouterr().err


def test_version(capsys):
    import pytest

    from gyre.app.cli import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"gyre {version()}"
    assert version().count(".") >= 2


def test_eval_generate_and_export_of_a_run(trained_run, tmp_path, capsys):
    """Flags and overrides in any order; a table, a JSONL file and a model directory."""
    assert main(["eval", str(trained_run), "--step", "1", "--out", str(tmp_path / "e"), "--n", "2",
                 "validation.temperature=1.0", "--k", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint step 1: 6 prompts x 2 samples (temperature 1)" in out and "pass@2" in out
    assert len((tmp_path / "e" / "generations.jsonl").read_text().splitlines()) == 12
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "1+1=", "id": 3}\n')
    assert main(["generate", str(trained_run), "--data", str(prompts), "--out", str(tmp_path / "g.jsonl"),
                 "--max-new-tokens", "2"]) == 0
    assert json.loads((tmp_path / "g.jsonl").read_text())["id"] == 3
    assert main(["export", str(trained_run / "checkpoints"), "--out", str(tmp_path / "m"), "--dtype", "bfloat16"]) == 0
    assert json.loads((tmp_path / "m" / "config.json").read_text())["dtype"] == "bfloat16"


def test_command_errors_are_one_clear_line(trained_run, tiny_model_dir, tmp_path, capsys):
    def error(*argv):
        assert main(list(argv)) == 2
        err = capsys.readouterr().err
        assert err.startswith("gyre: error: ") and err.count("\n") == 1, err
        return err

    assert "no complete checkpoint of step 7; complete checkpoints: steps 1, 2" in error(
        "export", str(trained_run), "--step", "7", "--out", str(tmp_path / "x"))
    assert "does not exist" in error("eval", str(tmp_path / "no-run"), "--data", "x.jsonl")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.json").write_text("{}")
    assert "add --overwrite" in error("export", str(trained_run), "--out", str(tmp_path / "taken"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"question": "1+1="}\n')
    assert "no column 'prompt' (data.prompt_key)" in error("generate", str(tiny_model_dir), "--data", str(prompts),
                                                           "--out", str(tmp_path / "g.jsonl"))
    assert "gyre generate needs --out" in error("generate", str(tiny_model_dir), "--data", str(prompts))
    assert "no prompts to read" in error("eval", str(tiny_model_dir))
    assert "--k x: give whole numbers" in error("eval", str(trained_run), "--k", "x")
    bad, config = tmp_path / "sft.jsonl", tmp_path / "sft.yaml"
    bad.write_text('{"prompt": "1+1="}\n')
    config.write_text(f"model: {{path: {tiny_model_dir}}}\n")
    assert "sft.jsonl:1: no column 'response' (sft.response_key)" in error(
        "sft", str(config), f"sft.train_files=[{bad}]", f"run.output_dir={tmp_path / 's'}")
    assert not (tmp_path / "s").exists()  # nothing written before the data is known good
    bad.write_text('{"prompt": "1+1=", "good": "2", "rejected": "3"}\n')
    assert "sft.jsonl:1: no column 'chosen' (dpo.chosen_key)" in error(
        "dpo", str(config), f"dpo.train_files=[{bad}]", f"run.output_dir={tmp_path / 'd'}")
    assert not (tmp_path / "d").exists()
