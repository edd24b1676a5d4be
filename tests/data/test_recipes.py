"""The data recipes in examples/ on small files in their formats, written here: each loads through the
run's own data path (sources, column mapping, chat template, ground-truth checks), and its reward scores
a right answer 1 and a wrong one 0."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gyre.app.preflight import load_data, resolve_paths
from gyre.config import load_config
from gyre.rewards.base import RewardRequest, call_reward, load_function
from gyre.rewards.registry import function_spec
from tests.chat_models import with_chat_template

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}"
            "<|assistant|>{% if enable_thinking is false %}<nothink>{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def chat_model(tiny_model_dir, tmp_path_factory):
    """The tiny model with a chat template, as an instruct model has."""
    return with_chat_template(tiny_model_dir, tmp_path_factory.mktemp("chat") / "model", TEMPLATE)


def load(recipe, model, train, val, tmp_path):
    cfg = load_config(EXAMPLES / recipe, [f"model.path={model}", f"data.train_files=[{train}]",
                                         f"data.val_files=[{val}]", f"run.output_dir={tmp_path / 'run'}"])
    return cfg, load_data(resolve_paths(cfg))


def score(cfg, record, response):
    spec, kwargs = function_spec(cfg.reward.domains["default"])
    request = RewardRequest(response, record.ground_truth, record.question, record.tag, columns=record.columns)
    return call_reward(load_function(spec), request, kwargs).score


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_style(tmp_path, tiny_model_dir):
    rows = [{"question": "Tom has 3 apples and buys 1,004 more. How many?", "answer": "3 + 1004 = 1007\n#### 1,007",
             "id": 17},
            {"question": "Half of 8?", "answer": "8 / 2 = 4\n#### 4", "id": 18}]
    f = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg, data = load("gsm8k_style.yaml", tiny_model_dir, f, f, tmp_path)
    first = data.train[0]
    instruction = " Let's think step by step and output the final answer after \"####\"."
    assert first.prompt_text == rows[0]["question"] + instruction
    # The worked solution the answer came from reaches the reward as its column.
    assert (first.ground_truth, first.columns) == ("1,007", rows[0])
    assert score(cfg, first, "3 + 1004 = 1007 apples.\n#### 1007") == 1.0
    assert score(cfg, first, "3 + 1004 = 1008 apples.\n#### 1008") == 0.0
    assert score(cfg, first, "The answer is 1007.") == 0.0  # no "####": no answer


def test_math_boxed(tmp_path, chat_model):
    table = pa.table({"problem": ["What is $1/2 + 1/4$?", "Solve $x + 1 = 3$."],
                      "solution": ["We add: $\\frac{2}{4} + \\frac{1}{4} = \\boxed{\\frac{3}{4}}$.",
                                   "So $x = \\boxed{2}$."],
                      "level": ["Level 2", "Level 1"], "type": ["Prealgebra", "Algebra"]})
    pq.write_table(table, tmp_path / "train-00000.parquet")
    cfg, data = load("math_boxed.yaml", chat_model, tmp_path / "train-*.parquet", tmp_path / "train-00000.parquet",
                     tmp_path)
    first = data.train[0]
    assert first.prompt_text == ("<|system|>Please reason step by step, and put your final answer within \\boxed{}."
                                 "<|user|>What is $1/2 + 1/4$?<|assistant|><nothink>")
    assert first.ground_truth == "\\frac{3}{4}" and first.columns == {"solution": table["solution"][0].as_py(),
                                                                         "level": "Level 2", "type": "Prealgebra"}
    assert score(cfg, first, "1/2 = 2/4, so the sum is \\boxed{0.75}") == 1.0
    assert score(cfg, first, "\\boxed{\\frac{2}{3}}") == 0.0
    assert score(cfg, first, "the answer is 3/4") == 0.0  # boxed: always


def test_code_tests(tmp_path, tiny_model_dir):
    asserts = {"asserts": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
    io = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})
    f = write_jsonl(tmp_path / "train.jsonl", [{"problem": "Write add(a, b).", "tests": asserts, "source": "mbpp"},
                                               {"problem": "Read two numbers, print their sum.", "tests": io}])
    cfg, data = load("code_tests.yaml", tiny_model_dir, f, f, tmp_path)
    fn, io_row = data.train
    assert fn.prompt_text == "Write add(a, b).\n\nWrite the solution in Python, in one ```python code block."
    assert json.loads(fn.ground_truth) == asserts and fn.columns == {"problem": "Write add(a, b).", "tests": asserts,
                                                                     "source": "mbpp"}
    assert score(cfg, fn, "```python\ndef add(a, b):\n    return a + b\n```") == 1.0
    assert score(cfg, fn, "```python\ndef add(a, b):\n    return 3\n```") == 0.5  # partial credit: 1 of 2
    assert score(cfg, io_row, "```python\na, b = map(int, input().split())\nprint(a + b)\n```") == 1.0
    assert score(cfg, io_row, "```python\nprint(0)\n```") == 0.0


def test_multiple_choice(tmp_path, tiny_model_dir):
    csv = ("question,A,B,C,D,answer,subject\n"
           '"Which is a prime, of these?",4,6,7,9,C,math\n'
           "Capital of France?,Rome,Paris,Oslo,Bern,B,geo\n")
    (tmp_path / "train.csv").write_text(csv)
    cfg, data = load("multiple_choice.yaml", tiny_model_dir, tmp_path / "train.csv", tmp_path / "train.csv", tmp_path)
    first = data.train[0]
    assert first.prompt_text.startswith("Which is a prime, of these?\nA. 4\nB. 6\nC. 7\nD. 9\nThink it over")
    assert first.ground_truth == "C" and first.columns["subject"] == "math"
    assert score(cfg, first, "7 is prime. Answer: C") == 1.0
    assert score(cfg, first, "Answer: A") == 0.0
