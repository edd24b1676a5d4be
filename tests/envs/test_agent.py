"""An agent program trained through the endpoint: the real openai client, a tool loop, a sandboxed workspace.

The model's side is played by hand here (reset / step with chosen turns), so every observation and answer
can be checked exactly; tests/pipelines/test_agent_run.py trains a tiny model through the same path."""

import functools
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")

from gyre.envs.agent import AgentEnv  # noqa: E402
from gyre.envs.protocol import check_reset, check_step  # noqa: E402

HERE = Path(__file__).parent
AGENTS = f"{HERE / 'agents_for_tests.py'}"
WORKSPACE = {"disk_mb": 4, "max_files": 50, "cpu_s": 5.0, "wall_s": 10.0, "memory_mb": 256, "max_commands": 8,
             "output_chars": 2000}
CODE = "a, b = map(int, open('notes.txt').read().split())\nprint(a * b)"
CALL = f'<tool_call>\n{json.dumps({"name": "python", "arguments": {"code": CODE}})}\n</tool_call>'


def make(agent="tool_agent", **kw):
    kw.setdefault("verifier", f"{AGENTS}:verify")
    return AgentEnv(f"{AGENTS}:tasks", entry=f"{AGENTS}:{agent}", turn_timeout_s=20.0, **kw)


@pytest.mark.parametrize("agent", ["tool_agent", "stream_agent"])
def test_a_tool_using_agent_plays_an_episode_through_the_openai_client(agent):
    env = make(agent, workspace=WORKSPACE)
    try:
        reset = check_reset(env.reset(2))  # task 2: 5 * 6
        first = reset.observation
        assert [m["role"] for m in first["messages"]] == ["system", "user"]
        assert first["messages"][1]["content"] == "What is 5 * 6?"
        assert first["tools"][0]["function"]["name"] == "python"
        assert env.workspace.files() == ["notes.txt"]
        # the model calls the tool: the agent runs it in the sandboxed workspace and sends its output back
        step = check_step(env.step(CALL))
        assert not step.done and step.reward == 0.0
        (tool,) = step.observation["messages"]
        assert tool["role"] == "tool" and tool["content"] == "30\n" and tool["tool_call_id"].startswith("call_")
        # the record holds the model's turn as the agent received it: a tool call, no content
        assert env.record[2]["tool_calls"][0]["function"] == {"name": "python", "arguments": {"code": CODE}}
        done = check_step(env.step("30"))
        assert done.terminated and done.reward == 1.0 and done.info["success"] is True
        assert done.info["agent/requests"] == 2 and done.info["agent/history_mismatch"] == 0
        path = env.workspace.path
    finally:
        env.close()
    assert not path.exists()  # the workspace goes with its episode


def test_a_wrong_answer_scores_zero_and_the_next_episode_starts_clean():
    env = make(workspace=WORKSPACE)
    try:
        env.reset(0)
        old = env.workspace.path
        assert check_step(env.step("7")).reward == 0.0
        env.reset(1)
        assert not old.exists() and env.workspace.path != old
        assert env.record[1]["content"] == "What is 4 * 5?"
    finally:
        env.close()


def test_the_requests_stop_strings_and_token_cap_reach_the_turns_sampling():
    env = make()
    try:
        obs, _ = env.reset(0)
        assert obs["sampling"] == {"stop": ["</answer>"], "max_tokens": None, "n": 1}
    finally:
        env.close()


def test_an_agent_that_raises_scores_error_reward_and_is_counted():
    env = make("broken_agent", verifier=None, error_reward=-1.0)
    try:
        env.reset(0)
        step = check_step(env.step("12"))
        assert step.terminated and step.reward == -1.0 and step.info["agent/errors"] == 1
    finally:
        env.close()


