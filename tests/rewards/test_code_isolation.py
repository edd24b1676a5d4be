"""Assert tests the parent cannot split: literal loops are unrolled and split; the rest run isolated, their
verdict written by a sandboxed process the program never runs in (issue 25)."""

from __future__ import annotations

import ast
import json

import pytest

from gyre.rewards import asserts
from gyre.rewards.code import code_reward
from gyre.rewards.sandbox import SandboxLimits, run_python, sandbox_capabilities
from gyre.rewards.sandbox.weak import run_weak

CAPS = sandbox_capabilities()
contained = pytest.mark.skipif(CAPS["mode"] == "weak", reason=f"no kernel containment here: {CAPS['reason']}")
FAST = {"timeout_s": 3.0}
SQUARES = json.dumps({"asserts": ["def check(candidate):\n    for i in range(20):\n"
                                  "        assert candidate(i) == i * i\ncheck(square)"]})
LITERAL_LOOP = json.dumps({"asserts": ["for a, b in [(1, 2), (3, 4)]:\n    assert f(a) == b"]})


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


# --- literal loops are split ---------------------------------------------------------------------------


@pytest.mark.parametrize("test, checks", [
    ("for a, b in [(1, 2), (3, 4)]:\n    assert f(a) == b", ["__out_0 == 2", "__out_1 == 4"]),
    ("cases = [(1, [2]), (3, [4])]\nfor x, y in cases:\n    assert f(x) == y", ["__out_0 == [2]", "__out_1 == [4]"]),
    ("def check(candidate):\n    for x in [1, 2]:\n        expected = 5\n        assert candidate(x) < expected\n"
     "check(f)", ["__out_0 < 5", "__out_1 < 5"]),
    ("for xs in [[1, 2], [3]]:\n    for x in xs:\n        assert f(x) == x * 2",
     ["__out_0 == 1 * 2", "__out_1 == 2 * 2", "__out_2 == 3 * 2"]),
])
def test_loops_over_literals_are_unrolled_and_split(test, checks):
    import ast

    plan = asserts.plan_test(test, "")
    assert [ast.unparse(c) for c in plan.checks] == checks


@pytest.mark.parametrize("test", [
    "for i in range(3):\n    assert f(i) == i",  # not a literal
    "for a in [1, 2]:\n    a = 3\n    assert f(a)",  # the body rebinds the loop variable
    "for a, b in [(1, 2), 3]:\n    assert f(a) == b",  # an element that does not unpack
    "for a in [1, 2]:\n    print(a)\n    assert f(a)",  # a statement that is not an assert
    "for a in [1, 2]:\n    assert f(a)\nelse:\n    pass",
])
def test_other_loops_are_not_split(test):
    with pytest.raises(asserts.Unsplittable):
        asserts.plan_test(test, "")


def test_a_literal_loop_test_is_compared_outside_the_sandbox():
    good = code_reward(fenced("def f(x):\n    return x + 1"), LITERAL_LOOP, **FAST)
    assert good.score == 1.0 and "unsplit" not in good.info, good.info
    # the expected values are no longer in the sandbox: reading the program's source finds only inputs
    cheat = ("import re\nsrc = open('/sandbox/solution.py').read()\n"
             "def f(x):\n    return int((re.findall(r'== (\\d+)', src) or ['0'])[0])")
    assert code_reward(fenced(cheat), LITERAL_LOOP, partial_credit=True, **FAST).score == 0.0


# --- isolated tests ------------------------------------------------------------------------------------


def test_honest_solutions_pass_isolated_tests():
    result = code_reward(fenced("def square(n):\n    return n * n"), SQUARES, **FAST)
    assert (result.score, result.info["unsplit"]) == (1.0, 1), result.info
    wrong = code_reward(fenced("def square(n):\n    return n + n"), SQUARES, **FAST)
    assert wrong.score == 0.0 and "AssertionError" in wrong.info["detail"]


