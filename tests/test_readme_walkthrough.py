"""The README's walkthrough, run as written: its reward file, its config, its example rows and its commands
are read out of README.md (so the two cannot drift apart), against a tiny model that this test puts into a
temporary Hugging Face cache under the Hub id the config names. Only the sizes shrink (SMALL)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from gyre.app.cli import main
from tests.hub_cache import cache_model

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## Walkthrough: a cached Hub model and your own Parquet file"
COMMIT = "c0ffee" + "0" * 34
SMALL = ["run.steps=2", "checkpoint.every=1", "run.max_restarts=0", "rollout.prompts_per_step=2",
         "rollout.samples_per_prompt=2", "rollout.sampling.max_new_tokens=4", "policy.micro_batch_size=4",
         "cluster.cpu_slots=2", "logging.progress=false", "logging.trackers=[]", "logging.plot=false"]
"""What the test changes in the README's config: a 2-step run of tiny batches, checkpointed every step."""
EXPORT_STEP = "1"
"""The checkpoint the README's export names is one of the 2-step run's (its first, not its final model)."""


def walkthrough() -> str:
    text = README.read_text()
    assert HEADING in text, f"README.md has no section {HEADING!r}"
    body = text.split(HEADING, 1)[1]
    return body.split("\n## ", 1)[0]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return re.findall(r"^```(\w+)\n(.*?)^```", text, flags=re.M | re.S)


def table_rows(text: str) -> list[dict]:
    """The example rows of the section's table, numbers as numbers."""
    lines = [line.strip().strip("|") for line in text.splitlines() if line.startswith("|")]
    header, *rows = [[cell.strip() for cell in line.split("|")] for line in lines]
    return [{k: int(v) if v.isdigit() else v for k, v in zip(header, row)} for row in rows if set(row[0]) != {"-"}]


def commands(text: str) -> list[list[str]]:
    """The gyre commands of the section's bash blocks (comments dropped)."""
    lines = [line for lang, body in code_blocks(text) if lang == "bash" for line in body.splitlines()]
    return [argv for argv in (shlex.split(line, comments=True) for line in lines) if argv and argv[0] == "gyre"]


RECORDER = '''

import functools as _functools
import json as _json


def _recorded(fn):
    """The README's reward, writing down the keyword arguments gyre calls it with (the test's addition)."""
    @_functools.wraps(fn)  # gyre reads the README function's signature through __wrapped__
    def recorded(*args, **kwargs):
        with open({log!r}, "a") as fh:
            fh.write(_json.dumps(kwargs) + "\\n")
        return fn(*args, **kwargs)
    return recorded


{name} = _recorded({name})
'''


def write_files(text: str, root: Path, log: Path) -> dict[str, Path]:
    """Each python or yaml block whose first line is '# <file name>' written there; the reward function
    wrapped to record its keyword arguments."""
    files = {}
    for lang, body in code_blocks(text):
        first = body.splitlines()[0]
        if lang in ("python", "yaml") and first.startswith("# "):
            path = root / first[2:].strip()
            content = body
            if lang == "python":
                name = re.search(r"^def (\w+)", body, flags=re.M).group(1)
                content += RECORDER.format(log=str(log), name=name)
            path.write_text(content)
            files[path.name] = path
    return files


def shrink(argv: list[str]) -> list[str]:
    """The README's command with the test's sizes."""
    if argv[1] in ("check", "train"):
        return [*argv, *SMALL]
    if argv[1] == "export":
        return [EXPORT_STEP if i and argv[i - 1] == "--step" else a for i, a in enumerate(argv)]
    return argv


@pytest.fixture
def walk_dir(tmp_path, monkeypatch, tiny_model_dir):
    """An empty working directory, and a Hugging Face home whose cache holds the model the config names."""
    monkeypatch.chdir(tmp_path)
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    return tmp_path


def test_the_readme_walkthrough_runs_as_written(ray_local, walk_dir, tiny_model_dir, capsys):
    text = walkthrough()
    log = walk_dir / "reward_calls.jsonl"
    files = write_files(text, walk_dir, log)
    assert set(files) == {"my_reward.py", "tiny_math.yaml"}
    config = yaml.safe_load(files["tiny_math.yaml"].read_text())
    model_id = config["model"]["path"]
    cache_model(walk_dir / "hf_home" / "hub", model_id, tiny_model_dir, COMMIT)
    rows = table_rows(text)
    assert set(rows[0]) == {config["data"]["prompt_key"], config["data"]["answer_key"], "difficulty"}
    for path in (*config["data"]["train_files"], *config["data"]["val_files"]):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), path)
    argvs = commands(text)
    assert [a[1] for a in argvs] == ["check", "train", "eval", "export"]

    for argv in argvs:
        assert main(shrink(argv)[1:]) == 0, shlex.join(argv)
        out = capsys.readouterr().out
        if argv[1] == "check":  # the Hub id resolved from the temporary cache, every row loaded
            assert f"{model_id} at commit {COMMIT[:12]}" in out
            assert f"data: {len(rows)} training prompts, {len(rows)} held-out prompts" in out

    run = walk_dir / config["run"]["output_dir"]
    assert json.loads((run / "run.json").read_text())["hub_models"]["model.path"]["commit"] == COMMIT
    assert (run / "final_model" / "config.json").is_file()
    metrics = json.loads((walk_dir / "eval" / f"{run.name}-final" / "metrics.json").read_text())
    assert metrics["overall"]["prompts"] == len(rows) and metrics["samples_per_prompt"] == 4
    assert metrics["overall"]["reward_errors"] == 0 and "pass@4" in metrics["overall"]
    # The extra column reached the reward, row by row: every difficulty of the data, and nothing else.
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert {tuple(sorted(c)) for c in calls} == {("difficulty",)}
    assert {c["difficulty"] for c in calls} == {r["difficulty"] for r in rows}

    export = argvs[-1]
    out = walk_dir / export[export.index("--out") + 1]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == getattr(torch, export[export.index("--dtype") + 1])
    assert AutoTokenizer.from_pretrained(out)("7 + 5").input_ids
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name
