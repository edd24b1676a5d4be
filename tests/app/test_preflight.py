"""Pre-flight notes that need the model's own files."""

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
