"""A scalar reward model: a local sequence-classification model that reads prompt + response and
returns the logit at the last non-padding token (transformers' ``*ForSequenceClassification`` picks
that position from ``pad_token_id``). Held by a reward-model role (``RewardModelWorker``)."""

from __future__ import annotations

import time

import torch

from gyre.types import RewardResult


class RewardModel:
    def __init__(self, cfg, device: torch.device, trust_remote_code: bool = False, dtype: str = "float32"):
        from transformers import AutoModelForSequenceClassification

        from gyre.models.loading import load_tokenizer, quiet_transformers

        quiet_transformers()
        self.cfg, self.device = cfg, device
        self.tokenizer = load_tokenizer(cfg.path, trust_remote_code)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            cfg.path, num_labels=1, trust_remote_code=trust_remote_code, dtype=getattr(torch, dtype)).to(device).eval()
        if self.model.config.pad_token_id is None:  # needed to find each row's last real token
            self.model.config.pad_token_id = self.tokenizer.pad_token_id

    @torch.inference_mode()
    def score(self, requests) -> list[RewardResult]:
        start = time.perf_counter()
        texts = [r.prompt + r.response for r in requests]
        scores: list[float] = []
        self.tokenizer.padding_side = "right"
        for i in range(0, len(texts), self.cfg.micro_batch_size):
            enc = self.tokenizer(texts[i:i + self.cfg.micro_batch_size], return_tensors="pt", padding=True)
            logits = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits
            scores.extend(logits[:, 0].float().cpu().tolist())
        elapsed = time.perf_counter() - start
        return [RewardResult(score=s, correct=s > self.cfg.pass_score, latency_s=elapsed) for s in scores]
