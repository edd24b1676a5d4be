"""The GPU smoke check's sections (``bench/gpu_smoke.py`` runs each in a process of its own, time-boxed).

Each takes a ``Ctx`` and returns a JSON-able dict; ``{"skipped": why}`` when it cannot run here. On CPU each
runs at a tiny size, so the checks themselves are exercised where CI runs; the numbers that matter come
from a GPU.
"""

from __future__ import annotations

import gc
import math
import platform
import threading

import torch

from gpusmoke.common import (
    Ctx,
    allocated,
    gib,
    model_vocab,
    peak,
    random_ids,
    reset_peak,
    single_rank_group,
    sync,
    timed,
    write_mid_model,
)


def prepare(ctx: Ctx) -> dict:
    """The versions and device this run measured on, and the model directory the later sections load."""
    import importlib.util

    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0) if ctx.gpu else "cpu",
            "device_memory_gib": gib(torch.cuda.get_device_properties(0).total_memory) if ctx.gpu else None}
    for name in ("peft", "ray", "pydantic"):
        spec = importlib.util.find_spec(name)
        if spec is None:
            info[name] = None
            continue
        module = __import__(name)
        info[name] = f"{getattr(module, '__version__', '?')} ({spec.origin})"
    info.update(write_mid_model(ctx))
    ray = (info["ray"] or "missing").split(" ")[0]
    info["headline"] = f"{info['device']}, Python {info['python']}, torch {info['torch']}, transformers " \
                       f"{info['transformers']}, ray {ray}"
    return info


# ---- b. offload -------------------------------------------------------------------------------------------
def train_batch(ctx: Ctx, vocab: int):
    """One micro-batch of equal rows (no padding): prompt + response tokens, advantages, rollout log-probs."""
    from gyre.data.batching import collate

    rows, prompt, response = (4, 512, 512) if ctx.gpu else (4, 8, 8)
    ids = random_ids(rows, prompt + response, vocab)
    batch = collate([r[:prompt] for r in ids], [r[prompt:] for r in ids], pad_id=0,
                    advantages=[1.0, -0.5, 0.7, -1.2][:rows], rollout_logprobs=[[-1.0] * response] * rows)
    return batch, {"rows": rows, "prompt_tokens": prompt, "response_tokens": response}


def offload(ctx: Ctx) -> dict:
    """A policy trainer rank (DDP, then FSDP2) trains a step, offloads, reloads and trains again: the device
    memory at each point (offload should leave a small fraction: weights, gradients and Adam moments go)."""
    import torch.distributed as dist

    from gyre.algos import LossDenominator
    from gyre.engines.losses import PolicyLoss, PolicyLossSpec
    from gyre.engines.specs import OptimizerSpec, SchedulerSpec
    from gyre.engines.trainer import TrainerBackend, TrainerSpec
    from gyre.types import MetricSums

    device = ctx.device
    single_rank_group(device)
    batch, workload = train_batch(ctx, model_vocab(ctx.mid))
    loss = PolicyLoss(LossDenominator(tokens=float(batch.response_mask.sum())), PolicyLossSpec(old_source="rollout"))
    out = {"workload": {**workload, "dtype": "bfloat16" if ctx.gpu else "float32"}}
    for strategy in ("ddp", "fsdp2"):
        reset_peak(device)
        spec = TrainerSpec(str(ctx.mid), dtype=out["workload"]["dtype"], strategy=strategy,
                           micro_batch_size=workload["rows"])
        b = TrainerBackend(spec, device)
        b.setup()
        b.configure_optimizer(OptimizerSpec(lr=1e-5), SchedulerSpec(), 10, 1.0)
        step_s, norm = timed(lambda b=b: b.optimizer_step(b.split_micro(batch), loss, MetricSums()), device)
        r = {"step_s": round(step_s, 3), "grad_norm": norm, "peak_gib": gib(peak(device)),
             "after_step_gib": gib(allocated(device))}
        r["offload_s"] = round(timed(b.offload, device)[0], 3)
        r["after_offload_gib"] = gib(allocated(device))
        r["reload_s"] = round(timed(b.reload, device)[0], 3)
        r["after_reload_gib"] = gib(allocated(device))
        b.optimizer_step(b.split_micro(batch), loss, MetricSums())
        r["trains_after_reload"] = all(bool(torch.isfinite(v).all()) for v in b.full_state_dict().values())
        if ctx.gpu:
            r["offload_frees"] = round(1 - r["after_offload_gib"] / r["after_step_gib"], 3)
            r["ok"] = r["trains_after_reload"] and r["after_offload_gib"] < r["after_step_gib"] / 4
        else:
            r["ok"] = r["trains_after_reload"]
        out[strategy] = r
        ctx.save(out)
        del b
        gc.collect()
        reset_peak(device)
    dist.destroy_process_group()
    if ctx.gpu:
        out["headline"] = "; ".join(f"{s}: {out[s]['after_step_gib']} -> {out[s]['after_offload_gib']} GiB after "
                                    f"offload" for s in ("ddp", "fsdp2"))
    else:
        out["headline"] = out["note"] = "offload is a no-op on CPU: memory readings need CUDA"
    return out


