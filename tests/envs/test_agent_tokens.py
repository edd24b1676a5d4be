"""Token-exact agent trajectories: what trains is what the engine sampled, turn after turn (tool calls too),
and what the model was shown before each turn is the chat template's rendering of the agent's own request
with the model's turns as it wrote them: nothing re-tokenised, nothing lost.

The scheduler, episode runner and the real AgentEnv (the openai client, the endpoint, a sandboxed workspace)
run in this process; the engine is scripted (a tool call, then the answer), with log-probs to compare."""

import random
import re

import pytest

pytest.importorskip("openai")

from gyre.data.batching import collate_groups  # noqa: E402
from gyre.envs.agent import AgentEnv  # noqa: E402
from gyre.envs.calls import EnvCall, EnvResult, SlotPool  # noqa: E402
from gyre.envs.context import ContextBuilder  # noqa: E402
from gyre.envs.episode import EpisodeLimits  # noqa: E402
from gyre.envs.protocol import check_reset, check_step  # noqa: E402
from gyre.models.presets import build_char_tokenizer  # noqa: E402
from gyre.rollout.episodes import EpisodeRunner  # noqa: E402
from gyre.rollout.requests import Generate  # noqa: E402
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec  # noqa: E402
from gyre.types import GenerationResult, PromptRecord, SamplingParams  # noqa: E402
from tests.envs.test_agent import AGENTS, CALL, WORKSPACE  # noqa: E402
from tests.envs.test_context import TOOL_TEMPLATE  # noqa: E402


def _play(tok, agent: str, script, verifier: str | None = None, workspace=None):
    """One step's groups of ``agent`` episodes with a scripted engine: ``script(request, sample index)`` is the
    text it samples. Returns the batch, what was sampled and shown per (request id, sample), the scheduler's
    counters and each episode's final record."""
    spec = ScheduleSpec(2, 2, SamplingParams(max_new_tokens=200), run_seed=3, replicate=True)
    runner = EpisodeRunner(SlotPool(4), ContextBuilder(tok, use_template=True),
                           EpisodeLimits(max_turns=4, turn_tokens=200, context_tokens=4000), spec.sampling)
    sched = RolloutScheduler(spec, engines=2, source=runner)
    envs = {s: AgentEnv(f"{AGENTS}:tasks", entry=f"{AGENTS}:{agent}", verifier=verifier, workspace=workspace,
                        turn_timeout_s=20.0) for s in range(4)}
    rng, sampled, shown, requests, calls = random.Random(0), {}, {}, {}, []
    seeds = iter(PromptRecord(f"s{i}", "", [], str(i)) for i in range(10))
    sched.admit(1, lambda k: [next(seeds) for _ in range(k)])
    try:
        while not sched.ready(1):
            for command in sched.drain():
                if isinstance(command, Generate):
                    requests.update({r.request_id: r for r in command.requests})
                elif isinstance(command, EnvCall):
                    calls.append(command)
            for rid, r in list(requests.items()):
                del requests[rid]
                for i in range(r.n):
                    text = script(r, i)
                    ids = list(tok(text, add_special_tokens=False)["input_ids"])
                    logprobs = [-rng.random() for _ in ids]
                    sampled[rid, i], shown[rid] = (ids, logprobs), list(r.prompt_ids)
                    sched.on_generated([GenerationResult(rid, i, r.prompt_ids, ids, text, logprobs, "stop",
                                                         [0] * len(ids))])
            while calls:
                call = calls.pop(0)
                env = envs[call.slot]
                value = check_reset(env.reset(call.arg)) if call.op == "reset" else check_step(env.step(call.arg))
                if call.op == "step" and value.done:
                    env.records = {**getattr(env, "records", {}), call.call_id.rpartition("@")[0]: list(env.record)}
                sched.on_env([EnvResult(call.call_id, value)])
        batch = sched.take(1)
        stats = dict(sched.stats)
    finally:
        for env in envs.values():
            env.close()
    records = {k: v for env in envs.values() for k, v in getattr(env, "records", {}).items()}
    return batch, sampled, shown, stats, records


def _tool_then_answer(tok):
    def script(r, i):  # a tool call first, then the answer: what the tool printed
        turn = int(r.request_id.rpartition("#")[2])
        return CALL if turn == 0 else re.findall(r"<tool_response>\s*(\d+)", tok.decode(r.prompt_ids))[-1]

    return script