def test_an_edited_history_is_counted_and_the_model_keeps_its_own_record():
    env = make("editing_agent", verifier=None)
    try:
        env.reset(0)  # 3 * 4
        step = check_step(env.step("11"))
        # the agent sent back "11 (edited)": the model's context keeps "11"; only the new message is appended
        assert step.observation["messages"] == [{"role": "user", "content": "sure?"}]
        assert env.record[1] == {"role": "assistant", "content": "11"}
        done = check_step(env.step("12"))
        assert done.reward == 1.0 and done.info["agent/history_mismatch"] == 1
    finally:
        env.close()


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_are_answered_and_the_one_the_agent_goes_on_with_is_the_turn(stream):
    env = make("best_of_agent", verifier=None)
    env.agent = functools.partial(env.agent, stream=stream)
    try:
        obs, _ = env.reset(0)  # 3 * 4
        assert obs["sampling"]["n"] == 3
        step = check_step(env.step(["11", "12", "13"]))  # the agent goes on with the right one, the second
        assert step.info == {"choice": 1} and step.observation["messages"] == [{"role": "user", "content": "sure?"}]
        assert env.record[1] == {"role": "assistant", "content": "12"}
        done = check_step(env.step("12"))
        assert done.reward == 1.0
        assert done.info["agent/choice_unknown"] == 0 and done.info["agent/history_mismatch"] == 0
    finally:
        env.close()


def test_choices_an_agent_ends_after_keep_the_one_it_names_else_the_first_counted():
    env = AgentEnv([{"question": "q", "answer": "1", "stop_after_choices": True}], entry=f"{AGENTS}:best_of_agent")
    try:
        env.reset(0)
        done = check_step(env.step(["a", "b", "c"]))
        assert done.terminated and done.reward == 1.0
        assert done.info["choice"] == 0 and done.info["agent/choice_unknown"] == 1
        assert env.record[-1] == {"role": "assistant", "content": "a"}
    finally:
        env.close()
    env = AgentEnv([{"question": "q", "answer": "1", "stop_after_choices": True, "name": "c"}],
                   entry=f"{AGENTS}:best_of_agent")
    try:  # an agent that names the choice it used: the reward goes to that one
        env.reset(0)
        done = check_step(env.step(["a", "b", "c"]))
        assert done.info["choice"] == 2 and done.info["agent/choice_unknown"] == 0
        assert env.record[-1] == {"role": "assistant", "content": "c"}
    finally:
        env.close()


def test_a_command_agent_gets_the_endpoint_and_task_in_its_environment_and_runs_in_its_workspace():
    env = AgentEnv(f"{AGENTS}:tasks", command=[sys.executable, AGENTS], verifier=f"{AGENTS}:verify",
                   workspace=WORKSPACE, turn_timeout_s=20.0)
    try:
        obs, _ = env.reset(0)
        assert obs["messages"] == [{"role": "user", "content": "What is 3 * 4?"}]
        workspace = env.workspace.path
        done = check_step(env.step("12"))
        assert done.reward == 1.0
    finally:
        env.close()
    assert not workspace.exists()


def test_a_request_with_another_sessions_key_is_refused():
    import openai

    env = make()
    try:
        env.reset(0)
        stale = openai.OpenAI(base_url=env.endpoint.url, api_key="gyre-not-this-one", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            stale.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        assert json.loads(json.dumps(env.record))[1]["content"] == "What is 3 * 4?"
    finally:
        env.close()


@pytest.mark.parametrize("program", ["entry", "command"])
def test_an_agent_killed_on_its_deadline_leaves_no_workspace_and_no_process(program):
    """The host kills a hung environment's process: its scratch directory (the workspaces in it) goes with it,
    and a command agent dies with it."""
    import os
    import time

    from gyre.envs.host import EnvSlot, EnvSpec

    agent = {"entry": f"{AGENTS}:sleepy_agent"} if program == "entry" else {"command": [sys.executable, AGENTS, "hang"]}
    spec = EnvSpec("gyre:agent", {"tasks": f"{AGENTS}:tasks", "workspace": WORKSPACE, "turn_timeout_s": 20.0, **agent})
    slot = EnvSlot(spec)
    try:
        assert not hasattr(slot.reset(0, 30.0), "kind")  # an observation, not a failure
        scratch = slot._scratch
        assert [p.startswith("gyre-workspace-") for p in os.listdir(scratch)].count(True) == 1
        pid = int(open(os.path.join(scratch, "agent.pid")).read()) if program == "command" else None
        failure = slot.step("12", 2.0)  # the agent never answers or returns: killed at the deadline
        assert failure.kind == "timeout" and not os.path.exists(scratch)
        if pid is not None:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            assert not _alive(pid)
    finally:
        slot.close()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(")")[-1].split()[0] != "Z"