# ---- c. bf16 hybrid sampling ------------------------------------------------------------------------------
def _reference_logprobs(model, results, autocast: torch.dtype | None, device: torch.device) -> torch.Tensor:
    """Log-probs of the sampled tokens from one batched forward pass (rows have equal lengths here)."""
    from gyre.models.logprobs import token_logprobs

    ids = torch.tensor([r.prompt_ids + r.response_ids for r in results], device=device)
    context = torch.autocast(device.type, dtype=autocast) if autocast else torch.autocast(device.type, enabled=False)
    with torch.no_grad(), context:
        logits = model(ids).logits
    start = len(results[0].prompt_ids) - 1
    return token_logprobs(logits[:, :-1].float(), ids[:, 1:])[:, start:].cpu()


def hybrid_bf16(ctx: Ctx) -> dict:
    """The HF engine sampling a float32 model under bf16 autocast (a hybrid policy rank's sampler), beside
    float32 and bf16 weights: tokens/s, and the sampled log-probs against a forward pass of the samples."""
    from gyre.engines.hf_rollout import HFRolloutEngine
    from gyre.models.loading import load_causal_lm, load_tokenizer
    from gyre.types import GenerationRequest, SamplingParams

    device = ctx.device
    rows, prompt, new = (32, 128, 128) if ctx.gpu else (4, 8, 8)
    params = SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True)
    requests = [GenerationRequest(f"r{i}", ids, params, seed=i)
                for i, ids in enumerate(random_ids(rows, prompt, model_vocab(ctx.mid)))]
    tok = load_tokenizer(ctx.mid)
    fp32 = load_causal_lm(ctx.mid, "float32", device=str(device))
    out = {"workload": {"rows": rows, "prompt_tokens": prompt, "new_tokens": new}}
    bf16 = torch.bfloat16
    for label, model, autocast in (("float32", fp32, None), ("float32 + bf16 autocast", fp32, bf16),
                                   ("bf16 weights", None, None)):
        if model is None:
            model = load_causal_lm(ctx.mid, "bfloat16", device=str(device))
        engine = HFRolloutEngine(model, tok, device, autocast_dtype=autocast)
        engine.generate(requests[:1])  # warm-up: kernels, cuBLAS handles
        seconds, results = timed(lambda engine=engine: engine.generate(requests), device)
        sampled = torch.tensor([r.logprobs for r in results])
        same = _reference_logprobs(model, results, autocast, device)
        exact = _reference_logprobs(fp32, results, None, device)
        out[label] = {"tokens_per_s": round(rows * new / seconds, 1), "seconds": round(seconds, 3),
                      "finite": bool(torch.isfinite(sampled).all()),
                      "lengths_ok": all(len(r.response_ids) == new for r in results),
                      "mean_logprob": round(float(sampled.mean()), 4),
                      "max_diff_vs_same_dtype_forward": round(float((sampled - same).abs().max()), 5),
                      "mean_diff_vs_float32_forward": round(float((sampled - exact).abs().mean()), 5)}
        r = out[label]
        r["ok"] = r["finite"] and r["lengths_ok"] and r["max_diff_vs_same_dtype_forward"] < 5e-2
        ctx.save(out)
    out["uniform_logprob"] = round(-math.log(model_vocab(ctx.mid)), 4)  # what a random model's samples approach
    out["headline"] = "; ".join(f"{k}: {v['tokens_per_s']} tok/s" for k, v in out.items() if isinstance(v, dict)
                                and "tokens_per_s" in v)
    return out


