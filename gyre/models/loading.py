"""Load local Hugging Face causal LMs and tokenizers, with errors that say what to change."""

from __future__ import annotations

from pathlib import Path

from gyre.models.checks import ModelPathError, check_config_json, check_tokenizer_files, check_weights
from gyre.models.hub import cached_repo_of, download_command, missing_model_message

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def check_model_dir(path: str | Path, key: str = "model.path", weights: bool = True, tokenizer: bool = True) -> Path:
    """Fail early, before Ray starts, when ``path`` cannot be a local HF model directory: config.json
    parses, weight headers are sound (``weights``), tokenizer files exist (``tokenizer``). ``path`` is
    local (``gyre.models.hub.resolve_model_path`` turns a Hub id into its cached snapshot first)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelPathError(missing_model_message(path, key))
    try:
        if not p.is_dir() or not (p / "config.json").is_file():
            raise ModelPathError(
                f"{key}={str(path)!r} is not a Hugging Face model directory (no config.json inside). "
                "Weights cannot be downloaded by gyre: save the model with save_pretrained() and point here.")
        check_config_json(p, key)
        if weights:
            check_weights(p, key)
        if tokenizer:
            check_tokenizer_files(p, key)
    except ModelPathError as exc:
        cached = cached_repo_of(p)
        if cached is None:
            raise
        # A snapshot in the Hub cache is fixed by fetching it again, not by re-saving it in place.
        repo_id, commit = cached
        raise ModelPathError(f"{exc} ({p} is the cached snapshot {commit[:7]} of {repo_id}: fetch it whole with "
                             f"`{download_command(repo_id, commit)}`.)") from None
    return p


def quiet_transformers() -> None:
    """transformers' progress bars, info logs and deprecation notices off in this process. Its FutureWarnings
    (a config written with keys it renamed, such as rope_scaling) speak to model authors, and every process
    that loads the model would print them again on every run; errors still show."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers(\.|$)")


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    """Tokenizer from a local directory; gets a pad token (EOS) if it has none, left padding."""
    from transformers import AutoTokenizer

    quiet_transformers()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError, ImportError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelPathError(f"cannot load the tokenizer in {path}: {first[:300]}. Save a working tokenizer there "
                             "(tokenizer.save_pretrained()), or set model.tokenizer_path to one.") from None
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ModelPathError(f"the tokenizer in {path} has neither a pad nor an EOS token; add one")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_causal_lm(path: str | Path, dtype: str = "float32", trust_remote_code: bool = False, device: str = "cpu",
                   attn_implementation: str | None = None):
    """A causal LM from a local directory in ``dtype`` on ``device``, in train mode off (eval).
    ``attn_implementation`` (eager, sdpa, flash_attention_2, ...): None lets transformers choose."""
    import torch
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    model = _built(AutoModelForCausalLM, path, device, dtype=getattr(torch, _DTYPES[dtype]),
                   trust_remote_code=trust_remote_code, **_attention(attn_implementation))
    return model.eval()


def _built(auto_class, path: str | Path, device: str, **kwargs):
    """``auto_class.from_pretrained`` on ``device`` (loaded there tensor by tensor); on "meta" the
    architecture alone, from its config.json: no weight is read and no memory is taken (a sharded
    trainer's other ranks, filled from rank 0's)."""
    import torch
    from transformers import AutoConfig

    if device == "cpu":
        return auto_class.from_pretrained(str(path), **kwargs)
    if device != "meta":
        # Each tensor is read straight into device memory: no host copy of the model first (for 8 ranks of a
        # 7B model that copy is 8 x 30 GB of host RAM at once).
        return auto_class.from_pretrained(str(path), device_map=device, **kwargs)
    extra = {k: kwargs.pop(k) for k in ("num_labels",) if k in kwargs}
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=kwargs.get("trust_remote_code", False), **extra)
    with torch.device("meta"):
        return auto_class.from_config(config, **kwargs)


def load_value_model(path: str | Path, dtype: str = "float32", trust_remote_code: bool = False, device: str = "cpu",
                     attn_implementation: str | None = None):
    """A critic: the backbone of the causal LM at ``path`` with a fresh scalar head on every position
    (a token-classification model with one label, without the dropout transformers puts before that
    head by default: a value estimate must not be noisy in training), in eval mode."""
    import torch
    from transformers import AutoModelForTokenClassification

    quiet_transformers()
    try:
        model = _built(AutoModelForTokenClassification, path, device, num_labels=1,
                       dtype=getattr(torch, _DTYPES[dtype]), trust_remote_code=trust_remote_code,
                       **_attention(attn_implementation))
    except ValueError as exc:
        raise ValueError(f"cannot build a critic (value head) from {path}: {exc}; this architecture has no "
                         "token-classification class in transformers") from None
    for module in model.modules():  # as TRL's disable_dropout_in_model
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model.eval()


def _attention(attn_implementation: str | None) -> dict:
    # Left out when unset, so that transformers keeps its own default (sdpa where the model supports it).
    return {"attn_implementation": attn_implementation} if attn_implementation else {}


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, (list, tuple)):
        ids.update(int(i) for i in gen_eos)
    return sorted(ids)
