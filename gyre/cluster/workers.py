"""Ray actor classes, one per role. Each holds a backend object and exposes plain methods.

They are ordinary classes here; ``RoleGroup`` wraps them with ``ray.remote`` when it creates actors,
so importing this module does not import Ray.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from gyre.algos.aggregation import LossDenominator
from gyre.algos.preference import PreferenceLossSpec
from gyre.cluster.channel import ChannelMember, ChannelSpec, ChannelWeights, Sender
from gyre.cluster.spans import recorder_of, timed
from gyre.cluster.weights import WeightBundle, WeightManifest, pack_weights, unpack_weights
from gyre.engines import memory
from gyre.engines.losses import DPOLoss, PolicyLoss, PolicyLossSpec, SFTLoss, ValueLoss
from gyre.engines.specs import MemoryLevers
from gyre.engines.trainer import TrainerBackend, TrainerSpec
from gyre.rewards.base import RewardRequest
from gyre.rewards.runner import RewardRunner, ScoreReply
from gyre.types import GenerationRequest, MetricSums, RewardResult, TrainBatch, TrainStepResult

if TYPE_CHECKING:
    from gyre.types import PreferenceBatch


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
    max_batch_tokens: int | None = None
    max_prefill_tokens: int | None = None
    gpu_memory_utilization: float | None = None


SERVE = "serve"
"""The concurrency group in which a rollout engine's ``serve`` loop runs (control calls use the default one)."""


WEIGHTS = "weights"
"""The concurrency group in which the policy's rank 0 broadcasts weights on a channel, beside training."""


class EngineHost:
    """The actor methods of a rollout engine behind its command loop (``gyre.engines.loop``): rollout
    workers and hybrid policy ranks. ``serve`` streams finished samples for as long as the run lasts;
    ``add`` / ``abort`` / ``update_weights`` take effect at the engine's next step boundary."""

    CONCURRENCY_GROUPS = {SERVE: 1}
    _loop = None
    _loop_lock = threading.Lock()
    """``serve`` and the first ``add`` arrive on different threads (their concurrency groups) at once:
    without the lock each could build a loop of its own, the requests queued where nobody serves."""

    def _engine(self):
        raise NotImplementedError

    def _engine_loop(self):
        from gyre.engines.loop import EngineLoop

        if self._loop is None:
            with self._loop_lock:
                if self._loop is None:
                    self._loop = EngineLoop(self._engine(), spans=recorder_of(self), **self._loop_hooks())
        return self._loop

    def _loop_hooks(self) -> dict:
        return {}

    def _load(self, bundle_refs: list | None, version: int) -> int:
        """Put the published weights into the (suspended) engine; returns the version it holds."""
        raise NotImplementedError

    def serve(self, emit_every: int = 1, emit_after_s: float = 0.05):
        """Ray streams each yielded list of finished samples to the driver as soon as it is ready."""
        loop = self._engine_loop()
        loop.emit_every, loop.emit_after_s = max(1, emit_every), emit_after_s
        yield from loop.serve()

    def add(self, requests: list[GenerationRequest]) -> None:
        self._engine_loop().add(requests)

    def abort(self, request_ids: list[str]) -> None:
        self._engine_loop().abort(request_ids)

    def update_weights(self, weights, version: int, partial: bool = True,
                       timeout_s: float | None = None) -> int:
        """Suspend -> load -> resume at the next step boundary; requests in flight continue under the new
        weights (``partial``) or come back aborted. Returns the version the engine holds."""
        return self._engine_loop().update(lambda: self._load(weights, version), partial, timeout_s)

    def stop_serving(self) -> None:
        if self._loop is not None:
            self._loop.stop(timeout_s=60)

    def busy_seconds(self) -> float:
        """Seconds this engine spent decoding since the last call (call it in the ``PROBE`` group)."""
        return self._loop.take_busy_s() if self._loop is not None else 0.0


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
        self._after_setup()

    def _train(self, shards: list[TrainBatch], denoms: list[LossDenominator], make_loss) -> TrainStepResult:
        """One optimizer step per (shard, denominator), in order."""
        metrics = MetricSums()
        grad_norms = []
        for shard, denom in zip(shards, denoms):
            grad_norms.append(self.backend.optimizer_step(self.backend.split_micro(shard), make_loss(denom), metrics))
        return TrainStepResult(metrics, grad_norms, self.backend.last_lr)

    @timed("checkpoint")
    def save_checkpoint(self, directory: str) -> None:
        self.backend.save(directory)

    def load_checkpoint(self, directory: str) -> None:
        self.backend.load(directory)
        self._after_checkpoint_load()

    def configure_optimizer(self, opt, schedule, total_steps: int, grad_clip: float | None) -> None:
        self.backend.configure_optimizer(opt, schedule, total_steps, grad_clip)

    def offload(self) -> None:
        self.backend.offload()
        self._move_extra(offload=True)

    def reload(self) -> None:
        self.backend.reload()
        self._move_extra(offload=False)

    def _after_setup(self) -> None:
        """What a subclass builds once the process group and the model exist (a collective where it gathers)."""

    def _after_checkpoint_load(self) -> None:
        """What a subclass refreshes from the weights a checkpoint restored."""

    def _move_extra(self, offload: bool) -> None:
        """Device state of a subclass's own that follows the trainer's offload and reload."""


