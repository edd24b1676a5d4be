"""TRL reward functions, as TRL users write them: ``(completions, **kwargs) -> list[float]``, with the data
columns and ``prompts`` as lists, accepted as they are (known by their ``completions`` parameter)."""

import json
from pathlib import Path

import pytest

from gyre.app.cli import main
from gyre.rewards.base import RewardRequest, batched, call_reward


def request():
    return RewardRequest("The answer is 4", "4", prompt="2+2?", tag="t",
                         columns={"solution": "2+2=4 #### 4", "level": 2, "response": "shadow"})


def test_a_trl_function_gets_one_item_lists_and_its_score_is_the_result():
    seen = {}

    def accuracy_reward(completions, solution, **kwargs):
        seen.update(kwargs, completions=completions, solution=solution)
        return [1.0 if c.endswith(s.rpartition("#### ")[2]) else 0.0 for c, s in zip(completions, solution)]

    assert batched(accuracy_reward) and not batched(lambda response, ground_truth: 1.0)
    result = call_reward(accuracy_reward, request(), {"scale": 2})
    assert result.score == 1.0 and result.correct is None
    # The raw answer column as written, the mapped ground truth, prompts and the other columns, as lists;
    # the domain's kwargs as they are. gyre's reserved names never arrive as columns.
    assert seen == {"completions": ["The answer is 4"], "solution": ["2+2=4 #### 4"], "prompts": ["2+2?"],
                    "ground_truth": ["4"], "level": [2], "response": ["shadow"], "scale": 2}


def test_a_chat_prompt_is_passed_as_trl_passes_conversational_data():
    """prompts: the chat's messages; completions: the reply as an assistant message (completion[0]["content"])."""
    seen = {}

    def accuracy_reward(prompts, completions, solution, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [float(c[0]["content"].endswith(s)) for c, s in zip(completions, solution)]

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    req = request()
    req.messages = chat
    assert call_reward(accuracy_reward, req, {}).score == 0.0  # "The answer is 4" vs the column "2+2=4 #### 4"
    assert seen == {"prompts": [chat], "completions": [[{"role": "assistant", "content": "The answer is 4"}]]}


def test_a_trl_function_with_named_parameters_gets_only_those():
    def length_penalty(prompts, completions, level):
        return [float(len(c) < 100) * lev for c, lev in zip(completions, level)]

    assert call_reward(length_penalty, request(), {}).score == 2.0


def test_a_wrong_number_of_scores_or_none_is_a_clear_error():
    with pytest.raises(TypeError, match="must return a list with one score per completion: given 1 completion, it "
                                        "returned 2 values"):
        call_reward(lambda completions, **kw: [1.0, 0.0], request(), {})
    with pytest.raises(TypeError, match=r"returned \[None\]"):
        call_reward(lambda completions, **kw: [None], request(), {})
    assert call_reward(lambda completions, **kw: [True], request(), {}).correct is True


def test_gyre_check_accepts_a_trl_reward_file(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "trl_reward.py").write_text(
        "def format_reward(completions, **kwargs):\n"
        "    return [float(c.strip().isdigit()) for c in completions]\n")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "solution": str(i + 1)}) + "\n" for i in range(8)))
    code = main(["check", str(Path("gyre/recipes/quickstart.yaml").resolve()), f"model.path={tiny_model_dir}",
                 f"data.train_files=[{data}]", "data.val_files=[]", "validation.every=0", "data.answer_key=solution",
                 "reward.type=function", f"reward.function={tmp_path / 'trl_reward.py'}:format_reward",
                 "sft_warmup=null"])
    out, err = capsys.readouterr()
    assert code == 0, out[-2000:] + err[-2000:]
    assert "returned list" not in out + err