@pytest.mark.parametrize("cheat", [
    # the old pass token was a constant of the program's own code object
    "import sys\nfor c in sys._getframe(0).f_code.co_consts:\n    print(c, flush=True)\nimport os\nos._exit(0)",
    # the source the bootstrap read, from its frames (opening /sandbox/solution.py is refused)
    "import re, sys\nf = sys._getframe()\nwhile f:\n    for v in list(f.f_locals.values()):\n"
    "        for t in re.findall(r'[0-9a-f]{32}', v.decode() if isinstance(v, bytes) else str(v)):\n"
    "            print(t, flush=True)\n    f = f.f_back\nimport os\nos._exit(0)",
    "print('ok', flush=True)\nimport os\nos._exit(0)",
    "import sys\nprint('1')\nsys.exit(0)",
    "class A:\n    def __eq__(self, o):\n        return True\ndef square(n):\n    return A()",
    "import builtins\nbuiltins.AssertionError = type('Never', (BaseException,), {})\ndef square(n):\n    return 0",
    "import os, json\ndef square(n):\n    return 0\nfor fd in range(3, 10):\n    try:\n"
    "        os.write(fd, json.dumps({'passed': True}).encode())\n    except OSError:\n        pass",
], ids=["print-co-consts", "print-own-source", "exit-early", "sys-exit", "always-equal", "rebind-builtin",
        "forge-verdict-fd"])
def test_isolated_tests_cannot_be_gamed(cheat):
    result = code_reward(fenced(cheat), SQUARES, partial_credit=True, **FAST)
    assert result.score == 0.0 and result.info["statuses"] != ["pass"], result.info


SECRET = json.dumps({"asserts": ["def check(candidate):\n    for i in range(3):\n"
                                 "        assert candidate(i) == i * 7 + 48271\ncheck(f)"]})
"""An unsplittable test whose expected values are written only in its own text."""


@contained
def test_the_program_cannot_read_an_isolated_tests_text():
    """A program that hunts the test's text through every frame it can reach (the bootstrap's too) and, if
    it finds the constant, answers from it: the text never reaches the program's process, so it fails."""
    # The pattern is assembled at run time, so the program's own text does not hold it.
    hunter = r"""
import re, sys
mark = 'cand' + r'idate\(i\) == i \* 7 \+ ([0-9]+)'
key = None
def walk(v, depth=0):
    global key
    if depth > 5 or key:
        return
    if isinstance(v, dict):
        for x in list(v.values()):
            walk(x, depth + 1)
    elif isinstance(v, (list, tuple)):
        for x in v:
            walk(x, depth + 1)
    elif isinstance(v, (str, bytes)):
        m = re.search(mark, v.decode(errors='replace') if isinstance(v, bytes) else v)
        key = key or (m and int(m.group(1)))
frame = sys._getframe()
while frame:
    walk(frame.f_locals)
    walk(frame.f_globals)
    frame = frame.f_back
def f(i):
    return i * 7 + key if key else -1
"""
    # The same hunt through the process's own memory (/proc/self/mem) and the run's stdin file.
    memory = r"""
import re
mark = ('cand' + r'idate\(i\) == i \* 7 \+ ([0-9]+)').encode()
key = None
for path in ('/sandbox/stdin', '/dev/stdin'):
    try:
        m = re.search(mark, open(path, 'rb').read())
        key = key or (m and int(m.group(1)))
    except Exception:
        pass
try:
    mem = open('/proc/self/mem', 'rb', buffering=0)
    for line in open('/proc/self/maps'):
        span, perms = line.split()[:2]
        if 'r' not in perms:
            continue
        lo, hi = (int(x, 16) for x in span.split('-'))
        try:
            mem.seek(lo)
            m = re.search(mark, mem.read(hi - lo))
            key = key or (m and int(m.group(1)))
        except Exception:
            pass
except Exception:
    pass
def f(i):
    return i * 7 + key if key else -1
"""
    for cheat in (hunter, memory):
        result = code_reward(fenced(cheat), SECRET, **FAST)
        assert result.score == 0.0 and result.info["unsplit"] == 1, result.info
    honest = code_reward(fenced("def f(i):\n    return i * 7 + 48271"), SECRET, **FAST)
    assert honest.score == 1.0, honest.info


@contained
@pytest.mark.parametrize("test", [
    "for x, y in [(1, 2), (3, 4)]:\n    expected = y\n    assert f(x) == expected",
    "e = 2\nassert f(1) == e\ne = 4\nassert f(3) == e",
])
def test_a_constant_bound_twice_is_judged_against_each_value(test):
    """Each assert is judged against the constants' values where it stands, not their last ones: an honest
    program passes, one answering the last value fails."""
    assert [ast.unparse(c) for c in asserts.plan_test(test, "").checks] == ["__out_0 == 2", "__out_1 == 4"]
    gt = json.dumps({"asserts": [test]})
    assert code_reward(fenced("def f(x):\n    return x + 1"), gt, **FAST).score == 1.0
    assert code_reward(fenced("def f(x):\n    return 4"), gt, **FAST).score == 0.0


