"""Which function scores each reward type, and which checks its ground truths when the data loads.

Reward types that run as functions (in the reward workers' child processes) map to "module:function"
specs; "judge" with a local model and "reward_model" run as model roles instead (see
``gyre.cluster.workers``). Ground-truth checkers let a dataset with an unreadable answer fail at load
time, naming the file and line, instead of scoring 0 for the whole run.
"""

from __future__ import annotations

from collections.abc import Sequence

from gyre.config.reward_schema import DomainConfig, SandboxConfig
from gyre.rewards.base import load_function
from gyre.types import PromptRecord

BUILTIN = {
    "math": "gyre.rewards.math:math_reward",
    "code": "gyre.rewards.code:code_reward",
    "ifeval": "gyre.rewards.ifeval:ifeval_reward",
    "choice": "gyre.rewards.choice:choice_reward",
}
CHECKERS = {
    "code": "gyre.rewards.code:check_ground_truth",
    "ifeval": "gyre.rewards.ifeval:check_ground_truth",
    "choice": "gyre.rewards.choice:check_ground_truth",
}
JUDGE_FUNCTION = "gyre.rewards.judge:openai_judge_reward"


def function_spec(domain: DomainConfig) -> tuple[str, dict]:
    """The "module:function" spec and keyword arguments a reward worker of ``domain`` runs, shaping
    terms included (composed in ``gyre.rewards.compose``)."""
    if domain.type == "function":
        spec, kwargs = domain.function, dict(domain.kwargs)
    elif domain.type == "judge":
        spec, kwargs = JUDGE_FUNCTION, {**domain.judge.model_dump(exclude={"backend", "model_path", "devices",
                                                                             "max_batch_size"}), **domain.kwargs}
    else:
        spec, kwargs = BUILTIN[domain.type], dict(domain.kwargs)
    if domain.type == "code":
        kwargs["sandbox"] = (domain.sandbox or SandboxConfig()).model_dump()
    if not domain.shaping:
        return spec, kwargs
    terms = [{"function": t.function, "kwargs": dict(t.kwargs), "weight": t.weight} for t in domain.shaping]
    return "gyre.rewards.compose:shaped_reward", {"base": spec, "base_kwargs": kwargs, "terms": terms}


def check_functions(domain: DomainConfig) -> None:
    """Import every function the domain names, so a typo fails before Ray starts."""
    if domain.model_role is None:
        spec, kwargs = function_spec(domain)
        load_function(spec)
        for name in [kwargs.get("base")] + [t.function for t in domain.shaping]:
            if name:
                load_function(name)


def bad_ground_truths(domain: DomainConfig, records: Sequence[PromptRecord]) -> list[tuple[PromptRecord, str]]:
    """(record, why) for each ground truth the domain's reward cannot use."""
    if domain.type == "math":
        from gyre.rewards.math import unparseable_ground_truths

        return [(r, "not a math answer math-verify can read") for r in unparseable_ground_truths(records)]
    checker = CHECKERS.get(domain.type)
    if checker is None:
        return []
    check = load_function(checker)
    bad = []
    for record in records:
        try:
            check(record.ground_truth)
        except ValueError as exc:
            bad.append((record, str(exc)))
    return bad