class PolicyWorker(TrainerRank, EngineHost):
    """One data-parallel rank of the policy trainer (and, in hybrid mode, a rollout engine too)."""

    CONCURRENCY_GROUPS = {**EngineHost.CONCURRENCY_GROUPS, WEIGHTS: 1}

    def __init__(self, rank: int, world_size: int, spec: TrainerSpec, device_kind: str, threads: int, seed: int,
                 hybrid: HybridRollout | None = None):
        # Under a hybrid rollout this model also generates, which the attention choice weighs (pack_attention).
        super().__init__(rank, world_size, replace(spec, samples=hybrid is not None), device_kind, threads, seed)
        self.hybrid = hybrid
        self._sampling_copy = None
        """FSDP2 hybrid ranks sample from a full copy in the compute dtype, refreshed at each weight version
        and after a checkpoint loads; DDP ranks sample from their training replica itself."""

    # The role group calls TrainerRank's methods (checked by identity), which reach the copy through these.
    def _after_setup(self) -> None:
        if self.hybrid is not None and self.backend.spec.strategy == "fsdp2":
            self._sampling_copy = self.backend.sampling_copy()  # a collective: every rank sets up together

    def _after_checkpoint_load(self) -> None:
        if self._sampling_copy is not None:
            self.backend.refresh_sampling_copy(self._sampling_copy)

    def _move_extra(self, offload: bool) -> None:
        if self._sampling_copy is not None:
            (memory.offload if offload else memory.reload)(self._sampling_copy, self.backend.device)

    @timed("logprobs")
    def compute_logprobs(self, shard: TrainBatch, temperature: float) -> torch.Tensor:
        return self.backend.compute_logprobs(shard, temperature)

    @timed("logprobs")
    def compute_credit_scales(self, shard: TrainBatch, spec, temperature: float) -> torch.Tensor:
        """Attention-based credit: each response token's scale gamma from the policy's own attention."""
        return self.backend.compute_credit_scales(shard, spec, temperature)

    @timed("logprobs")
    def compute_ref_logprobs(self, shard: TrainBatch, temperature: float) -> torch.Tensor:
        """LoRA: the KL reference's log-probs, under the base model (the adapters switched off)."""
        return self.backend.compute_logprobs(shard, temperature, adapter=False)

    # ---- hybrid rollout: sampling with the training weights themselves --------------------------
    def _engine(self):
        from gyre.engines.hf_rollout import HFRolloutEngine
        from gyre.models.loading import load_tokenizer

        h = self.hybrid
        if h is None:
            raise RuntimeError("this policy rank is not a rollout engine (rollout.mode is not hybrid)")
        tokenizer = load_tokenizer(h.tokenizer_path, h.trust_remote_code)
        if self._sampling_copy is not None:  # already in the compute dtype
            return HFRolloutEngine(self._sampling_copy, tokenizer, self.backend.device, h.max_batch_size,
                                   h.max_batch_tokens, h.max_prefill_tokens, None, h.gpu_memory_utilization)
        # The unwrapped module: sampling must not go through DDP's forward hooks.
        # Sampling runs in the dtype training computes in (autocast on GPUs), not with the float32 masters.
        return HFRolloutEngine(self.backend.hf_model, tokenizer, self.backend.device, h.max_batch_size,
                               h.max_batch_tokens, h.max_prefill_tokens, self.backend.compute_dtype,
                               h.gpu_memory_utilization)

    def _loop_hooks(self) -> dict:
        if self._sampling_copy is not None:
            return {}
        return {"on_busy": self.backend.hf_model.eval, "on_idle": self.backend.model.train}

    def _load(self, bundle_refs: list | None, version: int) -> int:
        """The optimizer steps already changed the training weights in place: only the stamp moves, after
        an FSDP2 rank's sampling copy takes them (every rank updates together, between steps)."""
        if self._sampling_copy is not None:
            self.backend.refresh_sampling_copy(self._sampling_copy)
        engine = self._engine_loop().engine
        engine.set_version(version)
        return engine.weight_version

    @timed("train")
    def train(self, shards: list[TrainBatch], denoms: list[LossDenominator], loss: PolicyLossSpec) -> TrainStepResult:
        return self._train(shards, denoms, lambda denom: PolicyLoss(denom=denom, spec=loss))

    @timed("train")
    def train_sft(self, shard: TrainBatch, denom: LossDenominator, micro_batch_size: int) -> TrainStepResult:
        metrics = MetricSums()
        micro = self.backend.split_micro(shard, micro_batch_size)
        norm = self.backend.optimizer_step(micro, SFTLoss(denom=denom), metrics)
        return TrainStepResult(metrics, [norm], self.backend.last_lr)

    @timed("train")
    def train_dpo(self, shard: PreferenceBatch, denom: LossDenominator, micro_pairs: int,
                  spec: PreferenceLossSpec) -> TrainStepResult:
        """One optimizer step on this rank's share of whole pairs, ``micro_pairs`` pairs per forward pass."""
        metrics = MetricSums()
        norm = self.backend.optimizer_step(shard.micro_batches(micro_pairs), DPOLoss(denom=denom, spec=spec), metrics)
        return TrainStepResult(metrics, [norm], self.backend.last_lr)

    # ---- weights for the rollout engines ------------------------------------------------------------
    def _outgoing(self, dtype: str):
        """(name, tensor) pairs the engines load, and the LoRA targets (None: the full weights, floating ones
        in the rollout ``dtype``: half the bytes for a bf16 engine). With LoRA the adapters alone, in float32
        (they are small; the engines merge them). Every rank takes part (FSDP2 gathers); the others get None."""
        if self.backend.peft_model is None:
            tensors = self.backend.stream_state_dict(getattr(torch, dtype))
            if self.rank != 0:
                collections.deque(tensors, maxlen=0)  # drive the gathers; rank 0 keeps the tensors
                return None
            return tensors, None
        from gyre.models.lora import AdapterWeights, lora_targets

        trainable = self.backend.trainable_state_dict()
        if trainable is None:
            return None
        targets = lora_targets(self.backend.hf_model)
        return AdapterWeights.from_trainable_state(trainable, targets).tensors().items(), targets

    @timed("weight_sync")
    def export_weights(self, version: int, dtype: str) -> list | None:
        """The object-store path: rank 0 returns [ObjectRef of a WeightBundle] (``_outgoing``); other ranks take
        part and return None."""
        import ray

        outgoing = self._outgoing(dtype)
        if outgoing is None:
            return None
        tensors, targets = outgoing
        return [ray.put(pack_weights(tensors, version, lora=targets))]

    def open_weight_channel(self, engines: int, timeout_s: float) -> ChannelSpec:
        """Rank 0 hosts a weight channel to ``engines`` engines (``gyre.cluster.channel``; NCCL on GPUs, gloo
        on CPU)."""
        self._sender = Sender(self.backend.device)
        return self._sender.member.host(engines + 1, "nccl" if self.device_kind == "cuda" else "gloo", timeout_s)

    @timed("weight_sync")
    def stage_weights(self, version: int, dtype: str) -> WeightManifest | None:
        """The channel path: rank 0 copies ``_outgoing`` into buckets on its device and returns their
        manifest; other ranks take part and return None."""
        outgoing = self._outgoing(dtype)
        if outgoing is None:
            return None
        tensors, targets = outgoing
        return self._sender.stage(tensors, version, lora=targets)

    @timed("weight_send")
    def send_weights(self, spec: ChannelSpec, version: int) -> int:
        """Rank 0, on its ``WEIGHTS`` lane (training may go on meanwhile): broadcast staged ``version``."""
        return self._sender.send(spec, version)

    def staged_bundle(self, version: int) -> list:
        """Rank 0: staged (or last sent) ``version`` through the object store: [ObjectRef of a WeightBundle]."""
        import ray

        return [ray.put(self._sender.bundle(version))]

    def abort_weights(self, generation: int) -> None:
        """Free this rank's broadcast on channel ``generation`` (call it on the probe lane)."""
        self._sender.member.abort(generation)

    @timed("checkpoint")
    def save_hf(self, directory: str | None, tokenizer_path: str, dtype: str,
                adapter_directory: str | None = None) -> None:
        """Write the current weights in ``dtype`` as a Hugging Face model directory (with LoRA: the base
        with the adapters merged), with the tokenizer files of ``tokenizer_path`` copied unchanged; with
        LoRA and ``adapter_directory``, the adapter in peft's format there too. Rank 0 writes."""
        from gyre.models.saving import save_hf_model

        b = self.backend
        if directory is not None:
            state = b.full_state_dict()
            if state is not None and b.peft_model is not None:
                from gyre.models.lora import lora_targets, merged_state_dict

                state = merged_state_dict(state, lora_targets(b.hf_model))
            if state is not None:
                save_hf_model(b.hf_model, state, directory, dtype, tokenizer_path)
        if adapter_directory is not None and b.peft_model is not None:
            from gyre.models.lora import save_adapter

            trainable = b.trainable_state_dict()
            if trainable is not None:
                save_adapter(b.peft_model, trainable, adapter_directory, tokenizer_path)


