"""The rollout driver over a weight channel (gyre.cluster.channel): real engines (Ray actors), the sender in
this process standing in for the policy's rank 0 (as ``Learner._publication`` builds it over the policy
group)."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from gyre.cluster.channel import ChannelPublication, ChannelWeights, Sender
from gyre.cluster.faults import RoleFault
from gyre.cluster.group import RoleGroup
from gyre.cluster.reward_pool import DomainScorer, RewardPool
from gyre.cluster.workers import RewardWorker, RolloutWorker
from gyre.rollout.driver import RolloutDriver
from gyre.rollout.machine import RolloutMachine
from gyre.rollout.scheduler import ScheduleSpec
from gyre.types import PromptRecord
from tests.rollout.test_driver import FNS, PARAMS, ray_engines


class Policy:
    """The sender's side of publications: staged here, sent on a thread (the policy's weights lane)."""

    def __init__(self, ray, engines: int):
        self.ray, self.sender, self.pool = ray, Sender(torch.device("cpu")), ThreadPoolExecutor(1)
        self.spec = self.sender.member.host(engines + 1, "gloo", 60)

    def publish(self, state: dict, version: int) -> ChannelPublication:
        manifest = self.sender.stage(((k, v + version) for k, v in state.items()), version)

        def start():
            weights = ChannelWeights(manifest, self.spec)
            return weights, self.pool.submit(self.sender.send, weights.spec, version)

        def sent(future) -> int:
            try:
                return future.result(60)
            except Exception as exc:  # the policy group reports a raising call as an error fault
                raise RoleFault("policy", (0,), "send_weights", "error", str(exc)) from exc

        def failed(weights: ChannelWeights) -> None:
            self.sender.member.abort(weights.spec.generation)
            if self.spec.generation == weights.spec.generation:
                self.spec = self.spec.renewed()

        return ChannelPublication(manifest, start, sent, lambda: [self.ray.put(self.sender.bundle(version))], failed)


@pytest.fixture
def machine(ray_local, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    engines = ray_engines(ray_local, tiny_model_dir)
    rewards = RoleGroup.local_unplaced("reward", RewardWorker, 1, (f"{FNS}:length_reward", {}, 10.0, 1))
    source = iter([PromptRecord(f"p{i}", "q", [3 + i, 7], "0") for i in range(100)])
    machine = RolloutMachine(RolloutDriver(engines, RewardPool({"default": DomainScorer("default", rewards)}),
                                           replaceable=True),
                             ScheduleSpec(2, 2, PARAMS, run_seed=3), lambda k: [next(source) for _ in range(k)])
    state = {k: v for k, v in AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict().items()}
    yield machine, engines, state
    machine.close()
    engines.kill()
    rewards.kill()


def test_engines_load_each_version_over_the_channel(ray_local, machine):
    machine, engines, state = machine
    policy = Policy(ray_local, len(engines))
    for version in range(3):
        machine.publish(version, policy.publish(state, version))
        assert engines.call(RolloutWorker.weight_version) == [version, version]
    assert machine.driver.channel_fallbacks == 0 and policy.spec.generation == 0
    assert len(machine.next_batch(3).groups) == 2


def test_an_engine_lost_mid_channel_gets_the_version_from_the_store_and_the_next_builds_a_new_channel(
        ray_local, machine):
    machine, engines, state = machine
    policy = Policy(ray_local, len(engines))
    machine.publish(0, policy.publish(state, 0))  # generation 0's group is built with both engines
    ray_local.kill(engines.actors[1])
    machine.publish(1, policy.publish(state, 1))
    driver = machine.driver
    assert driver.channel_fallbacks == 1 and driver.engine_deaths == 1 and policy.spec.generation == 1
    assert engines.call(RolloutWorker.weight_version) == [1, 1]  # the replacement holds version 1 too
    machine.publish(2, policy.publish(state, 2))  # generation 1: the survivor, the replacement and the sender
    assert engines.call(RolloutWorker.weight_version) == [2, 2] and driver.channel_fallbacks == 1
    assert len(machine.next_batch(3).groups) == 2
