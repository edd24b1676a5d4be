"""LLM-as-judge rewards: a judge model reads the question, the reference and the answer, and replies
with a score that a regex extracts (the last match counts) and scales to [0, 1].

Two backends share the prompt and the parsing:
- ``openai_judge_reward``: any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, SGLang, a
  provider), with retries and exponential back-off on network errors, 429 and 5xx, and a per-process
  rate limit. It runs in the reward workers' processes like any reward function.
- ``LocalJudge``: a local Hugging Face model sampled greedily by gyre's own rollout engine, held by a
  judge role (``gyre.cluster.workers.JudgeWorker``) so one batched generate scores many samples.

A reply without a score is a failed reward (status "error", score 0, counted), not a silent 0.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request

from gyre.types import RewardResult


def judge_prompt(template: str, prompt: str, response: str, ground_truth: str) -> str:
    """The template with {prompt}, {response} and {ground_truth} filled in. Plain replacement, not
    ``str.format``: answers full of braces (code, LaTeX) must not break the template."""
    return template.replace("{prompt}", prompt).replace("{ground_truth}", ground_truth).replace("{response}", response)


def parse_judge_score(reply: str, pattern: str, max_score: float, pass_score: float) -> RewardResult:
    """The last ``pattern`` match in ``reply``, divided by ``max_score`` and clamped to [0, 1]."""
    matches = re.findall(pattern, reply)
    if not matches:
        result = RewardResult.failed("error", f"the judge's reply has no score: {reply[:200]!r}")
        result.info = {"reply": reply[:500]}
        return result
    last = matches[-1]
    raw = float(last[0] if isinstance(last, tuple) else last)
    score = min(1.0, max(0.0, raw / max_score))
    return RewardResult(score=score, correct=score >= pass_score, info={"judge_score": raw})


class _RateLimiter:
    """At most ``rate`` calls per second from this process (the judge's quota is shared by every
    reward process, so the config divides it)."""

    def __init__(self) -> None:
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self, rate: float | None) -> None:
        if not rate:
            return
        with self._lock:
            now = time.monotonic()
            delay = max(0.0, self._next - now)
            self._next = max(now, self._next) + 1.0 / rate
        if delay:
            time.sleep(delay)


_LIMITER = _RateLimiter()
_RETRYABLE_HTTP = {408, 409, 429, 500, 502, 503, 504}


def _post_chat(url: str, body: dict, api_key: str | None, timeout: float) -> str:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                                 headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the URL is the user's endpoint
        payload = json.loads(resp.read())
    return payload["choices"][0]["message"]["content"] or ""


def openai_judge_reward(response: str, ground_truth: str, prompt: str = "", *, url: str, model: str,
                        template: str, score_pattern: str, max_score: float = 10.0, pass_score: float = 0.5,
                        api_key_env: str | None = None, retries: int = 3, rate_limit_per_s: float | None = None,
                        request_timeout_s: float = 30.0, max_new_tokens: int = 32) -> RewardResult:
    """Ask an OpenAI-compatible endpoint to grade ``response``; retried on transient failures."""
    api_key = os.environ.get(api_key_env) if api_key_env else None
    if api_key_env and not api_key:
        raise RuntimeError(f"judge.api_key_env names {api_key_env}, which is not set in the reward workers' "
                           "environment")
    body = {"model": model, "temperature": 0.0, "max_tokens": max_new_tokens,
            "messages": [{"role": "user", "content": judge_prompt(template, prompt, response, ground_truth)}]}
    last_error = ""
    for attempt in range(retries + 1):
        _LIMITER.wait(rate_limit_per_s)
        try:
            reply = _post_chat(url, body, api_key, request_timeout_s)
            result = parse_judge_score(reply, score_pattern, max_score, pass_score)
            result.info["attempts"] = attempt + 1
            return result
        except urllib.error.HTTPError as exc:
            last_error = f"HTTP {exc.code} from {url}"
            if exc.code not in _RETRYABLE_HTTP:
                break
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        except (KeyError, IndexError, json.JSONDecodeError) as exc:
            last_error = f"malformed reply from {url}: {exc}"
            break
        time.sleep(min(8.0, 0.25 * 2 ** attempt))
    raise RuntimeError(f"judge request failed after {attempt + 1} attempt(s): {last_error}")


class LocalJudge:
    """A local judge model, sampled greedily in batches by one of gyre's rollout engines (``judge.engine``)."""

    def __init__(self, judge, device, trust_remote_code: bool = False, threads: int = 1, dtype: str = "float32"):
        from gyre.models.loading import load_causal_lm, load_tokenizer

        self.cfg = judge
        self.tokenizer = load_tokenizer(judge.model_path, trust_remote_code)
        if judge.engine == "vllm":
            from gyre.engines.vllm_rollout import vllm_engine

            self.engine = vllm_engine(judge.model_path, self.tokenizer, threads, dtype=dtype,
                                      max_batch_size=judge.max_batch_size, device=str(device))
            return
        from gyre.engines.hf_rollout import HFRolloutEngine

        model = load_causal_lm(judge.model_path, dtype, trust_remote_code, str(device))
        self.engine = HFRolloutEngine(model, self.tokenizer, device, judge.max_batch_size)

    def _render(self, text: str) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def score(self, requests) -> list[RewardResult]:
        from gyre.types import GenerationRequest, SamplingParams

        start = time.perf_counter()
        params = SamplingParams(temperature=0.0, max_new_tokens=self.cfg.max_new_tokens)
        gen = [GenerationRequest(f"judge-{i}", self._render(judge_prompt(self.cfg.template, r.prompt, r.response,
                                                                         r.ground_truth)), params)
               for i, r in enumerate(requests)]
        replies = self.engine.generate(gen)
        results = [parse_judge_score(res.response_text, self.cfg.score_pattern, self.cfg.max_score,
                                     self.cfg.pass_score) for res in replies]
        elapsed = time.perf_counter() - start
        for result in results:
            result.latency_s = elapsed
        return results