class CriticWorker(TrainerRank):
    """One data-parallel rank of the critic (value model) of PPO."""

    @timed("logprobs")
    def compute_values(self, shard: TrainBatch) -> torch.Tensor:
        return self.backend.compute_values(shard)

    @timed("train")
    def train(self, shards: list[TrainBatch], denoms: list[LossDenominator], clip: float | None,
              loss_agg: str) -> TrainStepResult:
        return self._train(shards, denoms, lambda denom: ValueLoss(denom=denom, clip=clip, loss_agg=loss_agg))


class RolloutWorker(EngineHost):
    """One rollout engine replica: on one device, or a vLLM engine over ``tensor_parallel_size`` GPUs (the
    actor holds them all; vLLM's tensor-parallel workers are its child processes)."""

    def __init__(self, rank: int, model_path: str, tokenizer_path: str, dtype: str, trust_remote_code: bool,
                 device_kind: str, threads: int, max_batch_size: int | None, start_offloaded: bool = False,
                 attn_implementation: str | None = None, backend: str = "hf", seed: int = 0,
                 max_batch_tokens: int | None = None, max_prefill_tokens: int | None = None,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float | None = None):
        from gyre.engines.hf_rollout import HFRolloutEngine
        from gyre.models.loading import load_causal_lm, load_tokenizer

        _set_threads(threads)
        self.rank = rank
        self.device = device = _device(device_kind)
        self._channel: ChannelMember | None = None
        if backend == "vllm":
            from gyre.engines.vllm_rollout import vllm_engine

            self.engine = vllm_engine(model_path, load_tokenizer(tokenizer_path, trust_remote_code), threads,
                                      dtype=dtype, seed=seed + rank, max_batch_size=max_batch_size, device=str(device),
                                      max_prefill_tokens=max_prefill_tokens, tensor_parallel_size=tensor_parallel_size,
                                      gpu_memory_utilization=gpu_memory_utilization or 0.9)
            if start_offloaded:
                self.engine.offload()
            return
        # A colocated engine starts in host memory; the time-share reloads it when rollout runs.
        model = load_causal_lm(model_path, dtype, trust_remote_code, "cpu" if start_offloaded else str(device),
                               attn_implementation)
        self.engine = HFRolloutEngine(model, load_tokenizer(tokenizer_path, trust_remote_code), device, max_batch_size,
                                      max_batch_tokens, max_prefill_tokens, memory_share=gpu_memory_utilization)

    def _engine(self):
        return self.engine

    def _load(self, weights: list | ChannelWeights, version: int) -> int:
        """Load ``version`` from the weight channel (``ChannelWeights``) or the object store (bundle refs)."""
        if isinstance(weights, ChannelWeights):
            if self._channel is None:
                self._channel = ChannelMember(self.device)
            lora = weights.manifest.lora
            targets = self.engine.weight_targets() if lora is None and hasattr(self.engine, "weight_targets") else None
            tensors, held = self._channel.receive(weights, self.rank + 1, targets), version
        else:
            import ray

            bundle: WeightBundle = ray.get(weights[0])
            tensors, lora, held = unpack_weights(bundle), bundle.lora, bundle.version
        if held != version:
            raise ValueError(f"weight bundle holds version {held}, expected {version}")
        if lora is not None:  # a LoRA policy's adapters: merged into this engine's base weights
            from gyre.models.lora import AdapterWeights

            self.engine.load_adapter(AdapterWeights.from_tensors(tensors, lora), version)
        else:
            self.engine.load_weights(tensors, version)
        return self.engine.weight_version

    def abort_weights(self, generation: int) -> None:
        """Free a broadcast waiting on channel ``generation`` (call it on the probe lane)."""
        if self._channel is not None:
            self._channel.abort(generation)

    def weight_version(self) -> int:
        return self.engine.weight_version

    def offload(self) -> None:
        self.engine.offload()

    def reload(self, values: bool = True) -> None:
        self.engine.reload(values)


