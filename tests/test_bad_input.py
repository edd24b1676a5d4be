"""Malformed input of every kind through ``gyre.app.cli.main``, in-process: each must exit with code 2 and
one short paragraph that names the fix, never a traceback. Almost all fail in pre-flight, before Ray."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gyre.app.cli import main
from gyre.training.checkpoint import CheckpointManager, DriverState


@dataclass
class Env:
    root: Path
    model: Path
    config: Path
    rewards: Path

    def file(self, name: str, content: str | bytes) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return path

    def model_copy(self, name: str, drop: tuple[str, ...] = ()) -> Path:
        target = self.root / "models" / name
        shutil.copytree(self.model, target, ignore=shutil.ignore_patterns(*drop))
        return target

    def run_dir(self, name: str) -> Path:
        path = self.root / "runs" / name
        path.mkdir(parents=True)
        return path


REWARDS = '''
import time


def exact(response, ground_truth):
    return float(response.strip() == ground_truth.strip())


def text(response, ground_truth):
    return "correct"


def nan(response, ground_truth):
    return float("nan")


def divide(response, ground_truth):
    return 1 / 0


def slow(response, ground_truth):
    time.sleep(30)
    return 1.0
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_model_dir, arithmetic_data):
    root = tmp_path_factory.mktemp("bad_input")
    rewards = root / "rewards.py"
    rewards.write_text(REWARDS)
    config = root / "base.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"output_dir": str(root / "runs" / "default"), "steps": 2},
        "model": {"path": str(tiny_model_dir)},
        "data": {"train_files": [str(arithmetic_data["train"])]},
        "rollout": {"devices": [0], "mode": "hybrid", "prompts_per_step": 2, "samples_per_prompt": 2,
                    "sampling": {"max_new_tokens": 3}},
        "policy": {"devices": [0], "micro_batch_size": 4},
        "reward": {"type": "function", "function": f"{rewards}:exact"},
        "logging": {"progress": False, "trackers": [], "plot": False},
        "cluster": {"cpu_slots": 2},
    }))
    return Env(root, Path(tiny_model_dir), config, rewards)


def train(env: Env, *args: str) -> list[str]:
    return ["train", str(env.config), *args]


def data(env: Env, name: str, content: str | bytes) -> list[str]:
    return train(env, f"data.train_files=[{env.file(name, content)}]")


def reward_fn(env: Env, name: str, *more: str) -> list[str]:
    return train(env, f"reward.function={env.rewards}:{name}", *more)


def reward_file(env: Env, name: str, source: str) -> list[str]:
    return train(env, f"reward.function={env.file(name, source)}:f")


def model(env: Env, path: Path, *more: str) -> list[str]:
    return train(env, f"model.path={path}", *more)


def model_with(env: Env, name: str, file: str, content: str) -> Path:
    """A copy of the tiny model with one file replaced."""
    path = env.model_copy(name)
    (path / file).write_text(content)
    return path


def damaged_safetensors(env: Env, name: str, cut: int | None = None, garbage: bool = False) -> Path:
    path = env.model_copy(name)
    weights = path / "model.safetensors"
    blob = weights.read_bytes()
    weights.write_bytes(b"\x12" * 64 if garbage else blob[:cut])
    return path


def sharded_missing(env: Env) -> Path:
    path = env.model_copy("sharded", drop=("model.safetensors",))
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}))
    return path


def bin_weights(env: Env) -> Path:
    path = env.model_copy("bin", drop=("model.safetensors",))
    (path / "pytorch_model.bin").write_bytes(b"not a zip archive at all")
    return path


def used_run(env: Env, name: str, run_id: str | None = None, checkpoint_run: str | None = None,
             driver: str | None = None) -> Path:
    out = env.run_dir(name)
    (out / "metrics.jsonl").write_text('{"step": 1, "phase": "train"}\n')
    if run_id:
        (out / "run.json").write_text(json.dumps({"run_id": run_id}))
    if checkpoint_run is not None:
        mgr = CheckpointManager(out, run_id=checkpoint_run)
        mgr.commit(mgr.begin(2), DriverState(step=2, data={}, weight_version=2, run_steps=2))
    if driver is not None:
        (out / "checkpoints" / "step_000002" / "driver.json").write_text(driver)
    return out


def multi(env: Env, rows: str, *domains: str) -> list[str]:
    path = env.file("multi.jsonl", rows)
    return train(env, f"data.train_files=[{path}]", "reward=null", *domains)


@dataclass
class Case:
    id: str
    argv: Callable[[Env], list[str]]
    expect: tuple[str, ...]


ROW = '{"prompt": "1+1=", "ground_truth": "2"}\n'
CODE_ROW = json.dumps({"prompt": "echo", "ground_truth": json.dumps({"inputs": ["1"], "outputs": ["1"]})}) + "\n"
CASES = [
    # ---- config ----------------------------------------------------------------------------------
    Case("config-missing", lambda e: ["train", str(e.root / "nope.yaml")], ("nope.yaml does not exist",)),
    Case("config-invalid-yaml", lambda e: ["train", str(e.file("bad.yaml", "run:\n  name: a\n   steps: 2\n"))],
         ("bad.yaml:3", "not valid YAML")),
    Case("config-not-a-mapping", lambda e: ["train", str(e.file("list.yaml", "- run\n- model\n"))],
         ("must hold a mapping",)),
    Case("config-not-utf8", lambda e: ["train", str(e.file("latin.yaml", b"run:\n  name: caf\xe9\n"))],
         ("latin.yaml:2", "not UTF-8", "save the file as UTF-8")),
    Case("config-unknown-key", lambda e: train(e, "policy.lr=0.1"), ("did you mean 'policy.optimizer.lr'",)),
    Case("config-wrong-type", lambda e: train(e, "run.steps=many"), ("run.steps", "valid integer")),
    Case("config-negative", lambda e: train(e, "run.steps=-1"), ("run.steps", "greater than 0")),
    Case("config-override-syntax", lambda e: train(e, "run.steps"), ("must look like key.path=value",)),
    Case("config-override-into-value", lambda e: train(e, "run.steps.x=1"), ("is a value, not a section",)),
    Case("config-override-bad-yaml", lambda e: train(e, "data.train_files=[a,"), ("as YAML", "quote")),
    Case("config-device-twice", lambda e: train(e, "policy.devices=[0,0]"), ("names a device twice",)),
    Case("config-impossible-placement", lambda e: train(e, "cluster.cpu_slots=1", "policy.devices=[0,1]",
                                                        "rollout.devices=[0,1]"), ("impossible placement",)),
    Case("config-batch-arithmetic", lambda e: train(e, "policy.mini_batch_size=3"), ("must divide", "try one of")),
    Case("config-unknown-preset", lambda e: train(e, "algorithm=foo"), ("unknown algorithm preset", "rloo")),
    Case("config-reward-type", lambda e: train(e, "reward.type=regex"), ("reward.type", "'math'")),
    Case("config-function-missing", lambda e: train(e, "reward.function=null"), ('needs function: "module:function"',)),
    Case("config-max-error-frac", lambda e: train(e, "reward.max_error_frac=1.5"), ("reward.max_error_frac",)),
    Case("config-ratio-on-some", lambda e: train(e, "reward={domains: {a: {type: math, ratio: 0.5}, b: {}}}"),
         ("set it on every domain or none",)),
    Case("config-judge-no-model", lambda e: train(e, "reward={type: judge, judge: {backend: local}}"),
         ("judge.model_path",)),
    # ---- data ------------------------------------------------------------------------------------
    Case("data-missing", lambda e: train(e, f"data.train_files=[{e.root / 'none.jsonl'}]"), ("does not exist",)),
    Case("data-format", lambda e: data(e, "rows.txt", "1+1=\n"), ("unsupported format '.txt'", ".csv")),
    Case("data-invalid-json", lambda e: data(e, "broken.jsonl", ROW + '{"prompt": "2+2=",\n'),
         ("broken.jsonl:2", "invalid JSON")),
    Case("data-not-object", lambda e: data(e, "list.jsonl", "[1, 2]\n"), ("list.jsonl:1", "expected a JSON object")),
    Case("data-no-prompt", lambda e: data(e, "noprompt.jsonl", '{"ground_truth": "2"}\n'),
         ("noprompt.jsonl:1", "'prompt'")),
    Case("data-no-ground-truth", lambda e: data(e, "notruth.jsonl", '{"prompt": "1+1="}\n'),
         ("notruth.jsonl:1", "no column 'ground_truth'", "this row has columns: prompt", "Set data.answer_key")),
    Case("data-mapped-column-missing", lambda e: data(e, "own.jsonl", '{"q": "1+1=", "a": "2"}\n')
         + ["data.prompt_key=question", "data.answer_key=a"],
         ("own.jsonl:1", "no column 'question' (data.prompt_key)", "columns: a, q", "Set data.prompt_key")),
    Case("data-glob-matches-nothing", lambda e: train(e, f"data.train_files=[{e.root / 'none' / '*.parquet'}]"),
         ("matches no file",)),
    Case("data-directory-empty", lambda e: train(e, f"data.train_files=[{e.file('emptydir/notes.md', 'x').parent}]"),
         ("holds no data files", "name the files or a glob")),
    Case("data-dataset-not-cached", lambda e: train(e, "data.train_files=[{dataset: acme/not-cached-anywhere}]"),
         ("not-cached-anywhere", "hf download --repo-type dataset")),
    Case("data-overlong-error", lambda e: train(e, "data.max_prompt_tokens=1", "data.overlong_prompts=error"),
         ("longer than data.max_prompt_tokens=1", "data.overlong_prompts to drop or truncate_left")),
    Case("data-template-literal-braces", lambda e: train(e, "data.prompt_template='{prompt} \\boxed{}'"),
         ("data.prompt_template", "literal braces doubled")),
    Case("data-system-prompt-no-template", lambda e: train(e, "data.system_prompt=Be brief."),
         ("data.system_prompt needs a chat template",)),
    Case("data-not-utf8", lambda e: data(e, "latin.jsonl", ROW.encode() + b'{"prompt": "\xe9", "ground_truth": "1"}\n'),
         ("latin.jsonl:2", "not UTF-8", "save the file as UTF-8")),
    Case("data-empty", lambda e: data(e, "empty.jsonl", ""), ("empty.jsonl holds no rows",)),
    Case("data-too-long", lambda e: train(e, "data.max_prompt_tokens=1"), ("longer than data.max_prompt_tokens",)),
    Case("data-bad-parquet", lambda e: data(e, "rows.parquet", b"PAR1 garbage"), ("not a readable Parquet file",)),
    Case("data-tag-type", lambda e: data(e, "tag.jsonl", '{"prompt": "1+1=", "ground_truth": "2", "tag": 3}\n'),
         ("tag.jsonl:1", "'tag' must be a string")),
    Case("data-messages-no-template", lambda e: data(e, "chat.jsonl",
                                                     '{"messages": [{"role": "user", "content": "hi"}], '
                                                     '"ground_truth": "2"}\n'), ("chat template",)),
    Case("data-math-truth", lambda e: data(e, "math.jsonl", '{"prompt": "1+1=", "ground_truth": " "}\n')
         + ["reward.type=math", "reward.function=null"], ("math.jsonl:1", "cannot be used")),
    Case("data-unknown-tag", lambda e: multi(e, '{"prompt": "1+1=", "ground_truth": "2", "tag": "zzz"}\n',
                                             "reward.domains.arith.type=math"),
         ("multi.jsonl:1", "no reward domain scores", "reward.domains.<name>.tags")),
    # ---- model -----------------------------------------------------------------------------------
    Case("model-missing", lambda e: model(e, e.root / "nomodel"), ("does not exist", "gyre init-model")),
    Case("model-hub-id-not-cached", lambda e: train(e, "model.path=gyre-tests/not-in-any-cache"),
         ("not-in-any-cache' is neither a local directory nor a model in the Hugging Face cache",
          "`hf download gyre-tests/not-in-any-cache`")),
    Case("model-revision-local-dir", lambda e: train(e, "model.revision=v2"), ("Remove model.revision",)),
    Case("model-no-config", lambda e: model(e, e.model_copy("noconfig", drop=("config.json",))),
         ("no config.json",)),
    Case("model-config-json", lambda e: model(e, model_with(e, "badconfig", "config.json", "{")),
         ("config.json is not valid JSON",)),
    Case("model-truncated-weights", lambda e: model(e, damaged_safetensors(e, "truncated", cut=4000)),
         ("model.safetensors is damaged", "Copy it again")),
    Case("model-garbage-weights", lambda e: model(e, damaged_safetensors(e, "garbage", garbage=True)),
         ("model.safetensors is damaged", "header length")),
    Case("model-no-weights", lambda e: model(e, e.model_copy("noweights", drop=("model.safetensors",))),
         ("no weights", "save_pretrained")),
    Case("model-missing-shard", lambda e: model(e, sharded_missing(e)), ("shard(s) that do not exist",)),
    Case("model-bin-not-zip", lambda e: model(e, bin_weights(e)), ("pytorch_model.bin is damaged", "not a zip")),
    Case("model-no-tokenizer", lambda e: model(e, e.model_copy("notok", drop=("tokenizer*",))),
         ("no tokenizer files", "save_pretrained", "model.tokenizer_path")),
    Case("model-tokenizer-path-missing", lambda e: train(e, f"model.tokenizer_path={e.root / 'notok'}"),
         ("model.tokenizer_path", "does not exist")),
    Case("model-tokenizer-broken", lambda e: model(e, model_with(e, "badtok", "tokenizer.json", "{broken")),
         ("cannot load the tokenizer", "model.tokenizer_path")),
    # ---- reward ----------------------------------------------------------------------------------
    Case("reward-file-missing", lambda e: train(e, f"reward.function={e.root / 'none.py'}:f"), ("does not exist",)),
    Case("reward-module-missing", lambda e: train(e, "reward.function=no_such_module_xyz:f"),
         ("cannot import module 'no_such_module_xyz'",)),
    Case("reward-no-such-function", lambda e: reward_fn(e, "nothere"), ("has no callable named 'nothere'",)),
    Case("reward-spec-no-colon", lambda e: train(e, "reward.function=justaname"),
         ('must look like "module:function"',)),
    Case("reward-syntax-error", lambda e: reward_file(e, "syn.py", "x = 1\ndef f(:\n"),
         ("syn.py, line 2", "SyntaxError")),
    Case("reward-raises-on-import", lambda e: reward_file(e, "boom.py", "x = 1\nraise RuntimeError('no key')\n"),
         ("boom.py, line 2", "RuntimeError: no key")),
    Case("reward-returns-string", lambda e: reward_fn(e, "text"), ("returned str", "RewardResult")),
    Case("reward-returns-nan", lambda e: reward_fn(e, "nan"), ("returned nan", "must be finite")),
    Case("reward-raises", lambda e: reward_fn(e, "divide"), ("ZeroDivisionError", "Fix the reward function")),
    Case("reward-bad-kwargs", lambda e: reward_fn(e, "exact", "reward.kwargs={tolerance: 1}"),
         ("unexpected keyword argument 'tolerance'", "reward.kwargs")),
    Case("reward-timeout", lambda e: reward_fn(e, "slow", "reward.timeout_s=0.5"), ("timeout", "reward.timeout_s")),
    Case("reward-shaping-missing", lambda e: train(e, "reward.shaping=[{function: 'gyre.rewards.shaping:nope'}]"),
         ("has no callable named 'nope'",)),
    Case("reward-code-timeout-per-sample", lambda e: train(e, "reward={type: code, timeout_s: 5}"),
         ("derives each sample's time limit from its tests", "kwargs.timeout_s")),
    Case("reward-code-sandbox-unreachable",
         lambda e: train(e, f"data.train_files=[{e.file('code.jsonl', CODE_ROW)}]",
                         "reward={type: code, sandbox: {url: 'http://127.0.0.1:1'}}"),
         ("sandbox server at http://127.0.0.1:1 does not answer", "gyre sandbox-serve")),
    Case("reward-sandbox-on-math", lambda e: train(e, "reward={type: math, sandbox: {allow_weak: true}}"),
         ("sandbox applies to the code reward only",)),
    # ---- command-line flags --------------------------------------------------------------------
    Case("cli-resume-and-overwrite", lambda e: train(e, "--resume", "--overwrite"), ("not allowed with",)),
    Case("cli-resume-value", lambda e: train(e, "--resume", "later"), ("takes no value or 'auto'",)),
    Case("cli-unknown-flag", lambda e: train(e, "--fast"), ("unrecognized arguments: --fast",)),
    Case("cli-init-model-preset", lambda e: ["init-model", "--preset", "huge", "--out", str(e.root / "m")],
         ("choose one of",)),
    Case("cli-ablate-variant", lambda e: ["ablate", "--config", str(e.config), "--variants", "zzz"],
         ("unknown preset 'zzz'",)),
    Case("cli-ablate-set-label", lambda e: ["ablate", "--config", str(e.config), "--variants", "grpo", "--set", "ppo",
                                            "algorithm.loss.clip_low=0.1"], ("no variant labelled 'ppo'",)),
    Case("cli-ablate-used-dir", lambda e: ["ablate", "--config", str(e.config), "--variants", "grpo", "--out",
                                           str(e.file("abl/ablation.md", "# old").parent)],
         ("already holds an ablation", "--resume", "--overwrite")),
    # ---- cluster address -----------------------------------------------------------------------
    Case("address-refused", lambda e: train(e, "--address", "127.0.0.1:1"),
         ("cannot reach a Ray cluster at 127.0.0.1:1", "Connection refused", "ray start --head", "drop --address")),
    Case("address-unknown-host", lambda e: train(e, "--address", "no-such-host.invalid:6379"),
         ("cannot reach a Ray cluster at no-such-host.invalid:6379",)),
    Case("address-not-an-address", lambda e: train(e, "--address", "headnode"), ("is not an address", "host:port")),
    Case("address-ray-client", lambda e: train(e, "--address", "ray://127.0.0.1:1"), ("cannot reach",)),
    Case("address-in-config", lambda e: train(e, "cluster.address=127.0.0.1:1"), ("(cluster.address)",)),
    # ---- run directory and resume ----------------------------------------------------------------
    Case("run-dir-in-use", lambda e: train(e, f"run.output_dir={used_run(e, 'used')}"),
         ("already holds a run", "--resume", "--overwrite", "nothing is deleted")),
    Case("resume-no-checkpoint", lambda e: train(e, f"run.output_dir={used_run(e, 'nockpt')}", "--resume"),
         ("no checkpoint in", "nockpt/checkpoints", "--resume auto")),
    Case("resume-other-run", lambda e: train(e, f"run.output_dir={used_run(e, 'mixed', 'aaaa', 'bbbb')}", "--resume"),
         ("written by run bbbb", "belongs to run aaaa")),
    Case("resume-unreadable", lambda e: train(e, f"run.output_dir={used_run(e, 'torn', 'aaaa', 'aaaa', '{')}",
                                              "--resume"), ("cannot read the checkpoint", "--overwrite")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_one_paragraph_naming_the_fix(case: Case, env: Env, capsys):
    argv = case.argv(env)
    if argv[0] == "train" and not any(a.startswith("run.output_dir=") for a in argv):
        argv.insert(2, f"run.output_dir={env.root / 'runs' / case.id}")  # a case that ran would leave no trace
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    out, err = capsys.readouterr()
    message = err.strip()
    assert code == 2, (code, out[-2000:], err[-2000:])
    assert "Traceback" not in out + err
    assert message and "\n\n" not in message and len(message.splitlines()) <= 4, message
    for text in case.expect:
        assert text in message, (text, message)


def test_the_table_is_wide():
    assert len(CASES) >= 40
    kinds = {c.id.split("-")[0] for c in CASES}
    assert {"config", "data", "model", "reward", "cli", "address", "resume", "run"} <= kinds
