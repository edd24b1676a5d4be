"""One multi-turn episode as a pure state machine: environment answers and sampled turns in, the next
request (or the finished trajectory) out. No IO: the rollout scheduler feeds it.

The trajectory is one sequence: the first observation (as the prompt), then for every turn the model's
tokens exactly as sampled (trainable segments, with their log-probs and weight versions) and the
environment's answer (a segment that is context only). Limits, each ending the episode as truncated:
``max_turns`` model turns; ``context_tokens`` for the whole sequence (a turn gets at most what is
left; an observation that does not fit ends the episode before it); an observation longer than
``observation_tokens`` is cut to that many tokens (``info["observations_cut"]`` counts them).

Step-level samples (``limits.window``): each turn is shown the first observation and only a window of
the turns before it (so ``context_tokens`` bounds one turn's view, not the episode). The trajectory still
records every token once; it trains one row per turn, with the context that turn was shown
(``Trajectory.rows``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from gyre.envs.context import ContextBuilder
from gyre.envs.protocol import EnvError, EnvReset, EnvStep, observation_text
from gyre.seeding import derive_seed
from gyre.types import (
    GenerationRequest,
    GenerationResult,
    PromptRecord,
    RewardResult,
    SamplingParams,
    Segment,
    Trajectory,
    TurnRecord,
    window_start,
)


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 8
    """Model turns per episode."""
    turn_tokens: int = 128
    """New tokens one turn may sample."""
    context_tokens: int = 1024
    """The whole sequence: first observation, every turn and every later observation."""
    observation_tokens: int = 256
    """Longest observation kept; longer ones are cut to their first tokens."""
    window: int | None = None
    """Step-level samples: a turn is shown the first observation and the ``window`` turns before it with
    their observations (``gyre.types.window_start``); ``context_tokens`` then bounds what one turn is
    shown. None: the whole conversation so far."""


@dataclass
class Episode:
    key: str
    """Unique in the run ("<group id>/<index>"); its turns' request ids are "<key>#<turn>"."""
    prompt: PromptRecord
    """The environment instance (uid, seed); replaced at reset by the first observation as a prompt."""
    index: int
    """Its place in the group (its sampling streams)."""
    seed: int
    """The group's sampling seed; each turn samples from its own stream of it."""
    limits: EpisodeLimits
    sampling: SamplingParams
    builder: ContextBuilder
    segments: list[Segment] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    context: list[int] = field(default_factory=list)
    """What the next turn is shown: the prompt and every token since (or its window's)."""
    shown_from: int = 0
    """Where ``context`` starts among the response tokens (past 0 only with a window)."""
    end: str = ""
    """How it ended: terminated, truncated (by the environment), turns, context; empty while running."""
    info: dict = field(default_factory=dict)
    _state: str = ""
    _success: bool | None = None
    _asked: tuple[tuple[str, ...], int | None, int] = ((), None, 1)
    """The next turn's own stop strings, token cap and samples (an agent's request: ``gyre.envs.agent``)."""
    _choices: list[GenerationResult] = field(default_factory=list)
    """A turn sampled ``n`` > 1 times, until the environment says which sample it went on with."""
    wasted: int = 0
    """Sampled tokens never recorded (the choices not taken), for the runner's waste counter."""

    def on_reset(self, reset: EnvReset) -> GenerationRequest:
        ids = self.builder.first(reset.observation)[:self.limits.context_tokens - 1]
        self.prompt = dataclasses.replace(self.prompt, prompt_text=observation_text(reset.observation), prompt_ids=ids)
        self.context, self._state = list(ids), _key(reset.observation)
        self._asked = _asked(reset.observation)
        return self.request()

    @property
    def samples(self) -> int:
        """Samples the next (or current) turn asks for: the environment picks one (``on_step``)."""
        return self._asked[2]

    @property
    def unrecorded(self) -> int:
        """Tokens of a sampled turn waiting for the environment's choice."""
        return sum(len(r.response_ids) for r in self._choices)

    def on_turns(self, results: list[GenerationResult]) -> str | list[str]:
        """The turn's samples came back (``samples`` of them, in sample order): one is recorded at once; of
        several, the environment gets every text and ``on_step`` records the one it chose."""
        if len(results) == 1:
            return self.on_turn(results[0])
        self._choices = list(results)
        return [r.response_text for r in results]

    def on_turn(self, result: GenerationResult) -> str:
        """The model's turn came back: record its tokens; returns the action for the environment."""
        start = self._response_len()
        version_runs = Trajectory(self.prompt, self.index)
        version_runs.extend(dataclasses.replace(result, offset=0))
        self.segments += version_runs.segments
        self.context += result.response_ids
        self.turns.append(TurnRecord(start, start + len(result.response_ids), 0.0, self._state))
        self.info["last_finish"] = result.finish_reason
        return result.response_text

    def on_step(self, step: EnvStep) -> GenerationRequest | None:
        """The environment answered the last turn: the next turn's request, or None when it has ended."""
        if self._choices:  # the sample the environment went on with is the turn; the others are waste
            choice = step.info.get("choice", 0)
            if not (type(choice) is int and 0 <= choice < len(self._choices)):
                raise EnvError(f"step() returned info['choice']={choice!r} for a turn of {len(self._choices)} "
                               f"samples: the index of the one the conversation went on with")
            chosen = self._choices.pop(choice)
            self.wasted += self.unrecorded
            self._choices = []
            self.on_turn(chosen)
        self.turns[-1].reward = step.reward
        if "success" in step.info:
            self._success = bool(step.info["success"])
        for k, v in step.info.items():  # an agent program's counters (gyre.envs.agent), summed into metrics
            if k.startswith("agent/") and isinstance(v, (int, float)):
                self.info[k] = self.info.get(k, 0) + v
        if step.done:
            self.end = "terminated" if step.terminated else "truncated"
            return None
        if len(self.turns) >= self.limits.max_turns:
            self.end = "turns"
            return None
        obs_ids = self.builder.observation(self.segments[-1].token_ids if self.segments else [], step.observation)
        if len(obs_ids) > self.limits.observation_tokens:
            obs_ids = obs_ids[:self.limits.observation_tokens]
            self.info["observations_cut"] = self.info.get("observations_cut", 0) + 1
        if len(self.context) + len(obs_ids) - self._leaving() >= self.limits.context_tokens:
            self.end = "context"
            return None
        self.segments.append(Segment(obs_ids, [0.0] * len(obs_ids), None, trainable=False))
        self.context += obs_ids
        self._slide()
        self._state = _key(step.observation)
        self._asked = _asked(step.observation)
        return self.request()

    def _slide(self) -> None:
        """Step-level samples: drop from the context the turns (and observations) that left the window."""
        if self.limits.window is None:
            return
        start = window_start(self.turns, len(self.turns), self.limits.window)
        prompt = len(self.prompt.prompt_ids)
        del self.context[prompt:prompt + start - self.shown_from]
        self.shown_from = start

    def trajectory(self) -> Trajectory:
        """The finished episode: its segments, and its return (the sum of turn rewards) as the reward."""
        score = sum(t.reward for t in self.turns)
        correct = self._success if self._success is not None else score > 0
        finish = "length" if self.end in ("turns", "context", "truncated") else self.info.get("last_finish", "eos")
        info = {"turns": len(self.turns), "end": self.end, **{k: v for k, v in self.info.items() if k != "last_finish"}}
        return Trajectory(self.prompt, self.index, list(self.segments), "", finish,
                          RewardResult(score, correct, info=info), "scored", turns=list(self.turns),
                          window=self.limits.window)

    def request(self) -> GenerationRequest:
        """The request for the next turn (again, after an engine lost it: the same stream). The context it
        carries must be the prompt and every recorded segment, token for token: what the model is shown
        is what will be trained on (checked every turn; a mismatch is a bug, not bad input)."""
        shown = [t for s in self.segments for t in s.token_ids][self.shown_from:]
        if self.context != self.prompt.prompt_ids + shown:
            raise RuntimeError(f"episode {self.key}: its context no longer equals its recorded tokens")
        turn = len(self.turns)
        room = self.limits.context_tokens - len(self.context)
        stop, most, samples = self._asked
        cap = min(self.limits.turn_tokens, room, most or room)
        params = dataclasses.replace(self.sampling, max_new_tokens=max(1, cap),
                                     stop=tuple(dict.fromkeys((*self.sampling.stop, *stop))))
        return GenerationRequest(f"{self.key}#{turn}", list(self.context), params, n=samples,
                                 seed=derive_seed(self.seed, "turn", self.index, turn))

    def _leaving(self) -> int:
        """Tokens the window drops before the next turn (0 without a window)."""
        if self.limits.window is None:
            return 0
        return window_start(self.turns, len(self.turns), self.limits.window) - self.shown_from

    def _response_len(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)


def _asked(observation: str | dict) -> tuple[tuple[str, ...], int | None, int]:
    """What a structured observation asks of the next turn's sampling: its stop strings, token cap, samples."""
    sampling = observation.get("sampling") or {} if isinstance(observation, dict) else {}
    return tuple(sampling.get("stop") or ()), sampling.get("max_tokens"), sampling.get("n") or 1


def _key(observation: str | dict) -> str:
    """A short, stable key of an observation (GiGPO groups turns that acted on the same state)."""
    text = observation if isinstance(observation, str) else \
        json.dumps(observation["messages"], sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
