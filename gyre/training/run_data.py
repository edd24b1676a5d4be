"""The prompts of a run, loaded and validated in the driver before any actor starts."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from gyre.config.schema import RLVRConfig
from gyre.data.columns import ColumnMap
from gyre.data.domains import DomainSampler, route_domains
from gyre.data.prompts import OverlongCount, PromptRenderer, load_prompts
from gyre.data.sampler import EpochSampler
from gyre.data.sft import SFTColumns, SFTExample, load_sft_examples
from gyre.envs.context import ContextBuilder
from gyre.models.loading import load_tokenizer
from gyre.seeding import derive_seed
from gyre.types import PromptRecord


@dataclass
class WarmupData:
    """The SFT warm-up's examples, tokenised and masked in the driver before any actor starts."""

    examples: list[SFTExample]
    steps: int
    """Its optimizer steps: sft_warmup.steps, or sft_warmup.epochs passes over ``examples``."""

    @classmethod
    def load(cls, cfg: RLVRConfig, renderer: PromptRenderer, tokenizer) -> WarmupData | None:
        sft = cfg.sft_warmup
        if sft is None:
            return None
        examples, _ = load_sft_examples(sft.train_files, renderer, int(tokenizer.eos_token_id), sft.max_tokens,
                                        SFTColumns.from_config(sft, "sft_warmup"), sft.overlong)
        return cls(examples, sft.total_steps(len(examples)))


@dataclass
class RunData:
    tokenizer: object
    renderer: PromptRenderer
    train: list[PromptRecord]
    val_prompts: list[PromptRecord]
    train_sampler: EpochSampler | DomainSampler
    """Plain epochs over all prompts, or per-domain epochs mixed by the configured ratios."""
    pad_id: int
    overlong: OverlongCount
    """Prompts over data.max_prompt_tokens, dropped or truncated (training and held-out together)."""
    warmup: WarmupData | None = None
    """The SFT warm-up's examples (sft_warmup), when the run has one."""

    @classmethod
    def load(cls, cfg: RLVRConfig) -> RunData:
        d = cfg.data
        tokenizer = load_tokenizer(cfg.model.tokenizer_path or cfg.model.path, cfg.model.trust_remote_code)
        renderer = data_renderer(cfg, tokenizer)
        columns = ColumnMap.from_config(d)
        train, overlong = load_prompts(d.train_files, renderer, d.max_prompt_tokens, columns, d.overlong_prompts)
        route_domains(train, cfg.reward)
        val: list[PromptRecord] = []
        if d.val_files:
            val, more = held_out_prompts(cfg, renderer)
            overlong += more
        shares = {name: d.ratio for name, d in cfg.reward.domains.items() if d.ratio is not None}
        if shares:
            sampler = DomainSampler(train, shares, cfg.run.seed, cfg.data.shuffle)
        else:
            sampler = EpochSampler(len(train), seed=cfg.run.seed, shuffle=cfg.data.shuffle)
        return cls(tokenizer, renderer, train, val, sampler, int(tokenizer.pad_token_id), overlong,
                   WarmupData.load(cfg, renderer, tokenizer))

    def next_train_prompts(self, k: int) -> list[PromptRecord]:
        return [self.train[i] for i in self.train_sampler.take(k)]


    def prompt_index(self):
        """uid -> record of every training prompt (a checkpoint names the prompts it had drawn by uid)."""
        return {p.uid: p for p in self.train}


def data_renderer(cfg: RLVRConfig, tokenizer) -> PromptRenderer:
    """How the data section's prompts become the model's text (chat template, system prompt)."""
    d = cfg.data
    return PromptRenderer(tokenizer, d.chat_template, d.system_prompt, d.chat_template_kwargs)


def held_out_prompts(cfg: RLVRConfig, renderer: PromptRenderer) -> tuple[list[PromptRecord], OverlongCount]:
    """The prompts of data.val_files (the first data.max_val_prompts), routed to their reward domains; and
    the over-long ones dropped or cut."""
    d = cfg.data
    val, overlong = load_prompts(d.val_files, renderer, d.max_prompt_tokens, ColumnMap.from_config(d),
                                 d.overlong_prompts)
    val = val[:d.max_val_prompts] if d.max_val_prompts else val
    route_domains(val, cfg.reward)
    return val, overlong


class EnvSeeds:
    """An environment run's training "prompts": an endless, seeded stream of environment instances.

    Prompt ``n`` is ``PromptRecord("env:<n>", ground_truth=<its environment seed>)``; the seed derives
    from the run seed and n, so a checkpoint needs only how many were drawn."""

    def __init__(self, run_seed: int, stream: str = "env"):
        self.run_seed, self.stream, self.drawn = run_seed, stream, 0

    def record(self, n: int) -> PromptRecord:
        seed = derive_seed(self.run_seed, self.stream, n) % (2 ** 31)
        return PromptRecord(f"{self.stream}:{n}", "", [], str(seed), domain="env")

    def take(self, k: int) -> list[PromptRecord]:
        out = [self.record(n) for n in range(self.drawn, self.drawn + k)]
        self.drawn += k
        return out

    def state_dict(self) -> dict:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        self.drawn = int(state["drawn"])

    def __contains__(self, uid: object) -> bool:
        head, _, n = str(uid).partition(":")
        return head == self.stream and n.isdigit()

    def __getitem__(self, uid: str) -> PromptRecord:
        if uid not in self:
            raise KeyError(uid)
        return self.record(int(uid.partition(":")[2]))


@dataclass
class EnvRunData:
    """What an environment run draws from: seeds, fixed validation seeds, and the conversation builder."""

    tokenizer: object
    renderer: PromptRenderer
    """For an SFT warm-up's rows."""
    builder: ContextBuilder
    train_sampler: EnvSeeds
    val_prompts: list[PromptRecord]
    pad_id: int
    train: list = field(default_factory=list)
    """No finite prompt list (empty, for the checks that read one)."""
    overlong: OverlongCount = field(default_factory=OverlongCount)
    warmup: WarmupData | None = None
    """The SFT warm-up's examples (sft_warmup), when the run has one."""

    @classmethod
    def load(cls, cfg: RLVRConfig) -> EnvRunData:
        tokenizer = load_tokenizer(cfg.model.tokenizer_path or cfg.model.path, cfg.model.trust_remote_code)
        renderer = PromptRenderer(tokenizer, "auto")
        builder = ContextBuilder(tokenizer, renderer.use_template, cfg.env.system_prompt)
        val = EnvSeeds(cfg.run.seed, "env-val").take(cfg.env.val_episodes)
        return cls(tokenizer, renderer, builder, EnvSeeds(cfg.run.seed), val, int(tokenizer.pad_token_id),
                   warmup=WarmupData.load(cfg, renderer, tokenizer))

    def next_train_prompts(self, k: int) -> list[PromptRecord]:
        return self.train_sampler.take(k)

    def prompt_index(self) -> EnvSeeds:
        return self.train_sampler


def config_fingerprint(cfg: RLVRConfig) -> str:
    """Hash of the settings that must not change across a resume (run length and logging may)."""
    data = cfg.model_dump(mode="json", exclude={"run": {"steps"}, "logging": True, "checkpoint": True,
                                                "cluster": {"address"}})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
