"""Code rewards: run the program in a response against a problem's tests, in the sandbox.

Ground truth is a JSON string in one of two forms (the two common shapes of code RL data sets):

- stdin/stdout tests (APPS, TACO, CodeContests, LiveCodeBench): ``{"inputs": [...], "outputs": [...]}``.
  Each input is fed to the program as stdin; its stdout must equal the output once trailing whitespace
  is stripped from every line and trailing blank lines are dropped.
- assert tests (MBPP, HumanEval, KodCode): ``{"asserts": ["assert f(1) == 2", ...], "setup": "..."}``.
  Each test (one or more ``assert`` statements, or HumanEval's ``def check(candidate): ...`` followed
  by ``check(f)``) runs in its own process after ``setup`` (imports, helpers) and the response's code,
  so one failing or crashing test does not hide the others (needed for ``partial_credit``) and tests
  cannot leak state into each other. ``__name__`` is not ``"__main__"`` while the response's code runs,
  so a demo ``if __name__ == "__main__":`` block that reads stdin does not turn a correct function
  into a failure.

Assert tests are compared outside the sandbox (``gyre.rewards.asserts``): the sandbox returns the values of
the program's calls as plain data, and the comparison runs in this process, so an object whose
``__eq__`` always holds, a rebound builtin, or a program that reads the expected values from its own
source gains nothing: the expected values never enter the sandbox. Loops over literal cases are
unrolled and split too. A test that still cannot be split (a comparison inside a comprehension, a loop
over ``range``, arbitrary statements) runs isolated: the program runs in one sandboxed process, the test
in another that the program's code never runs in, calling the program's functions through proxies that
carry plain data both ways; only the test's process holds the channel its verdict goes out on, so
nothing the program prints, exits with or forges passes the test. Such tests are counted in
``info["unsplit"]``. The test's text is dropped from the program's process before its first line, so
its expected values stay with the test (only the Python layer keeps the program from the payload file
on disk); a weak sandbox fails such tests (see ``sandbox.boot.isolated``). Stdin/stdout tests have none of these
gaps: the expected output never enters the sandbox.

Each sample's deadline in the reward worker (``code_reward.deadline_s``) is derived from the sandbox's
own limits: tests x (per-test timeout + start-up margin) + a margin, so the sandbox's clock always fires
first and cleans up after itself.

``AdaptiveTimeout`` is RollPacker's adaptive sandbox timeout ("RollPacker: Mitigating Long-Tail Rollouts
for Fast, Synchronous RL Post-Training", arXiv 2509.21009, NSDI '26; its reward scheduler, sec. 3.2 of
the project's systems reference). A test case's timeout is ``min(max(T_min, lam * T_anchor), T_max)``,
with T_anchor the longest run time among correct responses to that case, and T_max until a correct
response has been seen. Wrong programs that loop forever then cost ~lam times a correct run instead
of T_max (RollPacker reports rewards 1.6x faster). It is sans-IO: the caller observes results and
passes the state (``to_dict()``) to ``code_reward``. Run times include the interpreter's start-up
(~20-50 ms), like the timeouts they are compared with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import textwrap
from dataclasses import dataclass

from gyre.rewards import asserts
from gyre.rewards.code_tests import canonical_tests
from gyre.rewards.sandbox import RunOutcome, SandboxLimits, run_python
from gyre.types import RewardResult

DEFAULT_TIMEOUT_S = 10.0
_RUN_MARGIN_S = 2.0
"""Per test run on top of its timeout: interpreter start-up, namespace set-up, draining output."""
_SAMPLE_MARGIN_S = 5.0
"""Per sample on top of its test runs: parsing, the reward process's own overhead."""
_PYTHON_FENCES = ("", "python", "py", "python3", "py3")


def extract_code(response: str) -> str:
    """The last fenced ``python`` (or ``py``, or bare) code block of ``response``, else all of it.

    A block left open at the end (the response hit its token limit) counts as a block: the text after
    the fence is the program, and the fence line itself would only be a syntax error.
    """
    blocks: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    lang = ""
    for line in response.splitlines():
        stripped = line.strip()
        if current is None:
            if stripped.startswith("```"):
                info = stripped[3:].strip().lower().split()
                lang, current = (info[0] if info else ""), []
        elif stripped.startswith("```"):
            blocks.append((lang, current))
            current = None
        else:
            current.append(line)
    if current is not None:
        blocks.append((lang, current))
    python = [body for lang, body in blocks if lang in _PYTHON_FENCES]
    if not python:
        return response
    return textwrap.dedent("\n".join(python[-1]))  # a fence indented inside a list indents its code too


