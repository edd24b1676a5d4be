"""The GPU smoke check's engine sections: decoding throughput on a 7B-shaped model, and the packing mask's cost."""

from __future__ import annotations

from dataclasses import replace

import torch

from gpusmoke.common import Ctx, allocated, gib, model_vocab, peak, qwen2, random_ids, reset_peak, timed


# ---- e. engine throughput on a 7B-shaped random model ------------------------------------------------------
def engine_7b(ctx: Ctx) -> dict:
    """gyre's HF engine decoding a random model of Qwen2-7B's shape in bf16 at a few batch sizes: tokens/s
    and the peak device memory of each (the memory pre-flight's engine estimate is checked against it)."""
    from gyre.engines.hf_rollout import HFRolloutEngine
    from gyre.models.presets import build_char_tokenizer
    from gyre.types import GenerationRequest, SamplingParams

    device = ctx.device
    reset_peak(device)
    build_s, model = timed(lambda: qwen2(ctx), device)
    vocab = model.config.vocab_size
    out = {"shape": "Qwen2-7B" if ctx.gpu else "Qwen2, tiny", "params": sum(p.numel() for p in model.parameters()),
           "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "build_s": round(build_s, 2),
           "weights_gib": gib(allocated(device))}
    engine = HFRolloutEngine(model, build_char_tokenizer(), device)  # it drops the ids its vocabulary lacks
    prompt, new = (256, 128) if ctx.gpu else (8, 8)
    batches = (16, 64, 256) if ctx.gpu else (2, 4)
    params = SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True)
    engine.generate([GenerationRequest("warm-up", random_ids(1, 16, vocab)[0], replace(params, max_new_tokens=4))])
    out["workload"] = {"prompt_tokens": prompt, "new_tokens": new, "batches": list(batches)}
    for rows in batches:
        requests = [GenerationRequest(f"r{i}", ids, params, seed=i)
                    for i, ids in enumerate(random_ids(rows, prompt, vocab, seed=rows))]
        reset_peak(device)
        seconds, results = timed(lambda requests=requests: engine.generate(requests), device)
        ok = all(len(r.response_ids) == new and all(map(_finite, r.logprobs)) for r in results)
        out[f"batch {rows}"] = {"rows": rows, "seconds": round(seconds, 3),
                                "tokens_per_s": round(rows * new / seconds, 1), "peak_gib": gib(peak(device)),
                                "ok": ok}
        ctx.save(out)
    out["headline"] = ", ".join(f"batch {r}: {out[f'batch {r}']['tokens_per_s']} tok/s" for r in batches)
    return out


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


# ---- g. the packing mask's cost ----------------------------------------------------------------------------
def _use_attention(model, kind: str) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(kind)
    else:  # older transformers: the config's field is what the layers read
        model.config._attn_implementation = kind


def _measure(model, layout, ids: torch.Tensor, kind: str, device: torch.device) -> tuple[dict, torch.Tensor]:
    """One layout under one attention kernel: building its inputs, a forward pass (the first one apart: flex
    compiles there), and a forward + backward with its peak memory; returns the real tokens' hidden states."""
    _use_attention(model, kind)
    inputs_s, inputs = timed(lambda: layout.model_inputs(ids, kind), device)
    mask = inputs.get("attention_mask")
    backbone = model.model

    def forward():
        with torch.no_grad():
            return backbone(**inputs).last_hidden_state

    def train():
        backbone(**inputs).last_hidden_state.float().square().mean().backward()
        model.zero_grad(set_to_none=True)

    first_s, hidden = timed(forward, device)
    forward_s, hidden = timed(forward, device, repeat=3)
    reset_peak(device)
    try:
        train_s, _ = timed(train, device, repeat=2, warmup=1)
    except NotImplementedError as exc:  # flex-attention has no backward on CPU
        train_s, backward = None, f"unsupported here: {exc}"[:300]
    if layout.packed:
        real = hidden[0]
    else:
        lengths = layout.lengths.to(device)
        real = hidden[torch.arange(layout.width, device=device)[None] < lengths[:, None]]
    result = {"tokens": int(inputs["input_ids"].numel()), "inputs_s": round(inputs_s, 5),
              "mask": type(mask).__name__ if mask is not None else "none",
              "mask_mib": round(mask.numel() * mask.element_size() / 2**20, 3) if torch.is_tensor(mask) else 0,
              "first_forward_s": round(first_s, 4), "forward_s": round(forward_s, 4),
              "forward_backward_s": None if train_s is None else round(train_s, 4), "train_peak_gib": gib(peak(device))}
    if train_s is None:
        result["forward_backward"] = backward
    return result, real.float()


def packing(ctx: Ctx) -> dict:
    """Rows of unequal lengths as padded rows (the fused causal path, no mask), packed under sdpa with the
    dense block-diagonal mask ([N, N]: its cost grows with the square of the packed length), and packed
    under flex-attention (row boundaries from position ids, or a block mask). Each against the padded rows'
    hidden states. Flex-attention is skipped, with the reason, where this torch/transformers lacks it."""
    from gyre.engines.packing import RowLayout
    from gyre.models.loading import load_causal_lm

    device = ctx.device
    lengths = torch.tensor([4096, 3072, 2048, 1024] if ctx.gpu else [64, 48, 32, 16])
    width = int(lengths.max())
    model = load_causal_lm(ctx.mid, "bfloat16" if ctx.gpu else "float32", device=str(device),
                           attn_implementation="sdpa")
    ids = torch.tensor(random_ids(len(lengths), width, model_vocab(ctx.mid)), device=device)
    out = {"rows": lengths.tolist(), "padded_tokens": len(lengths) * width, "packed_tokens": int(lengths.sum())}
    baseline = None
    for label, packed, kind in (("padded rows, sdpa", False, "sdpa"), ("packed, sdpa + block mask", True, "sdpa"),
                                ("packed, flex_attention", True, "flex_attention")):
        if kind == "flex_attention" and ctx.smoke:
            out[label] = {"skipped": "not in the smallest run (flex-attention compiles for ~15 s on a CPU)"}
            continue
        layout = RowLayout(lengths=lengths, width=width, packed=packed)
        try:
            result, hidden = _measure(model, layout, ids, kind, device)
        except Exception as exc:  # noqa: BLE001 - flex-attention may be missing here: said, not fatal
            if kind != "flex_attention":
                raise
            out[label] = {"skipped": f"flex-attention unsupported here: {exc!r}"[:500]}
            continue
        if baseline is None:
            baseline = hidden
        diff = (hidden - baseline).abs().mean() / baseline.abs().mean()
        result["mean_rel_diff_vs_padded"] = round(float(diff), 5)
        result["ok"] = float(diff) < (5e-2 if ctx.gpu else 1e-4)
        out[label] = result
        ctx.save(out)
    out["headline"] = "; ".join(f"{k}: fwd {v['forward_s']} s, fwd+bwd {v['forward_backward_s'] or 'n/a'} s"
                                for k, v in out.items() if isinstance(v, dict) and "forward_s" in v)
    return out
