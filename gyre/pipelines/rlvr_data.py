"""The prompts of a run, loaded and validated in the driver before any actor starts."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from gyre.config.schema import RLVRConfig
from gyre.data.domains import DomainSampler, route_domains
from gyre.data.prompts import PromptRenderer, load_prompts
from gyre.data.sampler import EpochSampler
from gyre.models.loading import load_tokenizer
from gyre.types import PromptRecord


@dataclass
class RunData:
    tokenizer: object
    renderer: PromptRenderer
    train: list[PromptRecord]
    val_prompts: list[PromptRecord]
    train_sampler: EpochSampler | DomainSampler
    """Plain epochs over all prompts, or per-domain epochs mixed by the configured ratios."""
    pad_id: int
    dropped_long: int

    @classmethod
    def load(cls, cfg: RLVRConfig) -> RunData:
        tokenizer = load_tokenizer(cfg.model.tokenizer_path or cfg.model.path, cfg.model.trust_remote_code)
        renderer = PromptRenderer(tokenizer, cfg.data.chat_template)
        train, dropped = load_prompts(cfg.data.train_files, renderer, cfg.data.max_prompt_tokens)
        val: list[PromptRecord] = []
        if cfg.data.val_files:
            val, more = load_prompts(cfg.data.val_files, renderer, cfg.data.max_prompt_tokens)
            dropped += more
            val = val[:cfg.data.max_val_prompts] if cfg.data.max_val_prompts else val
        for records in (train, val):
            route_domains(records, cfg.reward)
        shares = {name: d.ratio for name, d in cfg.reward.domains.items() if d.ratio is not None}
        if shares:
            sampler = DomainSampler(train, shares, cfg.run.seed, cfg.data.shuffle)
        else:
            sampler = EpochSampler(len(train), seed=cfg.run.seed, shuffle=cfg.data.shuffle)
        return cls(tokenizer, renderer, train, val, sampler, int(tokenizer.pad_token_id), dropped)

    def next_train_prompts(self, k: int) -> list[PromptRecord]:
        return [self.train[i] for i in self.train_sampler.take(k)]


def config_fingerprint(cfg: RLVRConfig) -> str:
    """Hash of the settings that must not change across a resume (run length and logging may)."""
    data = cfg.model_dump(mode="json", exclude={"run": {"steps"}, "logging": True, "checkpoint": True,
                                                "cluster": {"address"}})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