@dataclass
class _Tests:
    inputs: list[str]
    outputs: list[str]
    asserts: list[str]
    setup: str = ""

    def __len__(self) -> int:
        return len(self.asserts) if self.asserts else len(self.inputs)


def _str_list(data: dict, key: str) -> list[str]:
    value = data.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"code ground truth: {key!r} must be a non-empty list of strings")
    return value


def _parse(ground_truth: str | dict) -> _Tests:
    if isinstance(ground_truth, dict):
        data = ground_truth
    else:
        try:
            data = json.loads(ground_truth)
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"code ground truth is not valid JSON ({exc}): {str(ground_truth)[:200]!r}") from None
    data = canonical_tests(data)  # MBPP's assert list, APPS' input_output, HumanEval's test + entry point
    if not isinstance(data, dict) or ("asserts" in data) == ("inputs" in data or "outputs" in data):
        raise ValueError('code ground truth must be a JSON object with either "inputs" and "outputs" '
                         f'or "asserts" (and optional "setup"), or a layout of docs/guides/rewards.md#code-tests: '
                         f'{str(ground_truth)[:200]!r}')
    if "asserts" in data:
        setup = data.get("setup") or ""
        if not isinstance(setup, str):
            raise ValueError('code ground truth: "setup" must be a string')
        tests = _Tests([], [], _str_list(data, "asserts"), setup)
        for i, source in enumerate([setup, *tests.asserts]):
            try:
                compile(source, "<test>", "exec")
            except SyntaxError as exc:
                what = "setup" if i == 0 else f"asserts[{i - 1}]"
                raise ValueError(f"code ground truth: {what} is not valid Python: {exc}") from None
        return tests
    inputs, outputs = _str_list(data, "inputs"), _str_list(data, "outputs")
    if len(inputs) != len(outputs):
        raise ValueError(f"code ground truth: {len(inputs)} inputs but {len(outputs)} outputs")
    return _Tests(inputs, outputs, [])


def check_ground_truth(gt: str) -> None:
    """Raise ValueError when ``gt`` is not a usable code ground truth (call when a data set loads: a
    malformed row would otherwise score 0 on every sample for the whole run)."""
    _parse(gt)


def _normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


@dataclass(frozen=True)
class _Runner:
    """How one sample's programs run: limits and the sandbox options of the domain."""

    limits: SandboxLimits
    allow_weak: bool = False
    url: str | None = None
    token: str | None = None

    def run(self, source: str, stdin: str = "", channels: int = 0, isolate: bool = False) -> RunOutcome:
        # an isolated test runs in two processes: the program's and the test's
        limits = dataclasses.replace(self.limits, processes=self.limits.processes + 1) if isolate else self.limits
        if self.url:
            from gyre.rewards.sandbox.remote import run_remote

            return run_remote(self.url, source, stdin, limits, channels=channels, token=self.token, isolate=isolate)
        return run_python(source, stdin, limits, channels=channels, allow_weak=self.allow_weak, isolate=isolate)


def _run_case(tests: _Tests, i: int, code: str, runner: _Runner) -> tuple[bool, RunOutcome, bool]:
    """(passed, outcome, split): split is False for an assert test run isolated (``_run_isolated``)."""
    if not tests.asserts:
        outcome = runner.run(code, tests.inputs[i])
        return outcome.status == "ok" and _normalize(outcome.stdout) == _normalize(tests.outputs[i]), outcome, True
    try:
        plan = asserts.plan_test(tests.asserts[i], tests.setup)
    except asserts.Unsplittable:
        return (*_run_isolated(tests.asserts[i], tests.setup, code, runner), False)
    outcome = runner.run(asserts.test_program(plan, tests.setup, code), channels=2)
    if outcome.status != "ok":
        return False, outcome, True
    values = asserts.leaf_values(plan, outcome.channels)
    if plan.helpers:
        values.update(_run_helpers(plan, tests.setup, values, runner))
    passed, why = asserts.judge(plan, values)
    if not passed:
        outcome.stderr = (outcome.stderr + "\n" + why).strip()
    return passed, outcome, True