class ReferenceWorker:
    """A frozen reference model for the KL term."""

    def __init__(self, rank: int, model_path: str, dtype: str, trust_remote_code: bool, device_kind: str,
                 threads: int, micro_batch_size: int, start_offloaded: bool = False,
                 attn_implementation: str | None = None, levers: MemoryLevers | None = None):
        from gyre.engines.forward import ReferenceModel

        _set_threads(threads)
        self.model = ReferenceModel(model_path, dtype, _device(device_kind), trust_remote_code, micro_batch_size,
                                    start_offloaded, attn_implementation, levers)

    @timed("logprobs")
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

    @timed("reward")
    def score(self, requests: list[RewardRequest]) -> ScoreReply:
        results = self.runner.score(requests)
        return ScoreReply(results, self.runner.take_faults(), os.getpid())

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

    def __init__(self, kind: str, cfg, device_kind: str, threads: int, dtype: str = "float32"):
        """``dtype``: the run's model.dtype, which the scoring model holds its weights in."""
        _set_threads(threads)
        if kind == "judge":
            from gyre.rewards.judge import LocalJudge

            self.scorer = LocalJudge(cfg, _device(device_kind), threads=threads, dtype=dtype)
        else:
            from gyre.rewards.reward_model import RewardModel

            self.scorer = RewardModel(cfg, _device(device_kind), dtype=dtype)

    @timed("reward")
    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return self.scorer.score(requests)


