"""``gyre generate``: batch inference from a prompt file into a JSONL file.

Prompts are read like training prompts (files, directories, globs, datasets; the data section's column
mapping, prompt template, chat template and system prompt), but need no answer column. The model is
sampled by gyre's rollout engine in this process (continuous batching, at most ``max_batch_size``
sequences at once), one seeded stream per prompt, so the same command gives the same responses.
Each line of the output holds the prompt, one response, and the row's id columns.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gyre.app.model_source import ModelSource
from gyre.config.schema import RLVRConfig
from gyre.types import GenerationResult, PromptRecord

ID_NAMES = ("id", "uid", "idx", "index", "key")
"""Columns kept by default (with any column whose name ends in _id): what identifies a row."""


@dataclass(frozen=True)
class GenerateOptions:
    out: Path
    """The JSONL file to write."""
    n: int = 1
    """Responses per prompt."""
    keep: tuple[str, ...] | None = None
    """Columns copied into each output line; None: the id columns (``ID_NAMES``, ``*_id``); ("all",): every one."""
    overwrite: bool = False
    """Replace ``out`` when it exists."""


def generate_responses(cfg: RLVRConfig, source: ModelSource, options: GenerateOptions,
                       echo: Callable[[str], None] = print) -> Path:
    """Sample ``options.n`` responses to every prompt of data.train_files; returns the file written."""
    from gyre.app.evaluate import claim_outputs
    from gyre.app.export import loadable_model

    out = Path(options.out).expanduser().resolve()
    (path,) = claim_outputs(out.parent, [out.name], options.overwrite)
    cfg, prompts = load_generation_prompts(cfg, echo)
    keep = _kept_columns(prompts, options.keep)
    with loadable_model(source) as model_dir:
        results = sample(cfg, model_dir, prompts, options.n)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for record, samples in zip(prompts, results):
            ids = {k: record.columns[k] for k in keep}
            for r in samples:
                row = {**ids, "prompt": record.question or record.prompt_text, "response": r.response_text,
                       **({"sample": r.sample_index} if options.n > 1 else {}), "finish_reason": r.finish_reason,
                       "source": record.uid}
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    echo(f"wrote {len(prompts) * options.n} responses to {len(prompts)} prompts: {path}")
    return path


def load_generation_prompts(cfg: RLVRConfig, echo: Callable[[str], None]) -> tuple[RLVRConfig, list[PromptRecord]]:
    """The prompts of data.train_files through the data section's mapping (no answer column read; the tag
    column stays an ordinary column), with paths resolved and the model's headers checked first."""
    from gyre.app.preflight import check_models, resolve_paths
    from gyre.data.columns import ColumnMap
    from gyre.data.prompts import load_prompts
    from gyre.models.loading import load_tokenizer
    from gyre.training.run_data import data_renderer

    cfg = resolve_paths(cfg)
    check_models(cfg)
    d = cfg.data
    tokenizer = load_tokenizer(cfg.model.tokenizer_path or cfg.model.path, cfg.model.trust_remote_code)
    columns = dataclasses.replace(ColumnMap.from_config(d), answer_key=None, tag_key=None)
    prompts, overlong = load_prompts(d.train_files, data_renderer(cfg, tokenizer), d.max_prompt_tokens, columns,
                                     d.overlong_prompts)
    echo(f"data: {len(prompts)} prompts" + overlong.describe(d.max_prompt_tokens))
    return cfg, prompts


def _kept_columns(prompts: Sequence[PromptRecord], keep: tuple[str, ...] | None) -> list[str]:
    """The columns every output line carries; a named column that some row lacks is an error naming it."""
    from gyre.data.prompts import DataError

    present = list(dict.fromkeys(k for p in prompts for k in p.columns))
    if keep is None:
        return [k for k in present if k.lower() in ID_NAMES or k.lower().endswith("_id")]
    if keep == ("all",):
        return present
    for record in prompts:
        missing = [k for k in keep if k not in record.columns]
        if missing:
            have = ", ".join(sorted(record.columns)) or "none besides the prompt"
            raise DataError(f"{record.uid}: no column {missing[0]!r} (--keep); this row's other columns: {have}")
    return list(keep)


def sample(cfg: RLVRConfig, model_dir: Path, prompts: Sequence[PromptRecord], n: int) -> list[list[GenerationResult]]:
    """``n`` responses to each prompt (rollout.sampling's knobs, one seeded stream per prompt), in order."""
    import torch

    from gyre.cluster.roles import rollout_worker_args
    from gyre.cluster.workers import RolloutWorker
    from gyre.config.derive import detect_local_devices
    from gyre.seeding import derive_seed
    from gyre.types import GenerationRequest, SamplingParams

    s = cfg.rollout.sampling
    params = SamplingParams(s.temperature, s.top_p, s.top_k, s.max_new_tokens, tuple(s.stop))
    kind = detect_local_devices(cfg)[0]
    worker = RolloutWorker(*rollout_worker_args(cfg, 0, str(model_dir), kind, torch.get_num_threads(), False))
    requests = [GenerationRequest(f"generate-{i}", p.prompt_ids, params, n=n, seed=derive_seed(cfg.run.seed,
                                                                                               "generate", i))
                for i, p in enumerate(prompts)]
    results = worker.engine.generate(requests)  # request order, then sample index
    return [results[i * n:(i + 1) * n] for i in range(len(prompts))]
