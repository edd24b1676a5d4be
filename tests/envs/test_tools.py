"""Tool calls in both formats, and the Python tool inside the code sandbox."""

from gyre.envs.builtin.python_math import PythonMath
from gyre.envs.protocol import check_reset, check_step
from gyre.envs.tools import ToolCall, parse_tool_call


def test_tool_calls_are_parsed_in_both_formats():
    assert parse_tool_call("let me check <python>print(6*7)</python>", ["python"], "tags") == \
        ToolCall("python", "print(6*7)")
    assert parse_tool_call("\\boxed{42}", ["python"], "tags") is None
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
    assert parse_tool_call(call, ["python"], "json") == ToolCall("python", "print(1)")
    assert "no tool named 'search'" in parse_tool_call(call.replace("python", "search", 1), ["python"], "json")
    assert "must be JSON" in parse_tool_call("<tool_call>{oops</tool_call>", ["python"], "json")


def test_python_math_runs_the_tool_in_the_sandbox_then_checks_the_answer(tmp_path):
    env = PythonMath(max_tool_calls=1, allow_weak=True)
    obs = check_reset(env.reset(3)).observation
    expr = obs.split("What is ")[1].split("?")[0]
    out = check_step(env.step(f"<python>print({expr})</python>"))
    assert not out.done and out.reward == 0.0 and out.observation.strip().endswith(str(env.env.answer))
    assert "used up" in check_step(env.step("<python>print(1)</python>")).observation  # one call here
    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret-4711")
    secret.chmod(0o644)
    env.reset(4)
    peek = check_step(env.step(f"<python>print(open({str(secret)!r}).read())</python>"))
    assert "host-secret-4711" not in peek.observation and "[error]" in peek.observation
    final = check_step(env.step(f"\\boxed{{{env.env.answer}}}"))
    assert final.terminated and final.reward == 1.0
