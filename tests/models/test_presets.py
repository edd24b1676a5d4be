import pytest
import torch

from gyre.models.loading import ModelPathError, check_model_dir, eos_token_ids, load_causal_lm, load_tokenizer
from gyre.models.presets import PRESETS, build_char_tokenizer, init_model


def test_char_tokenizer_round_trips_text():
    tok = build_char_tokenizer()
    text = "What is 12 + 34?\nAnswer:\t46 \\boxed{x}"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_init_model_is_loadable_by_transformers(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert tok.padding_side == "left" and tok.decode(tok("1 + 2")["input_ids"]) == "1 + 2"
    assert model.config.vocab_size == len(tok)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000


def test_loading_helpers(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir, "bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert eos_token_ids(model, tok) == [tok.eos_token_id]


def test_missing_model_dir_says_how_to_create_one(tmp_path):
    with pytest.raises(ModelPathError, match="gyre init-model --preset tiny"):
        check_model_dir(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelPathError, match="no config.json"):
        check_model_dir(tmp_path / "empty")


def test_unknown_preset(tmp_path):
    with pytest.raises(ValueError, match="choose one of"):
        init_model("huge", tmp_path / "m")
    assert set(PRESETS) >= {"tiny", "small", "base"}