def test_every_turn_trains_the_sampled_ids_and_log_probs_and_every_context_is_the_templates():
    tok = build_char_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    batch, samples, shown, _, records = _play(tok, "tool_agent", _tool_then_answer(tok), f"{AGENTS}:verify",
                                              WORKSPACE)
    sampled = {rid: v for (rid, _), v in samples.items()}
    rows, _ = collate_groups(batch, pad_id=0)
    row = 0
    for group in batch:
        for t in group.trajectories:
            key = f"{group.group_id}/{t.sample_index}"
            turns = sorted((rid for rid in sampled if rid.rpartition("#")[0] == key), key=lambda r: int(r[-1]))
            assert len(turns) == len(t.turns) == 2  # a tool call, then the answer
            ids = t.response_ids
            for turn, rid in zip(t.turns, turns):
                assert ids[turn.start:turn.end] == sampled[rid][0]  # trained ids = sampled ids
            segments = [s for s in t.segments if s.trainable]
            assert [s.logprobs for s in segments] == [sampled[rid][1] for rid in turns]
            # what the trainer gets: its mask covers exactly the sampled tokens, with the sampler's log-probs
            mask = rows.response_mask[row].bool()
            assert rows.input_ids[row][mask].tolist() == sampled[turns[0]][0] + sampled[turns[1]][0]
            both = sampled[turns[0]][1] + sampled[turns[1]][1]
            assert rows.rollout_logprobs[row][mask].tolist() == pytest.approx(both)
            # what the model was shown before its second turn: the template of the agent's request, the model's
            # first turn as it wrote it (raw text, not the parsed tool call), the tool's output as a tool message
            record = records[key]
            conversation = [m if m["role"] != "assistant" else {"role": "assistant", "content": CALL}
                            for m in record[:-1]]
            text = tok.apply_chat_template(conversation, tools=None, tokenize=False, add_generation_prompt=True)
            first_request = tok.apply_chat_template(record[:2], tools=_tools(), tokenize=False,
                                                    add_generation_prompt=True)
            assert shown[turns[0]] == list(tok(first_request, add_special_tokens=False)["input_ids"])
            assert shown[turns[1]][len(shown[turns[0]]):] == \
                list(tok(text, add_special_tokens=False)["input_ids"])[len(_plain(tok, record[:2])):]
            assert t.reward.score == 1.0 and record[3]["role"] == "tool"
            assert record[3]["content"].strip() == record[4]["content"]
            row += 1


def _tools():
    from tests.envs.agents_for_tests import TOOLS

    return TOOLS


def _plain(tok, messages):
    return list(tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False)["input_ids"])


def test_of_n_choices_the_one_the_agent_goes_on_with_trains_and_the_others_are_waste():
    tok = build_char_tokenizer()
    tok.chat_template = TOOL_TEMPLATE

    def script(r, i):  # three choices for the first turn, one right; "yes" when asked whether it is sure
        if int(r.request_id.rpartition("#")[2]) == 0:
            a, b = map(int, re.findall(r"What is (\d+) \* (\d+)", tok.decode(r.prompt_ids))[-1])
            return str(a * b + i - 1)  # choice 1 is right
        return "yes"

    batch, sampled, shown, stats, records = _play(tok, "best_of_agent", script)
    trained = 0
    for group in batch:
        for t in group.trajectories:
            key = f"{group.group_id}/{t.sample_index}"
            first, second = sampled[f"{key}#0", 1], sampled[f"{key}#1", 0]
            assert [s.token_ids for s in t.segments if s.trainable] == [first[0], second[0]]  # the chosen choice
            assert [s.logprobs for s in t.segments if s.trainable] == [first[1], second[1]]
            assert records[key][1]["content"] == tok.decode(first[0])
            # the second turn was shown the chosen choice, as sampled, then the agent's "sure?"
            assert shown[f"{key}#1"][:len(shown[f"{key}#0"]) + len(first[0])] == shown[f"{key}#0"] + first[0]
            trained += 1
    unchosen = sum(len(v[0]) for (rid, i), v in sampled.items() if rid.endswith("#0") and i != 1)
    assert trained == 4 and stats["rollout/tokens_wasted"] == unchosen > 0
    assert stats["agent/choice_unknown"] == 0