# ---- d. the collective transport --------------------------------------------------------------------------
def _publish(sender, spec, member, state: dict, targets: dict, version: int) -> dict:
    """Stage ``state`` as ``version`` on the sender's device and send it over the channel ``spec`` to one engine
    (``member``, on a thread of this process) receiving into ``targets``: times, and whether every tensor
    arrived exact."""
    from gyre.cluster.channel import ChannelWeights

    device = sender.member.device
    stage_s, manifest = timed(lambda: sender.stage(state.items(), version=version), device)
    got, errors = {}, []

    def receive() -> None:
        try:
            got.update(member.receive(ChannelWeights(manifest, spec), 1, targets))
        except Exception as exc:  # noqa: BLE001 - reported with the result
            errors.append(repr(exc))

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    send_s, sent = timed(lambda: sender.send(spec, version), device)
    thread.join(spec.timeout_s)
    sync(member.device)
    exact = not errors and not thread.is_alive() and all(torch.equal(got[k].to(device), v) for k, v in state.items())
    direct = sum(got[k].data_ptr() == t.data_ptr() for k, t in targets.items() if k in got)
    return {"stage_s": round(stage_s, 4), "send_s": round(send_s, 4), "bytes": sent, "buckets": len(manifest.sizes),
            "send_gb_per_s": round(sent / send_s / 1e9, 2), "exact": exact, "received_in_place": direct,
            "tensors": len(state), "errors": errors}


def transport(ctx: Ctx) -> dict:
    """The weight channel (gyre.cluster.channel) on this device: staging buckets and their checksums on the
    device, then a publication to one engine. NCCL cannot join two ranks on one GPU: with one GPU the
    channel runs on gloo over the CUDA-resident buckets (gloo bounces them through host memory, so its
    rate is a floor, not NCCL's); with two GPUs NCCL runs too, to the second."""
    from gyre.cluster.channel import SOLO_BYTES, ChannelMember, Sender
    from gyre.cluster.weights import block_checksum, bucket_checksum, stage_buckets
    from gyre.models.loading import load_causal_lm

    device = ctx.device
    model = load_causal_lm(ctx.mid, "bfloat16", device=str(device))
    state = {k: v.detach() for k, v in model.state_dict().items()}
    out = {"model_bytes": sum(v.numel() * v.element_size() for v in state.values()),
           "note": "send_s is Sender.send as a run calls it: the broadcast, then the sent version moved to host "
                   "memory (kept for a replacement engine)"}
    seconds, (buckets, _) = timed(lambda: stage_buckets(state.items(), device, solo_bytes=SOLO_BYTES), device)
    out["stage"] = {"buckets": len(buckets), "gb_per_s": round(out["model_bytes"] / seconds / 1e9, 2)}
    biggest = max(buckets, key=lambda b: b.numel())
    seconds, _ = timed(lambda: bucket_checksum(biggest), device, repeat=3, warmup=1)
    out["checksum"] = {"function": "block_checksum" if biggest.is_cuda else "adler32", "bytes": biggest.numel(),
                       "gb_per_s": round(biggest.numel() / seconds / 1e9, 2)}
    if biggest.is_cuda:
        assert block_checksum(biggest) == bucket_checksum(biggest)
    runs = [("gloo", device)]
    if ctx.gpu and torch.cuda.device_count() >= 2:
        runs.append(("nccl", torch.device("cuda", 1)))
    for backend, receiver in runs:
        sender = Sender(device)
        spec, member = sender.member.host(2, backend, 120.0), ChannelMember(receiver)
        targets = {k: torch.zeros_like(v, device=receiver) for k, v in state.items()}
        first = _publish(sender, spec, member, state, targets, 1)
        for t in targets.values():
            t.zero_()
        warm = _publish(sender, spec, member, state, targets, 2)  # the group is built once a generation
        out[backend] = {"first (builds the group)": first, "second": warm,
                        "receiver": str(receiver), "ok": first["exact"] and warm["exact"]}
    if len(runs) == 1 and ctx.gpu:
        out["nccl"] = {"skipped": "needs 2 GPUs (NCCL refuses two ranks on one device)"}
    out["headline"] = (f"stage {out['stage']['gb_per_s']} GB/s, checksum {out['checksum']['gb_per_s']} GB/s, "
                       + ", ".join(f"{b} send {out[b]['second']['send_gb_per_s']} GB/s" for b, _ in runs))
    return out