ENV = "env"
"""The concurrency group of environment calls: one thread per call, so slots step side by side."""
MAX_ENV_SLOTS = 64
"""Environment slots one worker can step at once (its ``ENV`` group's threads)."""


class EnvWorker:
    """Hosts ``slots`` environments, each in a child process of its own (``gyre.envs.host.EnvSlot``):
    a CPU-only role that can live on any node. Calls on one slot are serialised (a late call waits for
    the one before it, which its deadline bounds); calls on different slots run side by side."""

    CONCURRENCY_GROUPS = {ENV: MAX_ENV_SLOTS}

    def __init__(self, spec, slots: int, reset_timeout_s: float, step_timeout_s: float):
        import threading

        from gyre.envs.host import EnvSlot

        if not 0 < slots <= MAX_ENV_SLOTS:
            raise ValueError(f"an environment worker hosts 1 to {MAX_ENV_SLOTS} slots, got {slots}")
        self.slots = [EnvSlot(spec) for _ in range(slots)]
        self.locks = [threading.Lock() for _ in range(slots)]
        self.timeouts = {"reset": reset_timeout_s, "step": step_timeout_s}

    def call(self, slot: int, op: str, arg):
        """``reset`` slot ``slot`` to seed ``arg`` or ``step`` it with action ``arg``: an ``EnvReset`` /
        ``EnvStep``, or an ``EnvFailure`` when the environment failed (call it in the ``ENV`` group)."""
        with self.locks[slot]:
            target = self.slots[slot]
            if op == "reset":
                return target.reset(arg, self.timeouts[op])
            with recorder_of(self).span("env_step"):  # concurrent slots merge into one busy span
                return target.step(arg, self.timeouts[op])

    def close(self) -> None:
        for s in self.slots:
            s.close()
