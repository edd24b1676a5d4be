"""gyre eval: held-out prompts sampled and scored as validation does them; accuracy, mean@n, pass@k, tags."""

import json
from pathlib import Path

import pytest

from gyre.algos.pass_at_k import mean_pass_at_k
from gyre.app.command_config import command_config
from gyre.app.evaluate import EvalOptions, OutputExistsError, evaluate_model, group_metrics
from gyre.app.model_source import resolve_source
from gyre.config.load import ConfigError
from gyre.data.prompts import DataError
from gyre.types import Group, PromptRecord, RewardResult, Segment, Trajectory

REWARD = Path(__file__).parents[1] / "pipelines" / "reward_fns.py"
QUIET = lambda s: None  # noqa: E731


def group(tag, scored):
    """A scored group: (reward, correct, response length, finish reason) per sample."""
    prompt = PromptRecord(f"p-{tag}", "q", [5], "", tag=tag)
    samples = [Trajectory(prompt, i, [Segment([7] * n, [0.0] * n, 0)], "", finish, RewardResult(score, correct),
                          "scored") for i, (score, correct, n, finish) in enumerate(scored)]
    return Group(prompt.uid, prompt, len(samples), 0, 0, samples)


def test_metrics_by_hand():
    a = group("x", [(1.0, True, 2, "eos"), (0.0, False, 3, "eos"), (0.0, False, 4, "length")])
    b = group("y", [(1.0, None, 2, "eos"), (0.5, True, 2, "eos"), (0.0, False, 2, "eos")])
    m = group_metrics([a, b], [1, 2, 3])
    assert m["prompts"] == 2
    assert m["accuracy"] == pytest.approx((1 / 3 + 1 / 3) / 2)  # a score of 1.0 the reward did not judge is not correct
    assert m["mean@3"] == pytest.approx((1 / 3 + 0.5) / 2)
    # pass@2 with 1 correct of 3: 1 - C(2,2)/C(3,2) = 2/3, in both groups
    assert (m["pass@1"], m["pass@2"], m["pass@3"]) == (pytest.approx(1 / 3), pytest.approx(2 / 3), 1.0)
    assert m["response_length_mean"] == pytest.approx(15 / 6) and m["truncated_frac"] == pytest.approx(1 / 6)
    assert m["positive_frac"] == pytest.approx(3 / 6)


def test_a_reward_that_does_not_judge_gets_no_accuracy():
    """A float reward averaging 0.14 is not "94% accurate": accuracy and pass@k are absent, positive_frac
    states its threshold in its name."""
    from gyre.pipelines.rlvr import sample_metrics

    g = group("x", [(0.1, None, 2, "eos"), (0.2, None, 2, "eos"), (0.0, None, 2, "eos"), (0.26, None, 2, "eos")])
    m = group_metrics([g], [1, 2])
    assert "accuracy" not in m and not any(k.startswith("pass@") for k in m)
    assert m["mean@4"] == pytest.approx(0.14) and m["positive_frac"] == 0.75
    s = sample_metrics(g.trajectories)
    assert "accuracy" not in s and s["reward/positive_frac"] == 0.75 and s["reward/mean"] == pytest.approx(0.14)
    judged = group("y", [(0.3, False, 2, "eos"), (0.9, True, 2, "eos"), (0.0, None, 2, "eos")])
    assert sample_metrics(judged.trajectories)["accuracy"] == 0.5  # among the samples the reward judged


def own_columns(tmp_path, source_file, rows=None):
    """The arithmetic prompts under a user's own column names, with an id column."""
    lines = Path(source_file).read_text().splitlines()[:rows]
    out = tmp_path / "held_out.jsonl"
    out.write_text("".join(json.dumps({"question": r["prompt"], "answer": r["ground_truth"], "level": r["tag"],
                                       "id": i}) + "\n" for i, r in enumerate(map(json.loads, lines))))
    return out


def test_a_model_on_held_out_prompts_with_its_own_columns(tiny_model_dir, arithmetic_data, tmp_path):
    data = own_columns(tmp_path, arithmetic_data["val"], rows=6)
    source = resolve_source(str(tiny_model_dir))
    overrides = ["data.prompt_key=question", "data.answer_key=answer", "data.tag_key=level", "reward.type=function",
                 f"reward.function={REWARD}:digit_fraction", "rollout.sampling.max_new_tokens=4"]
    flags = {"data.val_files": [str(data)], "validation.samples_per_prompt": 4, "validation.temperature": 1.0}
    cfg = command_config(source, None, overrides, flags, needs="data.val_files")
    report = evaluate_model(cfg, source, EvalOptions(tmp_path / "eval"), echo=QUIET)
    rows = [json.loads(line) for line in (tmp_path / "eval" / "generations.jsonl").read_text().splitlines()]
    assert len(rows) == 24 and {r["tag"] for r in rows} == {"arithmetic"}
    assert rows[0]["prompt"] == "22+13=" and rows[0]["ground_truth"] == "35" and rows[0]["sample"] == 0
    # Every number follows from the generations written.
    correct = [[r["correct"] for r in rows if r["id"] == row_id] for row_id in dict.fromkeys(r["id"] for r in rows)]
    assert [r["correct"] for r in rows] == [r["reward"] >= 0.5 for r in rows]  # as digit_fraction judges
    m = report.overall
    assert m["accuracy"] == pytest.approx(sum(r["correct"] for r in rows) / 24)
    assert m["mean@4"] == pytest.approx(sum(r["reward"] for r in rows) / 24)
    assert [m[f"pass@{k}"] for k in (1, 2, 4)] == pytest.approx([mean_pass_at_k(correct, k) for k in (1, 2, 4)])
    assert 0 < m["mean@4"] < 1 and report.by_tag["arithmetic"]["prompts"] == 6
    saved = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert saved["overall"] == m and saved["samples_per_prompt"] == 4 and "pass@4" in report.format()
    with pytest.raises(OutputExistsError, match="generations.jsonl, .*metrics.json already exist"):
        evaluate_model(cfg, source, EvalOptions(tmp_path / "eval"), echo=QUIET)
    evaluate_model(cfg, source, EvalOptions(tmp_path / "eval", ks=(3,), overwrite=True), echo=QUIET)
    assert "pass@3" in json.loads((tmp_path / "eval" / "metrics.json").read_text())["overall"]