def _run_isolated(test: str, setup: str, code: str, runner: _Runner) -> tuple[bool, RunOutcome]:
    """A test the parent cannot split: its verdict comes from a sandboxed process the program never runs in
    (``boot.isolated``), on a channel only that process holds; nothing the program prints or does passes it."""
    payload, test_text = asserts.isolated_program(test, setup, code)
    outcome = runner.run(payload, test_text, channels=1, isolate=True)  # the test's text comes as stdin
    if outcome.status != "ok":
        return False, outcome
    passed, why = asserts.isolated_verdict(outcome.channels[0])
    if not passed:
        outcome.stderr = (outcome.stderr + "\n" + why).strip()
    return passed, outcome


def _run_helpers(plan, setup: str, values: dict, runner: _Runner) -> dict:
    """Setup helpers applied to the program's values, in a run that holds the setup but not the program."""
    arguments = asserts.helper_arguments(plan, values)
    out = {f"__help_{i}": a for i, a in enumerate(arguments) if isinstance(a, asserts.LeafError)}
    ready = [i for i, a in enumerate(arguments) if not isinstance(a, asserts.LeafError)]
    if ready:
        run = runner.run(asserts.helper_program(plan, setup, ready, [arguments[i] for i in ready]), channels=1)
        results = (asserts.decode_channel(run.channels[0], len(ready)) if run.status == "ok"
                   else [asserts.LeafError(f"the setup helper run ended with {run.status}: {run.stderr[-200:]}")]
                   * len(ready))
        out.update({f"__help_{i}": r for i, r in zip(ready, results)})
    return out


def _timeout_for(timeout_s: float | None, adaptive: dict | None, key: str) -> float:
    if adaptive is not None:
        t = AdaptiveTimeout.from_dict(adaptive).timeout_for(key)
        t = t if timeout_s is None else min(t, timeout_s)
    else:
        t = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if not t > 0:
        raise ValueError(f"code reward timeout must be positive, got {t}")
    return float(t)


def case_key_of(ground_truth: str) -> str:
    """The default test-case key for adaptive timeouts: a hash of the ground truth."""
    return hashlib.sha1(str(ground_truth).encode()).hexdigest()[:16]


def code_reward(response: str, ground_truth: str, *, timeout_s: float | None = None, memory_mb: int = 512,
                partial_credit: bool = False, case_key: str | None = None, adaptive: dict | None = None,
                sandbox: dict | None = None) -> RewardResult:
    """Score the program in ``response`` (see ``extract_code``) on the tests in ``ground_truth``: ``score_code``
    on it, with the same options."""
    return score_code(extract_code(response), ground_truth, timeout_s=timeout_s, memory_mb=memory_mb,
                      partial_credit=partial_credit, case_key=case_key, adaptive=adaptive, sandbox=sandbox)


def score_code(code: str, ground_truth: str, *, timeout_s: float | None = None, memory_mb: int = 512,
               partial_credit: bool = False, case_key: str | None = None, adaptive: dict | None = None,
               sandbox: dict | None = None) -> RewardResult:
    """Score the program ``code`` (Python source, as it is) on the tests in ``ground_truth``.

    Each test runs in its own sandboxed process with a wall-clock limit of ``timeout_s`` seconds
    (default 10). With ``adaptive`` (an ``AdaptiveTimeout.to_dict()``), the limit is that state's
    ``timeout_for(case_key)`` instead, capped by ``timeout_s`` when both are given; ``case_key``
    defaults to a hash of the ground truth. ``sandbox``: the domain's sandbox options (``allow_weak``,
    ``url`` of a remote sandbox, ``disk_mb``). Score: 1.0 when every test passes, else 0.0, or with
    ``partial_credit`` the fraction passed. Without partial credit the tests stop at the first failure.
    ``info``: passed, total, runtimes (seconds per test run), statuses ("pass", "wrong" or the sandbox
    status), timeout_s, case_key, unsplit (assert tests run isolated: not split) and, on a failure,
    the tail of its stderr.
    """
    tests = _parse(ground_truth)
    key = case_key or case_key_of(ground_truth)
    timeout = _timeout_for(timeout_s, adaptive, key)
    try:
        code.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no file or process can hold the program
        info = {"passed": 0, "total": len(tests), "runtimes": [], "statuses": [], "timeout_s": timeout,
                "case_key": key, "detail": f"the program is not valid Unicode text ({exc.reason} at character "
                                          f"{exc.start}): it cannot be run, so it passes no test"}
        return RewardResult(score=0.0, correct=False, info=info)
    options = dict(sandbox or {})
    runtimes: list[float] = []
    statuses: list[str] = []
    detail, unsplit = "", 0
    for i in range(len(tests) if code.strip() else 0):  # no code at all fails every test without a run
        expected = len(tests.outputs[i]) if tests.outputs else 0
        # processes=1: one extra thread, for the common `threading.stack_size(...)` deep-recursion trick
        # (process creation is still refused by the Python layer); the wall clock is the binding limit.
        limits = SandboxLimits(cpu_s=timeout + 1.0, wall_s=timeout, memory_mb=memory_mb, processes=1,
                               output_bytes=max(1_000_000, 4 * expected + 4096), disk_mb=options.get("disk_mb", 64))
        token = os.environ.get(options["token_env"]) if options.get("token_env") else None
        runner = _Runner(limits, bool(options.get("allow_weak")), options.get("url"), token)
        passed, outcome, split = _run_case(tests, i, code, runner)
        unsplit += not split
        runtimes.append(round(outcome.seconds, 4))
        statuses.append("pass" if passed else "wrong" if outcome.status == "ok" else outcome.status)
        if not passed:
            detail = detail or outcome.stderr[-300:]
            if not partial_credit:
                break
    n_pass, total = statuses.count("pass"), len(tests)
    info = {"passed": n_pass, "total": total, "runtimes": runtimes, "statuses": statuses, "timeout_s": timeout,
            "case_key": key}
    if unsplit:
        info["unsplit"] = unsplit
    if detail:
        info["detail"] = detail
    score = n_pass / total if partial_credit else float(n_pass == total)
    return RewardResult(score=score, correct=n_pass == total, info=info)


