"""Reward functions checked on real rows before a run, and a run stopped when too many rewards fail.

A reward that returns a string or NaN, or raises, scores 0 with status "error" and the run goes on:
one bad sample must not stop training. A reward that fails on most samples, though, trains on zeros
for nothing. So before Ray starts each domain's function is called on a few real rows (in a child
process, with the domain's timeout), and during the run a step stops with the first error when more
than ``max_error_frac`` of a domain's rewards failed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from gyre.config.reward_schema import DomainConfig
from gyre.config.schema import RLVRConfig
from gyre.rewards.base import RewardRequest, RewardSpecError
from gyre.types import PromptRecord, RewardResult, Trajectory

PROBE_ROWS = 2
"""Rows per domain the pre-flight probe scores, each with its ground truth and an empty response."""


class RewardCheckError(RewardSpecError):
    """A reward function fails on real rows before the run starts."""


class RewardFailureError(RuntimeError):
    """More than ``max_error_frac`` of a domain's rewards failed in one step."""


def domain_key(cfg_reward, name: str) -> str:
    """How the config names a domain: ``reward`` in the single-domain short form."""
    return "reward" if cfg_reward.single else f"reward.domains.{name}"


def timeout_key(cfg_reward, name: str) -> str:
    """The key that sets a domain's time limit: code domains derive it from kwargs.timeout_s per test."""
    key = domain_key(cfg_reward, name)
    return f"{key}.kwargs.timeout_s" if cfg_reward.domains[name].type == "code" else f"{key}.timeout_s"


class RewardProbe:
    """Score a few real rows of each domain (response = the ground truth, and an empty response) the
    way the run will, in a child process per domain, and raise RewardCheckError on the first result
    that is not a valid reward. The children start on entry, so they import while the data loads::

        with RewardProbe(cfg, echo) as probe:
            data = load_data(cfg)
            probe.check(data.train)
    """

    def __init__(self, cfg: RLVRConfig, echo: Callable[[str], None] = print):
        self.cfg, self.echo = cfg, echo
        self.runners: dict = {}

    def __enter__(self) -> RewardProbe:
        from gyre.rewards.registry import function_spec
        from gyre.rewards.runner import RewardRunner

        if self.cfg.env is not None:  # the environments pay the rewards: nothing to probe
            return self
        try:
            for name, domain in self.cfg.reward.domains.items():
                skip = _skip_reason(domain)
                if skip:
                    self.echo(f"reward {name}: not probed before the run ({skip})")
                    continue
                spec, kwargs = function_spec(domain)
                self.runners[name] = RewardRunner(spec, kwargs, domain.sample_timeout_s, processes=1)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, exc_type=None, *exc) -> None:
        runners, self.runners = list(self.runners.values()), {}
        if exc_type is None:
            for runner in runners:
                runner.close()
            return
        # Leaving with an error (bad data, say): do not wait for children still importing to stop.
        threading.Thread(target=lambda: [r.close() for r in runners], daemon=True).start()

    def check(self, train: Sequence[PromptRecord]) -> None:
        cfg = self.cfg
        for name, runner in self.runners.items():
            truth_scores = []
            for row in [r for r in train if r.domain == name][:PROBE_ROWS]:
                for response in (row.ground_truth, ""):
                    request = RewardRequest(response, row.ground_truth, row.question or row.prompt_text, row.tag,
                                            columns=row.columns, messages=row.messages)
                    result = _score_one(cfg, name, runner, request)
                    _check_probe(cfg, name, row, request, result)
                    truth_scores += [result.score] if response else []
            self.echo(f"reward {name}: its function returned valid rewards on real rows")
            # Only where an answer equal to the ground truth is a right answer (not code tests, constraints).
            if cfg.reward.domains[name].type in ("math", "choice", "function") and max(truth_scores, default=1) <= 0:
                self.echo(f"note: {domain_key(cfg.reward, name)} scores a response equal to the ground truth 0; "
                          "check that this is intended")


def _score_one(cfg: RLVRConfig, name: str, runner, request: RewardRequest) -> RewardResult:
    try:
        return runner.score([request])[0]
    except RuntimeError as exc:  # its processes die before they are ready (their stderr says why)
        raise RewardCheckError(f"{domain_key(cfg.reward, name)}: {exc}; a script that calls gyre must guard its "
                               "entry point with `if __name__ == '__main__':` (reward processes are spawned)") from None


def _skip_reason(domain: DomainConfig) -> str | None:
    if domain.model_role is not None:
        return f"scored by the {domain.model_role} role, which loads when the run starts"
    if domain.type == "judge":
        return "an OpenAI-compatible endpoint, called only during the run"
    return None


def _check_probe(cfg: RLVRConfig, name: str, row: PromptRecord, request: RewardRequest, result: RewardResult) -> None:
    if result.status == "ok":
        return
    key = domain_key(cfg.reward, name)
    what = "an empty response" if not request.response else f"response = its ground truth {request.response[:60]!r}"
    fix = (f"make it faster or raise {timeout_key(cfg.reward, name)}" if result.status == "timeout" else
           "it must return a finite number, a bool or a RewardResult")
    raise RewardCheckError(
        f"{key} ({cfg.reward.domains[name].function or cfg.reward.domains[name].type}) fails on real data: on "
        f"{row.uid} with {what} it gave {result.status}: {result.error}. Fix the reward function or its "
        f"{key}.kwargs ({fix}).")


def check_reward_failures(samples: Sequence[Trajectory], cfg_reward) -> None:
    """Stop the run when more than a domain's ``max_error_frac`` of this step's rewards failed (errors
    and timeouts), with the first failure's message."""
    for name, domain in cfg_reward.domains.items():
        mine = [s for s in samples if s.prompt.domain == name]
        failed = [s for s in mine if s.reward.status != "ok"]
        if not mine or len(failed) <= domain.max_error_frac * len(mine):
            continue
        key = domain_key(cfg_reward, name)
        first = failed[0]
        raise RewardFailureError(
            f"{len(failed)} of {len(mine)} rewards of {key} failed in one step, more than {key}.max_error_frac="
            f"{domain.max_error_frac:g}; the first, on {first.prompt.uid}: {first.reward.status}: "
            f"{first.reward.error}. Fix the reward function (gyre check calls it on real rows), raise "
            f"{timeout_key(cfg_reward, name)} if these are timeouts, or raise {key}.max_error_frac to train through "
            "them.")
