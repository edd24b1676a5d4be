"""The ``env`` section: what a multi-turn (agentic) run plays, how its environments are hosted, and the
limits of an episode."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gyre.config.base import NonNegInt, PositiveFloat, PositiveInt, StrictModel


class WorkspaceConfig(StrictModel):
    """Each episode's sandboxed workspace (``gyre.envs.workspace``): files its tools act on and its verifier
    inspects, every command run in the code sandbox, removed when the episode ends."""

    disk_mb: PositiveInt = 64
    """The workspace's files together, and what one command may leave in it."""
    max_files: PositiveInt = 2000
    """Files the workspace may hold."""
    cpu_s: PositiveFloat = 10.0
    """CPU seconds of one command."""
    wall_s: PositiveFloat = 20.0
    """Wall-clock seconds of one command before it is killed."""
    memory_mb: PositiveInt = 512
    """Address space of each process of a command (a shell command's processes have that much each)."""
    max_commands: PositiveInt = 64
    """Commands an episode may run (its tools' and its verifier's together); more are refused."""
    max_processes: PositiveInt = 16
    """Processes a shell command may run at once (``run_shell``)."""
    output_chars: PositiveInt = 8000
    """Characters of a command's output given back."""


class AgentConfig(StrictModel):
    """An agent program trained through an OpenAI-compatible endpoint (``env.id: gyre:agent``): each episode
    runs it on a task with a base URL and API key; its requests are the observations, the model's turns
    the answers, its outcome the reward. Exactly one of entry and command."""

    entry: str | None = None
    """module:function or file.py:function: ``agent(task, base_url=..., api_key=...[, workspace=...])``, run in
    a thread of the environment's process; returns the outcome (a reward, or what the verifier reads)."""
    command: list[str] | None = None
    """A command run per episode (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``GYRE_TASK`` (JSON) and
    ``GYRE_WORKSPACE`` set; in the workspace when there is one); its last line of output, JSON, is the outcome."""
    tasks: str
    """A JSONL file of tasks (episode seed s plays line s mod n) or module:function (seed -> task dict)."""
    verifier: str | None = None
    """module:function ``verifier(task, outcome, workspace) -> reward | (reward, success) | {"reward",
    "success"}``. None: the agent's outcome is the reward."""
    tool_format: Literal["auto", "hermes", "mistral", "json", "none"] = "auto"
    """How tool calls are read from a model turn (gyre.envs.chat_api.TOOL_FORMATS): hermes <tool_call>{...}
    </tool_call>, mistral [TOOL_CALLS] [...], json (the whole turn is a call), auto (the first that finds one)."""
    turn_timeout_s: PositiveFloat = 20.0
    """How long the agent may take between model calls (its tools included) before its episode fails."""
    error_reward: float = 0.0
    """The reward of an episode whose agent raised or exited non-zero (counted in agent/errors)."""
    workspace: WorkspaceConfig | None = None
    """A sandboxed workspace per episode (files from the task's "files": {path: text}); None: none."""

    @model_validator(mode="after")
    def _one_program(self) -> AgentConfig:
        if (self.entry is None) == (self.command is None):
            raise ValueError("env.agent needs exactly one of entry (a Python callable) and command (a program)")
        return self