def test_a_run_is_scored_as_its_own_validation_scored_it(trained_run, tmp_path):
    """With the run's own config (data, reward, greedy validation), eval of the final model and of checkpoint
    1 gives the held-out numbers the run logged at steps 2 and 1."""
    logged = {r["step"]: r for r in map(json.loads, (trained_run / "metrics.jsonl").read_text().splitlines())}
    for step, source in ((2, resolve_source(str(trained_run))), (1, resolve_source(str(trained_run), step=1))):
        cfg = command_config(source, None, [], {}, needs="data.val_files")
        report = evaluate_model(cfg, source, EvalOptions(tmp_path / f"eval{step}"), echo=QUIET)
        assert report.overall["prompts"] == 6
        assert report.overall["accuracy"] == pytest.approx(logged[step]["val/accuracy"])
        assert report.overall["mean@1"] == pytest.approx(logged[step]["val/reward/mean"])


def test_what_eval_needs_is_asked_for(tiny_model_dir, arithmetic_data, tmp_path):
    source = resolve_source(str(tiny_model_dir))
    with pytest.raises(ConfigError, match="no prompts to read: give them with --data FILE"):
        command_config(source, None, [], {}, needs="data.val_files")
    data = own_columns(tmp_path, arithmetic_data["val"], rows=2)
    cfg = command_config(source, None, ["reward.type=function", f"reward.function={REWARD}:digit_fraction"],
                         {"data.val_files": [str(data)]}, needs="data.val_files")
    with pytest.raises(DataError, match="no column 'prompt' \\(data.prompt_key\\); this row has columns: answer, id, "
                                        "level, question. Set data.prompt_key"):
        evaluate_model(cfg, source, EvalOptions(tmp_path / "e"), echo=QUIET)
    assert not (tmp_path / "e").exists()  # nothing written before the data is known good
    with pytest.raises(ConfigError, match="pass@k needs 1 <= k <= the samples per prompt \\(1\\)"):
        evaluate_model(cfg, source, EvalOptions(tmp_path / "e", ks=(1, 4)), echo=QUIET)
    with pytest.raises(ConfigError, match="unknown key 'validation.n'"):
        command_config(source, None, ["validation.n=4"], {"data.val_files": [str(data)]}, needs="data.val_files")


def test_an_agentic_run_is_refused_with_what_scores_it_instead(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """An agentic run's model plays environment episodes, which eval does not run: eval and generate refuse its
    config (the run's own, --config, or an env override) in one paragraph, naming the run that scores it."""
    import shutil

    from gyre.app.cli import main
    from gyre.config import load_config
    from gyre.config.report import resolved_yaml
    from gyre.recipes import recipe_path

    monkeypatch.chdir(tmp_path)  # where eval would write by default
    run = tmp_path / "agentic"
    run.mkdir()
    recipe = recipe_path("agentic_quickstart")
    base = [f"model.path={tiny_model_dir}", f"run.output_dir={run}", f"sft_warmup.train_files=[{tmp_path / 'x.jsonl'}]"]
    (run / "resolved_config.yaml").write_text(resolved_yaml(load_config(recipe, base)))
    shutil.copytree(tiny_model_dir, run / "final_model")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "1+1=", "ground_truth": "2"}\n')
    for argv in (["eval", str(run)], ["eval", str(run), "--data", str(prompts)],
                 ["eval", str(tiny_model_dir), "--config", str(recipe), "--data", str(prompts)],
                 ["eval", str(tiny_model_dir), "--data", str(prompts), "env.id=gyre:guess_number"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "configures an environment (env: gyre:guess_number)" in err, argv
        assert "is scored by its own validation" in err and "gyre train CONFIG model.path=MODEL run.steps=1" in err
    assert main(["generate", str(run), "--data", str(prompts), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "give --config with a data section" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists() and not (tmp_path / "eval").exists()
    # The run the message suggests is a valid config.
    suggested = load_config(recipe, [*base, f"model.path={run / 'final_model'}", "run.steps=1", "validation.every=1",
                                     "sft_warmup=null", f"run.output_dir={tmp_path / 'score'}"])
    assert suggested.sft_warmup is None and suggested.validation.every == 1


def test_the_table_shows_a_dash_where_a_tag_has_no_accuracy():
    """One tag judged by its reward, one scored by a plain float: the table still prints."""
    from gyre.app.evaluate import EvalReport

    judged = group_metrics([group("x", [(1.0, True, 2, "eos"), (0.0, False, 2, "eos")])], [1, 2])
    plain = group_metrics([group("y", [(0.5, None, 2, "eos"), (0.0, None, 2, "eos")])], [1, 2])
    report = EvalReport("m", 2, 1.0, judged, {"x": judged, "y": plain})
    line = report.format().splitlines()[-1]
    assert line.startswith("tag y") and line.split()[3] == "-" and line.split()[4] == "0.250"