def code_deadline_s(ground_truth: str, *, timeout_s: float | None = None, adaptive: dict | None = None,
                    case_key: str | None = None, **_) -> float | None:
    """How long the reward worker may wait for one sample: every test at its sandbox timeout plus
    margins, so the sandbox's own clock fires first (it kills and cleans up; the worker's deadline
    kills the reward process instead). None for a ground truth that does not parse (it fails fast)."""
    try:
        tests = _parse(ground_truth)
    except ValueError:
        return None
    per_test = _timeout_for(timeout_s, adaptive, case_key or case_key_of(ground_truth))
    return len(tests) * (per_test + _RUN_MARGIN_S) + _SAMPLE_MARGIN_S


code_reward.deadline_s = code_deadline_s  # the reward runner's per-sample deadline protocol


class AdaptiveTimeout:
    """RollPacker's per-test-case sandbox timeout, as a pure state machine (it starts no process).

    ``timeout_for(key)`` is ``t_max`` until ``observe`` has seen a correct result for ``key``; then
    ``min(max(t_min, lam * anchor), t_max)``, where anchor is the longest run time among the correct
    results seen for the key. A correct result's run time is the slowest of its per-test runs
    (``info["runtimes"]``), since the timeout applies to each test run. Anchors only grow: a case's
    timeout never drops below what an earlier correct program needed.
    """

    def __init__(self, t_min: float = 2.0, t_max: float = 30.0, lam: float = 1.5):
        if not 0 < t_min <= t_max or lam <= 0:
            raise ValueError(f"AdaptiveTimeout needs 0 < t_min <= t_max and lam > 0, got {t_min}, {t_max}, {lam}")
        self.t_min, self.t_max, self.lam = float(t_min), float(t_max), float(lam)
        self.anchors: dict[str, float] = {}

    def timeout_for(self, key: str) -> float:
        anchor = self.anchors.get(key)
        if anchor is None:
            return self.t_max
        return min(max(self.t_min, self.lam * anchor), self.t_max)

    def observe(self, key: str, result: RewardResult) -> None:
        """Update from one scored sample of case ``key``; only fully correct results move the anchor."""
        runtimes = result.info.get("runtimes") or []
        if result.correct and result.status == "ok" and runtimes:
            self.anchors[key] = max(self.anchors.get(key, 0.0), max(runtimes))

    def to_dict(self) -> dict:
        return {"t_min": self.t_min, "t_max": self.t_max, "lam": self.lam, "anchors": dict(self.anchors)}

    @classmethod
    def from_dict(cls, state: dict) -> AdaptiveTimeout:
        out = cls(state.get("t_min", 2.0), state.get("t_max", 30.0), state.get("lam", 1.5))
        out.anchors = {str(k): float(v) for k, v in state.get("anchors", {}).items()}
        return out