@contained
def test_stop_iteration_from_the_program_does_not_end_the_tests_loops():
    """A call that raises StopIteration would end the test's own map() early and pass all(...)."""
    gt = json.dumps({"asserts": ["assert all(map(lambda c: g(c) == c * c, [1, 2, 3]))"]})
    cheat = code_reward(fenced("def g(c):\n    raise StopIteration"), gt, **FAST)
    assert cheat.score == 0.0 and "RuntimeError" in cheat.info["detail"], cheat.info
    assert code_reward(fenced("def g(c):\n    return c * c"), gt, **FAST).score == 1.0


def test_isolated_tests_see_exceptions_generators_modules_and_values():
    test = (
        "def check(candidate):\n"
        "    try:\n        candidate(-1)\n    except ValueError:\n        pass\n    else:\n        assert False\n"
        "    assert [v for v in evens(5)] == [0, 2, 4]\n"
        "    assert m.sqrt(LIMIT) == 3.0\n"
        "    assert sorted(set(candidate(x) for x in range(3))) == [0, 1, 4]\n"
        "check(square)")
    gt = json.dumps({"asserts": [test]})
    code = ("import math as m\nLIMIT = 9\ndef square(n):\n    if n < 0:\n        raise ValueError(n)\n"
            "    return n * n\ndef evens(n):\n    yield from range(0, n, 2)")
    result = code_reward(fenced(code), gt, **FAST)
    assert result.score == 1.0 and result.info["unsplit"] == 1, result.info


def test_isolated_results_must_be_plain_data():
    gt = json.dumps({"asserts": ["for i in range(2):\n    assert box(i).v == i"]})
    result = code_reward(fenced("class B:\n    def __init__(s, v):\n        s.v = v\ndef box(v):\n    return B(v)"), gt,
                         **FAST)
    assert result.score == 0.0 and "cannot be compared outside the sandbox" in result.info["detail"], result.info


@contained
def test_the_verdict_channel_is_out_of_the_programs_reach_without_the_python_layer():
    """Without the audit hook, the program's process tries every way to the verdict: the inherited fd,
    the test process's /proc/<pid>/fd and its memory. The kernel refuses them all."""
    cheat = ("import os, json\nverdict = json.dumps({'passed': True}).encode()\n"
             "forged = len(verdict).to_bytes(8, 'little') + verdict\nreached = []\n"
             "for path in ['/proc/%d/fd/3' % os.getppid(), '/proc/%d/mem' % os.getppid()]:\n"
             "    try:\n        with open(path, 'wb') as f:\n            f.write(forged)\n"
             "        reached.append(path)\n    except OSError as e:\n        print('refused', path, e)\n"
             "try:\n    os.write(3, forged)\n    reached.append(3)\n"
             "except OSError as e:\n    print('refused fd 3', e)\n"
             "print('reached', reached)\ndef square(n):\n    return 0")
    source, test = asserts.isolated_program(json.loads(SQUARES)["asserts"][0], "", cheat)
    out = run_python(source, test, limits=SandboxLimits(wall_s=5, processes=1), channels=1, audit_hook=False,
                     isolate=True)
    assert "reached []" in out.stdout, (out.stdout, out.stderr)
    assert asserts.isolated_verdict(out.channels[0])[0] is False
    honest, test = asserts.isolated_program(json.loads(SQUARES)["asserts"][0], "", "def square(n):\n    return n * n")
    out = run_python(honest, test, limits=SandboxLimits(wall_s=5, processes=1), channels=1, isolate=True)
    assert asserts.isolated_verdict(out.channels[0]) == (True, ""), (out.stderr, out.channels)


def test_a_weak_sandbox_refuses_isolated_tests_with_the_reason():
    source, test = asserts.isolated_program("for i in range(2):\n    assert f(i) == i", "", "def f(x):\n    return x")
    out = run_weak(source, test, SandboxLimits(wall_s=5, processes=1), True, 1, isolate=True)
    assert out.status == "error" and "needs kernel containment" in out.stderr
    assert asserts.isolated_verdict(out.channels[0])[0] is False


def test_remote_runs_ask_the_server_for_an_isolated_run(monkeypatch):
    import io
    import urllib.request

    from gyre.rewards.sandbox import remote

    sent = {}

    def fake(request, timeout):
        sent.update(json.loads(request.data))
        reply = {"status": "ok", "returncode": 0, "stdout": "", "stderr": "", "seconds": 0.1, "channels": [""]}
        return io.BytesIO(json.dumps(reply).encode())

    monkeypatch.setattr(urllib.request, "urlopen", fake)
    out = remote.run_remote("http://box", "{}", channels=1, isolate=True)
    assert sent["isolate"] is True and asserts.isolated_verdict(out.channels[0])[0] is False
