"""On-policy distillation through Ray: a tiny student learns from a different tiny teacher (another seed),
scored by a teacher role of reference workers; the teacher's tokenizer is checked before Ray starts."""

import json
import math
import shutil
from pathlib import Path

import pytest

from gyre.app import launch
from gyre.app.preflight import check_teacher_tokenizer
from gyre.config import load_config
from gyre.models.checks import ModelPathError


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    from gyre.models.presets import init_model

    return init_model("tiny", tmp_path_factory.mktemp("teacher") / "tiny-seed-1", seed=1)


def distill_config(tmp_path, student, teacher, data, *extra):
    reward = Path(__file__).with_name("reward_fns.py")
    return load_config(None, [
        f"run.output_dir={tmp_path / 'run'}", "run.seed=1", "run.max_restarts=0", f"model.path={student}",
        f"data.train_files=[{data['train']}]", "rollout.devices=[1]", "rollout.prompts_per_step=4",
        "rollout.samples_per_prompt=4", "rollout.sampling.max_new_tokens=8", "policy.devices=[0]",
        "policy.micro_batch_size=8", "policy.optimizer.lr=0.001", f"teacher.model_path={teacher}",
        "teacher.devices=[1]", "reward.type=function", f"reward.function={reward}:digit_fraction",
        "logging.progress=false", "logging.trackers=[]", "logging.plot=false", *extra])


def train_records(cfg) -> list[dict]:
    launch.train(cfg, echo=lambda s: None)
    lines = (Path(cfg.run.output_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["step"] > 0]


@pytest.mark.slow  # make test-all; the distill loss, stage and teacher config are tested without Ray
def test_pure_distillation_moves_the_student_towards_the_teacher(ray_local, tiny_model_dir, teacher_dir,
                                                                   arithmetic_data, tmp_path):
    cfg = distill_config(tmp_path, tiny_model_dir, teacher_dir, arithmetic_data, "run.steps=3",
                         "algorithm=opd", "teacher.micro_batch_size=2")
    train = train_records(cfg)
    assert [r["step"] for r in train] == [1, 2, 3]
    kl = [r["distill/reverse_kl"] for r in train]
    assert all(math.isfinite(k) for k in kl) and kl[0] > 0  # two random models disagree
    for r in train:
        # Pure mode: every token's advantage is -(log pi_student - log pi_teacher), so their mean over the
        # response tokens is minus the logged reverse KL: the teacher's log-probs are what trains.
        assert r["advantages/mean"] == pytest.approx(-r["distill/reverse_kl"], abs=1e-5)
        assert r["advantages/std"] > 0
    assert kl[-1] < kl[0], kl  # the student's own samples get likelier under the teacher


def test_a_teacher_with_another_tokenizer_is_refused_before_the_run(tiny_model_dir, teacher_dir, tmp_path):
    from transformers import AutoTokenizer

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "data.train_files=[t.jsonl]"])
    check_teacher_tokenizer(cfg.model, teacher_dir)  # same tokenizer, other weights: fine
    other = tmp_path / "other-tokenizer"
    shutil.copytree(teacher_dir, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<tool>"])
    tokenizer.save_pretrained(other)
    with pytest.raises(ModelPathError, match=r"another tokenizer than the student's \(1 token\(s\) differ, "
                                             r"e.g. '<tool>': student None, teacher \d+\)"):
        check_teacher_tokenizer(cfg.model, other)
    # No tokenizer files: the vocabulary cannot be compared, but the output layer must cover every id.
    bare = tmp_path / "bare"
    bare.mkdir()
    config = json.loads((teacher_dir / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({**config, "vocab_size": 10}))
    with pytest.raises(ModelPathError, match="scores 10 token ids but the student's tokenizer has"):
        check_teacher_tokenizer(cfg.model, bare)
