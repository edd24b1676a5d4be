"""LLM-judge rewards: score parsing, a real OpenAI-compatible HTTP endpoint (a local server), a local model."""

import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gyre.config.reward_schema import DEFAULT_JUDGE_TEMPLATE, JudgeConfig
from gyre.rewards.base import RewardRequest
from gyre.rewards.judge import LocalJudge, judge_prompt, openai_judge_reward, parse_judge_score
from gyre.types import GenerationRequest, SamplingParams

PATTERN = JudgeConfig(backend="openai", url="x", model="m").score_pattern


def test_parse_judge_score():
    r = parse_judge_score("Reasoning... Score: 3. Actually, Score: 8", PATTERN, 10.0, 0.5)
    assert r.score == pytest.approx(0.8) and r.correct and r.info["judge_score"] == 8.0  # the last match counts
    assert parse_judge_score("score=12", PATTERN, 10.0, 0.5).score == 1.0  # clamped to [0, 1]
    missing = parse_judge_score("I cannot grade this.", PATTERN, 10.0, 0.5)
    assert missing.status == "error" and missing.score == 0.0 and "no score" in missing.error


def test_judge_prompt_keeps_braces_in_answers():
    text = judge_prompt(DEFAULT_JUDGE_TEMPLATE, "Q {x}?", "def f(): return {1: 2}", "{}")
    assert "def f(): return {1: 2}" in text and "Q {x}?" in text


class _Judge(BaseHTTPRequestHandler):
    calls: list = []
    fail_first = 0

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append((time.monotonic(), body, self.headers.get("Authorization")))
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(503)
            self.end_headers()
            return
        content = body["messages"][0]["content"]
        score = 9 if "to grade: 4\n" in content.lower() else 2
        payload = {"choices": [{"message": {"role": "assistant", "content": f"Score: {score}"}}]}
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def judge_server():
    _Judge.calls, _Judge.fail_first = [], 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def _call(url, response, **kw):
    args = dict(url=url, model="judge-1", template=DEFAULT_JUDGE_TEMPLATE, score_pattern=PATTERN, max_score=10.0,
                pass_score=0.5)
    return openai_judge_reward(response, "4", prompt="2+2?", **{**args, **kw})


def test_openai_endpoint_scores_retries_and_authenticates(judge_server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "secret")
    good = _call(judge_server, "4", api_key_env="JUDGE_KEY")
    assert good.score == pytest.approx(0.9) and good.correct
    _, body, auth = _Judge.calls[-1]
    assert body["model"] == "judge-1" and body["temperature"] == 0.0 and auth == "Bearer secret"
    assert _call(judge_server, "5").score == pytest.approx(0.2)
    _Judge.fail_first = 2  # two 503s, then an answer: retried with back-off
    assert _call(judge_server, "4", retries=3).info["attempts"] == 3


def test_openai_endpoint_gives_up_and_rate_limits(judge_server):
    _Judge.fail_first = 5
    with pytest.raises(RuntimeError, match="failed after 2 attempt"):
        _call(judge_server, "4", retries=1)
    _Judge.fail_first = 0
    start = len(_Judge.calls)
    for _ in range(3):
        _call(judge_server, "4", rate_limit_per_s=10.0)
    stamps = [t for t, _, _ in _Judge.calls[start:]]
    assert stamps[-1] - stamps[0] >= 0.18  # 3 calls at 10/s span at least 2 intervals
    with pytest.raises(RuntimeError, match="not set"):
        _call(judge_server, "x", api_key_env="GYRE_NO_SUCH_KEY")


def test_unreachable_endpoint_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="failed after 1 attempt"):
        _call("http://127.0.0.1:9/v1", "4", retries=0, request_timeout_s=2)


def test_local_judge_scores_a_batch_with_the_rollout_engine(tiny_model_dir):
    judge = JudgeConfig(model_path=str(tiny_model_dir), max_new_tokens=4, score_pattern=r"(\d)")
    scorer = LocalJudge(judge, "cpu")
    requests = [RewardRequest(f"{i}", "4", "2+2=") for i in range(3)]
    results = scorer.score(requests)
    assert len(results) == 3 and all(r.latency_s > 0 for r in results)
    # An untrained judge writes noise: each reply either holds a digit (a score) or is a counted failure.
    assert all((r.status == "ok" and 0 <= r.score <= 1) or (r.status == "error" and r.score == 0) for r in results)
    again = scorer.score(requests)  # greedy: deterministic
    assert [r.score for r in again] == [r.score for r in results]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (gyre[vllm])")
def test_a_local_judge_on_vllm_replies_as_the_hf_engine_does(tiny_model_dir):
    """judge.engine=vllm (make test-vllm): the same greedy replies, so the same scores, as on gyre's engine."""
    requests = [RewardRequest(f"{i}", answer, prompt) for i, (prompt, answer) in
                enumerate([("2+2=", "4"), ("7*3=", "21"), ("10-4=", "6")])]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    replies = {}
    for engine in ("hf", "vllm"):
        judge = JudgeConfig(model_path=str(tiny_model_dir), max_new_tokens=6, score_pattern=r"(\d)", engine=engine)
        scorer = LocalJudge(judge, "cpu")
        asked = [scorer._render(judge_prompt(judge.template, r.prompt, r.response, r.ground_truth)) for r in requests]
        texts = scorer.engine.generate([GenerationRequest(str(i), ids, greedy) for i, ids in enumerate(asked)])
        replies[engine] = ([t.response_text for t in texts], [(r.status, r.score) for r in scorer.score(requests)])
    assert replies["vllm"] == replies["hf"]


def test_a_local_judge_holds_its_weights_in_the_runs_dtype(tiny_model_dir):
    import torch

    judge = JudgeConfig(model_path=str(tiny_model_dir), max_new_tokens=2, score_pattern=r"(\d)")
    scorer = LocalJudge(judge, "cpu", dtype="bfloat16")
    assert {p.dtype for p in scorer.engine.model.parameters()} == {torch.bfloat16}
    assert len(scorer.score([RewardRequest("0", "4", "2+2=")])) == 1
