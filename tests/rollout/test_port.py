"""One rollout machine, two ports: the real driver over tiny-model engines and the simulated cluster.

The machine decides what is admitted, when a batch is complete and when a publication loads; a port only
carries out commands and reports what came back. Under the regimes a seed reproduces (synchronous, and
lockstep asynchrony) the groups each step trains, and the versions that generated them, depend on the
machine alone: the two ports must commit the same ones, although one runs a model on CPU threads and
the other jumps a virtual clock over simulated decoding steps.
"""

import zlib

import pytest

from gyre.cluster.group import RoleGroup
from gyre.cluster.reward_pool import DomainScorer, RewardPool
from gyre.cluster.weights import pack_weights
from gyre.cluster.workers import RewardWorker, RolloutWorker
from gyre.config.catalog import MODELS, device_class
from gyre.models.loading import load_causal_lm
from gyre.rollout.driver import RolloutDriver
from gyre.rollout.machine import RolloutMachine
from gyre.rollout.scheduler import ScheduleSpec
from gyre.sim.cluster import SimCluster
from gyre.sim.cost import CostModel
from gyre.sim.engine import SimEngine
from gyre.sim.services import SimRewards
from gyre.sim.workload import Workload, WorkloadSpec
from gyre.types import PromptRecord, SamplingParams
from tests.rollout.test_driver import FNS, engine_args

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8, stop=tuple("aeiou0123"))
STEPS = 4


def spec(alpha: float) -> ScheduleSpec:
    return ScheduleSpec(3, 2, PARAMS, run_seed=5, async_ratio=alpha, replicate=True, lockstep=alpha > 0)


def prompts():
    # columns: what the simulated rewards read of a prompt (its index, and the pass rate of its samples)
    source = iter([PromptRecord(f"p{i}", "q", [3 + i % 5, 7], "0", columns={"index": i, "z": 0.0, "pass": 0.5})
                   for i in range(100)])
    return lambda k: [next(source) for _ in range(k)]


def commits(machine: RolloutMachine, publish, overlap) -> list[list[tuple]]:
    """Per step: (group id, its start version, each sample's versions) of the groups trained, the loop of
    ``RLVRPipeline.train_step`` with the learner's work replaced by ``overlap()``."""
    out = []
    for step in range(1, STEPS + 1):
        batch = machine.next_batch(step)
        out.append([(g.group_id, g.admitted_version, [sorted({s.weight_version for s in t.segments})
                                                      for t in g.trajectories]) for g in batch.groups])
        overlap()
        publish(step)
    machine.close()
    return out


def real_commits(alpha: float, model_dir, ray) -> list[list[tuple]]:
    # Loaded before the engines start: transformers' loading is not thread-safe (in-process actors load on threads).
    state = load_causal_lm(model_dir).state_dict()
    engines = RoleGroup.local("rollout", RolloutWorker, [engine_args(model_dir, r) for r in range(2)])
    rewards = RoleGroup.local_unplaced("reward", RewardWorker, 1, (f"{FNS}:length_reward", {}, 10.0, 1))
    machine = RolloutMachine(RolloutDriver(engines, RewardPool({"default": DomainScorer("default", rewards)})),
                             spec(alpha), prompts())
    publish = lambda version: machine.publish(version, [ray.put(pack_weights(state, version))])  # noqa: E731
    publish(0)
    try:
        return commits(machine, publish, lambda: None)
    finally:
        engines.kill()
        rewards.kill()


def simulated_commits(alpha: float) -> list[list[tuple]]:
    workload = Workload(WorkloadSpec(prompt_tokens=2, response_tokens=5, max_tokens=PARAMS.max_new_tokens))
    cost = CostModel(device_class("h100"), MODELS["0.5b"])
    lengths = lambda request, sample: 1 + zlib.crc32(f"{request.request_id}/{sample}".encode()) % 8  # noqa: E731
    cluster = SimCluster([SimEngine(cost, lengths) for _ in range(2)], SimRewards(workload, workers=1))
    machine = RolloutMachine(cluster, spec(alpha), prompts(), live=True)
    overlap = (lambda: machine.wait_for(cluster.now + 3.0)) if alpha else lambda: None
    return commits(machine, machine.publish, overlap)


@pytest.mark.parametrize("alpha", [0, 1])
def test_the_real_driver_and_the_simulated_cluster_commit_the_same_groups(alpha, ray_local, tiny_model_dir):
    real, simulated = real_commits(alpha, tiny_model_dir, ray_local), simulated_commits(alpha)
    assert real == simulated
    lag = 1 if alpha else 0
    for step, groups in enumerate(real, start=1):
        assert [g[0] for g in groups] == [f"train-{step}-{i}" for i in range(2)]
        start = max(0, step - 1 - lag)
        assert all(version == start and samples == [[start]] * 3 for _, version, samples in groups)
