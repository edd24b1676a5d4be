"""Ray actor classes, one per role. Each holds a backend object and exposes plain methods.

They are ordinary classes here; ``RoleGroup`` wraps them with ``ray.remote`` when it creates actors,
so importing this module does not import Ray.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch

from gyre.algos import LossDenominator
from gyre.cluster.weights import WeightBundle, pack_weights, unpack_weights
from gyre.engines.losses import PolicyLoss, PolicyLossSpec, SFTLoss, ValueLoss
from gyre.engines.trainer import TrainerBackend, TrainerSpec
from gyre.rewards.base import RewardRequest
from gyre.rewards.runner import RewardRunner, ScoreReply
from gyre.tracking.sums import MetricSums
from gyre.types import GenerationRequest, RewardResult, TrainBatch, TrainStepResult


def _device(kind: str) -> torch.device:
    # Ray makes the actor's assigned GPU the only visible one, so it is always cuda:0 inside the actor.
    return torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")


def _set_threads(threads: int) -> None:
    torch.set_num_threads(max(1, threads))


@dataclass(frozen=True)
class HybridRollout:
    """How a policy rank samples when it also serves as the rollout engine (rollout.mode hybrid)."""

    tokenizer_path: str
    trust_remote_code: bool = False
    max_batch_size: int | None = None


class TrainerRank:
    """What every data-parallel trainer actor shares: the process group, checkpoints, memory.
    Not an actor itself; PolicyWorker and CriticWorker are."""

    def __init__(self, rank: int, world_size: int, spec: TrainerSpec, device_kind: str, threads: int, seed: int):
        _set_threads(threads)
        torch.manual_seed(seed + rank)
        self.rank, self.world_size = rank, world_size
        self.backend = TrainerBackend(spec, _device(device_kind))
        self.device_kind = device_kind

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0 picks the address and a free port for the process group."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, master_addr: str, master_port: int) -> None:
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        backend = "nccl" if self.device_kind == "cuda" else "gloo"
        if self.device_kind == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size)
        self.backend.setup()

    def _train(self, shards: list[TrainBatch], denoms: list[LossDenominator], make_loss) -> TrainStepResult:
        """One optimizer step per (shard, denominator), in order."""
        metrics = MetricSums()
        grad_norms = []
        for shard, denom in zip(shards, denoms):
            grad_norms.append(self.backend.optimizer_step(self.backend.split_micro(shard), make_loss(denom), metrics))
        return TrainStepResult(metrics, grad_norms, self.backend.last_lr)

    def save_checkpoint(self, directory: str) -> None:
        self.backend.save(directory)

    def load_checkpoint(self, directory: str) -> None:
        self.backend.load(directory)

    def configure_optimizer(self, opt, schedule, total_steps: int, grad_clip: float | None) -> None:
        self.backend.configure_optimizer(opt, schedule, total_steps, grad_clip)

    def offload(self) -> None:
        self.backend.offload()

    def reload(self) -> None:
        self.backend.reload()


class PolicyWorker(TrainerRank):
    """One data-parallel rank of the policy trainer (and, in hybrid mode, a rollout engine too)."""

    def __init__(self, rank: int, world_size: int, spec: TrainerSpec, device_kind: str, threads: int, seed: int,
                 hybrid: HybridRollout | None = None):
        super().__init__(rank, world_size, spec, device_kind, threads, seed)
        self.hybrid = hybrid
        self._engine = None
        self._version = 0

    def compute_logprobs(self, shard: TrainBatch, temperature: float) -> torch.Tensor:
        return self.backend.compute_logprobs(shard, temperature)

    # ---- hybrid rollout: sampling with the training weights themselves --------------------------
    def generate_stream(self, requests: list[GenerationRequest], parts: int = 8):
        if self._engine is None:
            from gyre.engines.hf_rollout import HFRolloutEngine
            from gyre.models.loading import load_tokenizer

            h = self.hybrid
            tokenizer = load_tokenizer(h.tokenizer_path, h.trust_remote_code)
            # The unwrapped module: sampling must not go through DDP's forward hooks.
            self._engine = HFRolloutEngine(self.backend.hf_model, tokenizer, self.backend.device, h.max_batch_size)
        self._engine.set_version(self._version)
        self.backend.hf_model.eval()
        try:
            yield from self._engine.generate_stream(requests, parts)
        finally:
            self.backend.model.train()

    def set_weight_version(self, version: int) -> int:
        """Hybrid mode: the optimizer step already changed the weights in place; only the stamp moves."""
        self._version = version
        return version

    def train(self, shards: list[TrainBatch], denoms: list[LossDenominator], loss: PolicyLossSpec) -> TrainStepResult:
        return self._train(shards, denoms, lambda denom: PolicyLoss(denom=denom, spec=loss))

    def train_sft(self, shard: TrainBatch, denom: LossDenominator, micro_batch_size: int) -> TrainStepResult:
        metrics = MetricSums()
        micro = self.backend.split_micro(shard, micro_batch_size)
        norm = self.backend.optimizer_step(micro, SFTLoss(denom=denom), metrics)
        return TrainStepResult(metrics, [norm], self.backend.last_lr)

    def export_weights(self, version: int, dtype: str) -> list | None:
        """Rank 0 returns [ObjectRef of a WeightBundle] with floating tensors in the rollout ``dtype``
        (half the bytes for a bf16 engine); other ranks take part (FSDP2 gathers) and return None."""
        import ray

        state = self.backend.full_state_dict()
        if state is None:
            return None
        target = getattr(torch, dtype)
        state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
        return [ray.put(pack_weights(state, version))]

    def save_hf(self, directory: str, tokenizer_path: str) -> None:
        """Write the current weights as a Hugging Face model directory (rank 0 writes)."""
        from gyre.models.loading import load_tokenizer

        state = self.backend.full_state_dict()
        if state is not None:
            self.backend.hf_model.save_pretrained(directory, state_dict=state)
            load_tokenizer(tokenizer_path).save_pretrained(directory)


class CriticWorker(TrainerRank):
    """One data-parallel rank of the critic (value model) of PPO."""

    def compute_values(self, shard: TrainBatch) -> torch.Tensor:
        return self.backend.compute_values(shard)

    def train(self, shards: list[TrainBatch], denoms: list[LossDenominator], clip: float | None,
              loss_agg: str) -> TrainStepResult:
        return self._train(shards, denoms, lambda denom: ValueLoss(denom=denom, clip=clip, loss_agg=loss_agg))


class RolloutWorker:
    """One rollout engine replica."""

    def __init__(self, rank: int, model_path: str, tokenizer_path: str, dtype: str, trust_remote_code: bool,
                 device_kind: str, threads: int, max_batch_size: int | None, start_offloaded: bool = False):
        from gyre.engines.hf_rollout import HFRolloutEngine
        from gyre.models.loading import load_causal_lm, load_tokenizer

        _set_threads(threads)
        self.rank = rank
        device = _device(device_kind)
        # A colocated engine starts in host memory; the time-share reloads it when rollout runs.
        model = load_causal_lm(model_path, dtype, trust_remote_code, "cpu" if start_offloaded else str(device))
        self.engine = HFRolloutEngine(model, load_tokenizer(tokenizer_path, trust_remote_code), device, max_batch_size)

    def generate_stream(self, requests: list[GenerationRequest], parts: int = 8):
        """Ray streams each yielded list to the driver as soon as it is ready (finished samples first)."""
        yield from self.engine.generate_stream(requests, parts)

    def load_weights(self, bundle_refs: list) -> int:
        import ray

        bundle: WeightBundle = ray.get(bundle_refs[0])
        self.engine.load_weights(unpack_weights(bundle), bundle.version)
        return self.engine.weight_version

    def weight_version(self) -> int:
        return self.engine.weight_version

    def offload(self) -> None:
        self.engine.offload()

    def reload(self) -> None:
        self.engine.reload()


class ReferenceWorker:
    """A frozen reference model for the KL term."""

    def __init__(self, rank: int, model_path: str, dtype: str, trust_remote_code: bool, device_kind: str,
                 threads: int, micro_batch_size: int, start_offloaded: bool = False):
        from gyre.engines.forward import ReferenceModel

        _set_threads(threads)
        self.model = ReferenceModel(model_path, dtype, _device(device_kind), trust_remote_code, micro_batch_size,
                                    start_offloaded)

    def compute_logprobs(self, shard: TrainBatch, temperature: float) -> torch.Tensor:
        return self.model.compute_logprobs(shard, temperature)

    def offload(self) -> None:
        self.model.offload()

    def reload(self) -> None:
        self.model.reload()


class RewardWorker:
    """Scores responses in isolated child processes (see ``gyre.rewards.runner``). ``ping`` and
    ``child_pids`` are called on the actor's probe thread (``gyre.cluster.faults.PROBE``), so they answer
    while ``score`` is busy and the reward pool can tell a busy worker from a stopped or wedged one."""

    def __init__(self, spec: str, kwargs: dict, timeout_s: float, processes: int):
        self.runner = RewardRunner(spec, kwargs, timeout_s, processes)

    def score(self, requests: list[RewardRequest]) -> ScoreReply:
        results = self.runner.score(requests)
        return ScoreReply(results, self.runner.take_faults())

    def ping(self) -> int:
        """This worker's process id (call it in the ``PROBE`` group)."""
        return os.getpid()

    def child_pids(self) -> list[int]:
        """The reward child processes' ids (call it in the ``PROBE`` group)."""
        return self.runner.child_pids()

    def close(self) -> None:
        """Stop the child processes (an in-process actor's end: a Ray actor's children die with it)."""
        self.runner.close()


class ModelRewardWorker:
    """A reward scored by a model on its own device share: a local LLM judge or a reward model."""

    def __init__(self, kind: str, cfg, device_kind: str, threads: int):
        _set_threads(threads)
        if kind == "judge":
            from gyre.rewards.judge import LocalJudge

            self.scorer = LocalJudge(cfg, _device(device_kind))
        else:
            from gyre.rewards.reward_model import RewardModel

            self.scorer = RewardModel(cfg, _device(device_kind))

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return self.scorer.score(requests)
