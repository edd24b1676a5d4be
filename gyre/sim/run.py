"""The simulated training run: the RLVR pipeline's step on the virtual clock.

Each step is ``RLVRPipeline.train_step``'s, on the real ``RolloutMachine`` driving the simulated cluster
(``gyre.sim.cluster.SimCluster``, a ``RolloutPort``): ``next_batch`` (admit, run until the batch is
committed, take it), train, ``publish`` the new version (lockstep's hold included). Colocated layouts
(rollout and training time-share the devices) hold the engines while the trainer has the devices;
disaggregated ones let the rollout run on while the trainer works (``RolloutMachine.wait_for`` with a
virtual deadline) when the run is asynchronous. Only the learner's *costs* are simulated: every
scheduling decision is made by the real machine and scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gyre.envs.calls import SlotPool
from gyre.envs.context import ContextBuilder
from gyre.envs.episode import EpisodeLimits
from gyre.rollout.episodes import EpisodeRunner
from gyre.rollout.machine import RolloutMachine
from gyre.rollout.scheduler import ScheduleSpec
from gyre.sim.cluster import SimCluster
from gyre.sim.cost import CostModel
from gyre.sim.elastic import ElasticPool, ElasticSpec, install
from gyre.sim.engine import SimEngine
from gyre.sim.learner import SimLearner
from gyre.sim.services import SimEnvs, SimRewards, WordTokenizer
from gyre.sim.workload import RecordedWorkload, Workload, WorkloadSpec
from gyre.types import GenerationRequest, PromptRecord


@dataclass(frozen=True)
class Layout:
    """Where the roles run on ``devices`` devices."""

    devices: int
    rollout_devices: int
    train_devices: int
    colocated: bool
    """Rollout and training time-share the same devices (else they run side by side)."""
    tp: int = 1
    """Devices per rollout engine (tensor parallelism)."""
    classes: tuple[str, ...] = ()
    """Rollout pools of their own device classes (``24 h20``) and the trainer's class last; empty: one class."""

    @property
    def engines(self) -> int:
        return max(1, self.rollout_devices // self.tp)

    def describe(self) -> str:
        if self.colocated:
            return f"{self.devices} shared"
        if self.classes:
            return f"{' + '.join(self.classes[:-1])} rollout + {self.train_devices} {self.classes[-1]} train"
        return f"{self.rollout_devices} rollout + {self.train_devices} train"


@dataclass(frozen=True)
class Pool:
    """Rollout engines on a device class of their own (``simulate.rollout_pools``)."""

    cost: CostModel
    devices: int
    kv_tokens: float | None = None
    """Each engine's KV budget, as ``SimSpec.kv_tokens``."""

    @property
    def engines(self) -> int:
        return self.devices // self.cost.tp

    def describe(self) -> str:
        return f"{self.devices} {self.cost.device.name}"


@dataclass(frozen=True)
class Agentic:
    """A multi-turn workload: episodes on simulated environments."""

    limits: EpisodeLimits
    slots: int
    """Environments that run at once."""
    latency_scale: float = 1.0
    """Environment latency multiplier (environments on the GPU hosts' busy CPUs are slower)."""
    turn_sync: bool = False
    max_failures: int = 3
    """env.max_failures: failed episodes a group replaces before it is given up."""
    reset_timeout_s: float = 60.0
    step_timeout_s: float = 30.0


@dataclass(frozen=True)
class SimSpec:
    """Everything one simulation needs, resolved (``gyre.sim.scenario`` builds it from a config)."""

    schedule: ScheduleSpec
    layout: Layout
    cost: CostModel
    workload: WorkloadSpec
    steps: int = 6
    warmup: int = 2
    """First steps left out of the averages (the pipeline fills, caches warm)."""
    partial: bool = True
    max_rows: int | None = None
    reward_workers: int = 0
    passes: float = 4.0
    """A training step's compute in forward passes over the batch (``gyre.training.plan.StepPasses``: what
    the real learner runs: scoring passes, updates per epoch, critics, gradient checkpointing)."""
    agentic: Agentic | None = None
    seed: int = 0
    recorded: tuple | None = None
    """Response lengths replayed from a real run (``workload.recorded_groups``): per step, its groups'
    (prompt tokens, response tokens per sample); None draws them from ``workload``."""
    padding: str = "pack"
    """How training batches its rows (``policy.remove_padding``): none pads consecutive micro-batches of
    ``micro_batch`` rows to their longest, sort pads after ordering rows by length, pack pads nothing."""
    micro_batch: int = 8
    kv_tokens: float | None = None
    """Each engine's KV-cache budget in tokens, as the run's engine sets it (``scenario.kv_budget``: vLLM's
    gpu_memory_utilization, the HF engine's max_batch_tokens / gpu_memory_utilization); None: what the device
    holds beside the weights (``CostModel.kv_capacity_tokens``)."""
    learner: SimLearner | None = None
    """The step's passes and micro-batches as the real learner and trainers cut them (``gyre.sim.learner``,
    built by ``scenario``); None (a spec built by hand): ``passes`` forward-equivalents over ``train_tokens``
    spread evenly over the training devices."""
    elastic: ElasticSpec | None = None
    """Rollout engines that join and leave at run time, on top of the layout's (``gyre.sim.elastic``)."""
    train_cost: CostModel | None = None
    """Training's costs where its device class is not rollout's (``simulate.rollout_pools``); None: ``cost``."""
    pools: tuple[Pool, ...] = ()
    """The rollout engines' device classes, in rank order (``simulate.rollout_pools``); empty: every engine
    of the layout costs ``cost`` (then the first pool's, which lent engines take too)."""
    env_price_per_hour: float = 0.0
    """What the environments' hosts cost an hour, beside the devices."""

    @property
    def trainer(self) -> CostModel:
        """The training side's costs: its steps, swaps and the weights' publication."""
        return self.train_cost or self.cost

    def engine_cost(self, rank: int) -> tuple[CostModel, float | None]:
        """The cost model and KV budget of the engine of ``rank`` (lent engines, past the pools: ``cost``'s)."""
        for pool in self.pools:
            if rank < pool.engines:
                return pool.cost, pool.kv_tokens
            rank -= pool.engines
        return self.cost, self.kv_tokens

    @property
    def price_per_hour(self) -> float:
        """What the layout's devices (and environment hosts) cost an hour, lent engines left out."""
        lay = self.layout
        if not self.pools:
            return self.cost.device.price_per_hour * lay.devices + self.env_price_per_hour
        return (self.trainer.device.price_per_hour * lay.train_devices + self.env_price_per_hour
                + sum(p.cost.device.price_per_hour * p.devices for p in self.pools))


@dataclass
class StepRecord:
    """One simulated training step (times in virtual seconds)."""

    step: int
    start: float
    end: float
    generate_s: float
    """Until the batch was committed."""
    train_s: float
    sync_s: float
    samples: int
    response_tokens: int
    rollout_busy: float
    """Share of the rollout engines' time spent prefilling and decoding during the step (engine-seconds in
    the pool: with elastic capacity, time-weighted over the engines present)."""
    engines: int
    """Rollout engines in the pool at the end of the step."""
    stats: dict[str, float] = field(default_factory=dict)
    """The scheduler's counters for the step (staleness, aborts, waste: ``take_stats``)."""

    @property
    def step_s(self) -> float:
        return self.end - self.start


@dataclass
class SimResult:
    spec: SimSpec
    steps: list[StepRecord]
    wall_s: float
    """Real seconds the simulation took."""
    events: int

    @property
    def measured(self) -> list[StepRecord]:
        return self.steps[self.spec.warmup:] or self.steps

    def mean(self, key: str) -> float:
        rows = self.measured
        if hasattr(rows[0], key):
            return sum(getattr(r, key) for r in rows) / len(rows)
        return sum(r.stats.get(key, 0.0) for r in rows) / len(rows)

    @property
    def step_s(self) -> float:
        rows = self.measured
        return (rows[-1].end - rows[0].start) / len(rows)

    @property
    def samples_per_s(self) -> float:
        return sum(r.samples for r in self.measured) / (self.measured[-1].end - self.measured[0].start)

    @property
    def trained_tokens_per_s(self) -> float:
        """Response tokens trained on per second: what a user buys (samples/s flatters a schedule that
        trains the short answers and wastes the long ones)."""
        return sum(r.response_tokens for r in self.measured) / (self.measured[-1].end - self.measured[0].start)

    @property
    def wasted_share(self) -> float:
        """Of the tokens the engines generated in the measured steps, the share counted as waste (aborted,
        expired, filtered, redundant, cut or regenerated)."""
        generated = sum(r.stats.get("rollout/tokens_generated", 0) for r in self.measured)
        return sum(r.stats.get("rollout/tokens_wasted", 0) for r in self.measured) / generated if generated else 0.0

    @property
    def trainer_busy(self) -> float:
        return sum(r.train_s for r in self.measured) / (self.measured[-1].end - self.measured[0].start)

    @property
    def staleness_max(self) -> float:
        return max(r.stats.get("staleness/max_start", 0.0) for r in self.steps)

    @property
    def cost_per_1k_samples(self) -> float:
        """Device-hours per thousand samples times each device's price: the layout's devices (each pool at its
        class's price, the environment hosts' price besides), and lent engines for the share of the time they
        were there (spot capacity is paid for too)."""
        spec, price = self.spec, self.spec.price_per_hour
        if spec.elastic is not None:
            price += spec.cost.device.price_per_hour * spec.elastic.lent * spec.elastic.duty * spec.layout.tp
        return price * 1000 / self.samples_per_s / 3600

    @property
    def device_idle(self) -> float:
        """Share of all device time spent neither decoding nor training (colocated devices do both in
        turn; disaggregated ones each their own role)."""
        lay, busy = self.spec.layout, self.mean("rollout_busy")
        if lay.colocated:
            return max(0.0, 1 - busy - self.trainer_busy)
        return 1 - (lay.rollout_devices * busy + lay.train_devices * self.trainer_busy) / lay.devices


class SimRun:
    def __init__(self, spec: SimSpec):
        self.spec = spec
        self.workload = Workload(spec.workload, spec.seed) if spec.recorded is None else \
            RecordedWorkload(spec.workload, spec.seed, spec.recorded, spec.schedule.batch_groups)
        engines = [self.new_engine(rank) for rank in range(spec.layout.engines)]
        envs, episodes = None, None
        if spec.agentic is not None:
            a = spec.agentic
            envs = SimEnvs(self.workload, a.latency_scale, a.reset_timeout_s, a.step_timeout_s)
            builder = ContextBuilder(WordTokenizer(), use_template=False)
            episodes = EpisodeRunner(SlotPool(a.slots), builder, a.limits, spec.schedule.sampling,
                                     env_seed=lambda g: int(g.prompt.columns["index"]), max_failures=a.max_failures,
                                     turn_sync=a.turn_sync)
        self.cluster = SimCluster(engines, SimRewards(self.workload, spec.reward_workers), envs)
        # The engines are built holding version 0 (live): nothing to publish before the first step.
        self.machine = RolloutMachine(self.cluster, spec.schedule, self.draw, partial=spec.partial,
                                      sources=(lambda sampling: episodes) if episodes is not None else None, live=True)
        self.scheduler = self.machine.scheduler
        # Known to the cluster from the start: engines that join before the first step are its too.
        self.cluster.schedulers[spec.schedule.stream] = self.scheduler
        self.drawn = 0
        self._prompt_of: dict[str, PromptRecord] = {}
        """Group id -> its prompt (what a request's sample lengths are drawn from)."""
        self.elastic: ElasticPool | None = install(spec.elastic, self) if spec.elastic is not None else None

    def new_engine(self, rank: int | None = None) -> SimEngine:
        """An engine of the layout's ``rank`` (its pool's device class), or a lent one (None: ``spec.cost``)."""
        cost, kv_tokens = self.spec.engine_cost(rank) if rank is not None else (self.spec.cost, self.spec.kv_tokens)
        engine = SimEngine(cost, self._length, self.spec.max_rows)
        if kv_tokens is not None:
            engine.kv_tokens = kv_tokens
        return engine

    def _length(self, request: GenerationRequest, sample: int) -> int:
        gid = request.request_id.split("/")[0]
        prompt = self._prompt_of.get(gid)
        if prompt is None:
            flight = self.scheduler.flights.get(gid)
            if flight is None:  # its group committed or was aborted before the engine took it: an abort follows
                return 1
            prompt = self._prompt_of[gid] = flight.group.prompt
        if self.spec.agentic is not None:  # a turn: "<group>/<episode>#<turn>", keyed by the prompt, not the group
            episode, _, turn = request.request_id.rpartition("#")
            return self.workload.turn_tokens(prompt.columns["index"], int(episode.rpartition("/")[2]), int(turn))
        return self.workload.response_tokens(prompt, sample)

    def draw(self, k: int) -> list[PromptRecord]:
        prompts = [self.workload.prompt(self.drawn + i) for i in range(k)]
        self.drawn += k
        return prompts

    def run(self) -> SimResult:
        t0 = time.perf_counter()
        records = [self.step(n) for n in range(1, self.spec.steps + 1)]
        return SimResult(self.spec, records, time.perf_counter() - t0, self.cluster.events)

    def step(self, n: int) -> StepRecord:
        """One training step: rollout until the batch is committed, train, publish."""
        spec, cluster, trainer = self.spec, self.cluster, self.spec.trainer
        start, busy = cluster.now, self._busy()
        batch = self.machine.next_batch(n)
        generate_s = cluster.now - start
        groups = batch.groups
        trajectories = [t for g in groups for t in g.trajectories]
        responses = [sum(len(s.token_ids) for s in t.segments) for t in trajectories]
        rows = [len(t.prompt.prompt_ids) + n for t, n in zip(trajectories, responses, strict=True)]
        if spec.learner is not None:
            index = [k for k, g in enumerate(groups) for _ in g.trajectories]  # each row's group (AsyPPO's critics)
            train_s = trainer.train_compute_s(spec.learner.step_flops(rows, n, index))
        else:
            train_s = trainer.train_s(train_tokens(rows, spec.padding, spec.micro_batch),
                                        spec.layout.train_devices, spec.passes)
        if spec.layout.colocated:
            cluster.hold(cluster.now + train_s + 2 * trainer.swap_s(spec.layout.train_devices))
        elif spec.schedule.async_ratio > 0:  # the rollout goes on while the learner's calls run
            self.machine.wait_for(cluster.now + train_s)
        else:  # synchronous: nothing is admitted while the policy trains (what is scored meanwhile lands)
            cluster.run(self.scheduler, lambda: False, until=cluster.now + train_s)
        sync_s = trainer.sync_s()
        self.machine.publish(n)  # lockstep: held until the engines settle their version's groups
        cluster.now += sync_s  # the trainer waits for the engines to take the new weights
        stats = dict(batch.stats)  # the scheduler's counters since the previous batch, as a real run logs them
        stats["staleness/max_start"] = max((n - 1 - g.admitted_version for g in groups), default=0)
        live = [e for e in cluster.engines if e is not None]
        step_s = cluster.now - start
        # Engine-seconds the pool had over the step: with elastic capacity, the engines there over time
        # (the busy seconds count engines that left meanwhile too), not the engines left at its end.
        pool = self.elastic.mean_engines(start, cluster.now) if self.elastic is not None else len(live)
        return StepRecord(n, start, cluster.now, generate_s, train_s, sync_s, len(trajectories), sum(responses),
                          (self._busy() - busy) / max(1e-9, pool * step_s), len(live), stats)

    def _busy(self) -> float:
        if self.elastic is not None:  # engines that left keep their part
            return self.elastic.busy_s
        return sum(e.busy_s for e in self.cluster.engines if e is not None)


def train_tokens(rows: list[int], padding: str, micro_batch: int) -> int:
    """Tokens a training pass computes over rows of these lengths, padding included, cut in the order given
    (a spec built by hand; ``gyre.sim.learner`` cuts as the learner and trainers do)."""
    if padding == "pack":
        return sum(rows)
    order = sorted(rows, reverse=True) if padding == "sort" else rows
    return sum(max(order[i:i + micro_batch]) * len(order[i:i + micro_batch]) for i in range(0, len(order), micro_batch))


def simulate(spec: SimSpec) -> SimResult:
    return SimRun(spec).run()