class EnvConfig(StrictModel):
    """An agentic run: the model acts in an environment for several turns; the episode's return (the sum
    of the environment's rewards) is its reward. Replaces ``data`` (the training "prompts" are
    environment seeds) and ``reward``."""

    id: str
    """gyre:<name> (built-in: guess_number, frozen_lake, sokoban, python_math), gem:<id> (a gem-llm
    environment, e.g. gem:game:GuessTheNumber-v0-easy; needs the gem extra), package.module:Class or
    path/to/file.py:Class (any class, or factory, whose objects have reset(seed) and step(action))."""
    kwargs: dict = {}
    """Keyword arguments the environment is built with."""
    agent: AgentConfig | None = None
    """With id gyre:agent: the agent program trained through the endpoint, its tasks and verifier."""
    tools: list[Literal["python"]] = []
    """Tools the model may call mid-episode (python: run code in the reward sandbox); their output is an
    observation, never trained on."""
    tool_format: Literal["tags", "json"] = "tags"
    """How the model calls a tool: <python>code</python>, or <tool_call>{"name": ..., "arguments": ...}</tool_call>."""
    max_tool_calls: PositiveInt = 4
    """Tool calls per episode."""
    workers: PositiveInt = 1
    """Environment worker actors (CPU-only; placed anywhere in the cluster)."""
    slots_per_worker: Annotated[int, Field(ge=1, le=64)] = 16
    """Environments each worker hosts, one process each: episodes running at once = workers x slots."""
    worker_cpus: Annotated[float, Field(gt=0)] = 0.25
    """CPUs Ray reserves for each environment worker."""
    reset_timeout_s: PositiveFloat = 60.0
    """A reset that takes longer fails its episode (the environment's process is killed)."""
    step_timeout_s: PositiveFloat = 30.0
    """A step that takes longer fails its episode (the environment's process is killed)."""
    max_failures: NonNegInt = 3
    """Episodes of one group its environments may fail (each replaced on the same seed) before the group
    is given up and another admitted."""
    max_turns: PositiveInt = 8
    """Model turns per episode; an episode still running then is truncated."""
    turn_tokens: PositiveInt = 64
    """New tokens one turn may sample."""
    context_tokens: PositiveInt = 1024
    """What one turn is shown plus what it samples: the whole conversation so far (or, with step-level
    samples, the first observation and the history window); a turn gets what is left, and an observation
    that does not fit truncates the episode."""
    samples: Literal["trajectory", "step"] = "trajectory"
    """trajectory: each turn is shown the whole conversation so far and the episode trains as one sequence;
    step: each turn is shown the first observation and the last env.history_turns turns, and trains as a
    sample of its own with that context (long episodes in a bounded context; ROLL's step-level manager)."""
    history_turns: NonNegInt = 2
    """Step-level samples: earlier turns (each with the observation that followed it) a turn is shown;
    0 shows only the latest observation (for environments whose observation is their whole state)."""
    observation_tokens: PositiveInt = 256
    """Longest observation kept (the rest is cut)."""
    max_observation_chars: PositiveInt = 20_000
    """Longest observation text taken from an environment (cut in its own process)."""
    system_prompt: str | None = None
    """A system message before the first observation (with a chat template), or a first line (without)."""
    extra_samples: NonNegInt = 0
    """Episodes run per group beyond rollout.samples_per_prompt; the first to finish are kept and the rest
    stopped (trajectory-level redundancy against slow environments)."""
    stale_episodes: Literal["abort", "restart"] = "abort"
    """Asynchronous runs (rollout.async_ratio > 0): what happens to a group when an episode of it falls out
    of the staleness window (checked whenever the weights change, so at every turn): abort the group
    (another is admitted), or restart just the episodes that started too long ago, from reset on the same
    seed under the current weights."""
    turn_sync: bool = False
    """Turn-synchronised batching: every episode's next turn waits for every environment, and every
    environment for every turn (the classic loop; slower when environments vary: for comparison).
    Default: each episode goes on as soon as its own environment answers."""
    val_episodes: PositiveInt = 32
    """Validation environment seeds (fixed for the run); each is played validation.samples_per_prompt times."""

    @model_validator(mode="after")
    def _limits(self) -> EnvConfig:
        if self.turn_tokens >= self.context_tokens:
            raise ValueError(f"env.turn_tokens ({self.turn_tokens}) must be below env.context_tokens "
                             f"({self.context_tokens}): the first observation needs room too")
        if (self.id == "gyre:agent") != (self.agent is not None):
            raise ValueError("env.id gyre:agent and env.agent go together: an agent program needs its section "
                             "(entry or command, tasks), and env.agent needs env.id: gyre:agent")
        if self.agent is not None and self.agent.turn_timeout_s >= min(self.step_timeout_s, self.reset_timeout_s):
            raise ValueError(f"env.agent.turn_timeout_s ({self.agent.turn_timeout_s:g}) must be below "
                             f"env.step_timeout_s and env.reset_timeout_s ({self.step_timeout_s:g}, "
                             f"{self.reset_timeout_s:g}): the agent's own deadline must end an episode before its "
                             "process is killed")
        if self.agent is not None and self.tools:
            raise ValueError("env.tools give a step() environment tools; an agent program brings its own (env.agent)")
        return self

    def build_kwargs(self, temperature: float, top_p: float) -> dict:
        """What the environment is built with: env.kwargs, or for an agent program its section and the run's
        sampling (the endpoint serves turns at it)."""
        if self.agent is None:
            return dict(self.kwargs)
        return {**self.agent.model_dump(exclude_none=True), **self.kwargs, "temperature": temperature, "top_p": top_p}

    @property
    def window(self) -> int | None:
        """The history window of each turn (None: the whole conversation)."""
        return self.history_turns if self.samples == "step" else None
