"""The OpenAI chat API as a training session serves it: requests checked, tool calls read in the common
formats, answers written whole and as chunks, histories compared in substance."""

import json

import pytest

from gyre.envs.chat_api import (
    RequestError,
    assistant_message,
    completion,
    extends,
    parse_tool_calls,
    plain_message,
    read_request,
    stream_chunks,
)


def test_tool_calls_in_each_format_and_the_content_around_them():
    content, calls = parse_tool_calls('Let me run it.\n<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n'
                                      '</tool_call>\n<tool_call>{"name": "ls", "arguments": {}}</tool_call>')
    assert content == "Let me run it." and [(c.name, json.loads(c.arguments)) for c in calls] == \
        [("python", {"code": "1"}), ("ls", {})]
    content, calls = parse_tool_calls('ok [TOOL_CALLS] [{"name": "f", "arguments": {"x": 2}}]', "mistral")
    assert content == "ok" and calls[0].name == "f" and json.loads(calls[0].arguments) == {"x": 2}
    content, calls = parse_tool_calls('<|python_tag|>{"name": "f", "parameters": {"x": 1}}')  # Llama 3, auto
    assert content == "" and json.loads(calls[0].arguments) == {"x": 1}
    # a call whose JSON is broken is left in the text: the agent sees what the model wrote
    broken = '<tool_call>{"name": "python", "arguments": {"code": </tool_call>'
    assert parse_tool_calls(broken) == (broken, [])
    assert parse_tool_calls('{"name": "f"}', "none") == ('{"name": "f"}', [])
    assert parse_tool_calls("The answer is {x}.") == ("The answer is {x}.", [])


def test_an_assistant_message_has_tool_calls_or_content_and_its_finish_reason():
    message, finish = assistant_message('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', "hermes")
    assert finish == "tool_calls" and message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert assistant_message("42", "auto") == ({"role": "assistant", "content": "42"}, "stop")


def test_a_request_is_checked_and_what_it_asks_beyond_the_run_is_counted():
    r = read_request({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "be"},
                                                                                  {"type": "text", "text": " brief"}]},
                                                 {"role": "user", "content": "hi"}],
                      "stop": "END", "max_tokens": 9, "temperature": 0.2, "top_p": 1.0, "seed": 3,
                      "tool_choice": "required", "response_format": {"type": "json_object"}}, 1.0, 1.0)
    assert r.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert r.stop == ("END",) and r.max_tokens == 9
    assert r.overridden == ("temperature", "seed", "tool_choice", "response_format")
    assert r.n == 1 and read_request({"messages": [{"role": "user", "content": "x"}], "n": 3}, 1.0, 1.0).n == 3


@pytest.mark.parametrize("extra, why", [
    ({"messages": []}, "non-empty"), ({"messages": [{"content": "x"}]}, "needs a role"),
    ({"messages": ["hi"]}, "needs a role"), ({"n": 17}, "n=17"), ({"n": 0}, "n=0"), ({"n": 2.0}, "n=2.0"),
    ({"n": True}, "n=True"), ({"max_tokens": 0}, "positive integer"), ({"max_tokens": "9"}, "positive integer"),
    ({"temperature": "hot"}, "temperature='hot': a finite number"), ({"temperature": float("nan")}, "temperature=nan"),
    ({"top_p": float("inf")}, "top_p=inf"), ({"top_p": [1]}, "top_p"), ({"stop": 5}, "stop=5"),
    ({"stop": ["a", 1]}, "stop="), ({"stream_options": 1}, "stream_options=1: an object"),
    ({"response_format": "json"}, "response_format"), ({"tools": {"f": 1}}, "tools must be a list"),
    ({"tools": ["f"]}, "tools must be a list"),
    ({"messages": [{"role": "user", "content": 5}]}, "content is text"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]}, "tool_calls: a list"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": {"function": {"name": "f"}}}]}, "tool_calls"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 3}}]}]}, "tool_calls"),
])
def test_a_malformed_request_is_a_request_error_naming_the_field(extra, why):
    with pytest.raises(RequestError, match=why):
        read_request({"messages": [{"role": "user", "content": "x"}], **extra}, 1.0, 1.0)
    with pytest.raises(RequestError, match="JSON object"):
        read_request([], 1.0, 1.0)


def test_chunks_carry_the_role_the_content_the_calls_and_the_finish():
    message, finish = assistant_message('hm <tool_call>{"name": "f", "arguments": {}}</tool_call>', "hermes")
    chunks = stream_chunks([(message, finish)], "m", {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3})
    deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[1] == {"content": "hm"}
    assert deltas[2]["tool_calls"][0]["index"] == 0 and deltas[2]["tool_calls"][0]["function"]["name"] == "f"
    assert chunks[3]["choices"][0]["finish_reason"] == "tool_calls" and chunks[4]["usage"]["total_tokens"] == 3


def test_several_choices_are_answered_in_order_whole_and_as_chunks():
    choices = [assistant_message("first", "auto"), assistant_message('{"name": "f", "arguments": {"x": 1}}', "json")]
    whole = completion(choices, "m", None)
    assert [(c["index"], c["finish_reason"]) for c in whole["choices"]] == [(0, "stop"), (1, "tool_calls")]
    assert whole["choices"][0]["message"]["content"] == "first" and "usage" not in whole
    assert json.loads(whole["choices"][1]["message"]["tool_calls"][0]["function"]["arguments"]) == {"x": 1}
    chunks = stream_chunks(choices, "m", None)
    by_choice = [(c["choices"][0]["index"], c["choices"][0]["finish_reason"]) for c in chunks]
    assert by_choice == [(0, None), (0, None), (0, "stop"), (1, None), (1, None), (1, "tool_calls")]


def test_a_history_extends_the_record_in_substance_not_form():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"b": 2, "a": 1}'}}
    record = [{"role": "user", "content": "q"}, plain_message({"role": "assistant", "content": None,
                                                               "tool_calls": [call]})]
    resent = [{"role": "user", "content": "q"},
              {"role": "assistant", "content": "", "tool_calls": [{**call, "id": "other", "function": {
                  "name": "f", "arguments": '{"a":1,"b":2}'}}]},
              {"role": "tool", "tool_call_id": "other", "content": "3"}]
    assert extends(resent, record)
    edited = [dict(resent[0], content="q!"), *resent[1:]]
    assert not extends(edited, record) and not extends(resent[:1], record)
