"""Pre-flight notes that need the model's own files."""

import pytest

from gyre.app.preflight import context_note
from gyre.config import load_config


def test_a_context_longer_than_the_models_positions_is_warned_about(tiny_model_dir):
    """The tiny preset knows 1024 positions: 1000 prompt tokens and 100 new ones do not fit."""
    base = [f"model.path={tiny_model_dir}", "data.train_files=[t.jsonl]", "rollout.sampling.max_new_tokens=100"]
    note = context_note(load_config(None, [*base, "data.max_prompt_tokens=1000"]))
    assert note == ("warning: data.max_prompt_tokens=1000 + rollout.sampling.max_new_tokens=100 = 1100 tokens, past "
                    "the model's max_position_embeddings=1024 (its config.json): a sample that long runs past the "
                    "positions the model knows; lower one of them")
    assert context_note(load_config(None, [*base, "data.max_prompt_tokens=924"])) is None  # exactly 1024 fits


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tiny_model_dir, tmp_path):
    """Ids past the embedding would index out of range on the first forward pass (a CUDA assert on a GPU)."""
    import json
    import shutil

    from gyre.app.preflight import check_policy_model
    from gyre.config.schema import ModelConfig
    from gyre.models.loading import ModelPathError

    small = shutil.copytree(tiny_model_dir, tmp_path / "small")
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 50}))
    check_policy_model(ModelConfig(path=str(tiny_model_dir)))  # its own tokenizer fits
    with pytest.raises(ModelPathError, match=r"the tokenizer of model.path has 101 tokens but the model's embedding "
                                             r"has 50 rows .* resize the embeddings"):
        check_policy_model(ModelConfig(path=str(small)))
