"""The agentic quickstart's warm-up transcripts are conversations exactly as a run builds them."""

import json

from gyre.envs.builtin.guess import GuessNumber
from gyre.envs.context import ContextBuilder
from gyre.models.presets import build_char_tokenizer
from gyre.tasks.guess import GuessSpec, write_guess_task


def test_transcripts_match_the_runs_token_context(tmp_path):
    path = write_guess_task(tmp_path, GuessSpec(low=1, high=4, max_turns=3, episodes=20))["sft"]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert 20 <= len(rows) <= 60 and all(r["response"].startswith("\\boxed{") for r in rows)
    # Rebuild the third row's context turn by turn, as the episode runner does.
    tok = build_char_tokenizer()
    ctx = ContextBuilder(tok, use_template=False)
    later = next(r for r in rows if r["prompt"].count("\\boxed") == 2)  # the instructions show one too
    first_obs, rest = later["prompt"].split("\n", 1)
    action, obs = rest.split("\n")[0], rest.split("\n")[1]
    ids = ctx.first(first_obs) + list(tok(action, add_special_tokens=False)["input_ids"])
    ids += ctx.observation(ids[-1:], obs)
    assert ids == list(tok(later["prompt"])["input_ids"])
    assert first_obs == GuessNumber(1, 4, 3).reset(0)[0]
