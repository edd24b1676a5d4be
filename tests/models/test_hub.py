"""Models named by a Hub id, resolved from a local Hugging Face cache that the tests build by hand, and
final models saved the way the user gave them: their dtype, their tokenizer files."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from gyre.models.hub import hub_cache_dir, resolve_model_path
from gyre.models.loading import ModelPathError, check_model_dir, load_causal_lm, load_tokenizer
from gyre.models.saving import copy_tokenizer_files, save_hf_model, stored_dtype
from tests.hub_cache import cache_model

MAIN, V2 = "a" * 40, "b" * 40
CUSTOM = {"my_custom_field": {"keep": [1, 2, 3]}, "padding_side": "right"}


def user_model(target, base):
    """The tiny model as a user's bfloat16 checkpoint whose tokenizer has custom config fields and no
    pad token (gyre's tokenizer object gets one, and left padding, which must not reach the saved files)."""
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(base).to(torch.bfloat16).save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(base / name, target / name)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    config.update(CUSTOM)
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return target


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory, tiny_model_dir):
    return user_model(tmp_path_factory.mktemp("user") / "model", tiny_model_dir)


@pytest.fixture
def hub(tmp_path, monkeypatch, bf16_model, tiny_model_dir):
    """A Hub cache in $HF_HUB_CACHE holding org/tiny at main (the bf16 model) and at tag v2 (float32)."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    cache_model(cache, "org/tiny", bf16_model, MAIN)
    cache_model(cache, "org/tiny", tiny_model_dir, V2, refs=("v2",))
    return cache


def test_a_hub_id_loads_from_the_cache_at_main(hub):
    path = resolve_model_path("org/tiny")
    assert path == str(hub / "models--org--tiny" / "snapshots" / MAIN)
    check_model_dir(path)  # follows the cache's links to its blobs
    model = load_causal_lm(path)
    assert model.config.vocab_size == len(load_tokenizer(path))
    assert stored_dtype(path) == "bfloat16"


@pytest.mark.parametrize("revision, commit", [("main", MAIN), ("v2", V2), (V2, V2), ("bbbbbbb", V2)])
def test_revision_picks_a_branch_tag_or_commit(hub, revision, commit):
    assert resolve_model_path("org/tiny", revision).endswith(commit)


def test_a_revision_not_in_the_cache_names_what_is_and_the_command(hub):
    with pytest.raises(ModelPathError) as exc:
        resolve_model_path("org/tiny", "v3")
    message = str(exc.value)
    assert "not revision 'v3'" in message and "main -> aaaaaaa" in message and "v2 -> bbbbbbb" in message
    assert "`hf download org/tiny --revision v3`" in message and "init-model" not in message


def test_an_id_not_in_the_cache_names_the_download_command_never_init_model(hub):
    for bad in ("org/missing", "gpt2"):
        with pytest.raises(ModelPathError) as exc:
            resolve_model_path(bad)
        message = str(exc.value)
        assert f"`hf download {bad}`" in message and f"huggingface-cli download {bad}" in message
        assert str(hub) in message and "never downloads" in message and "init-model" not in message
        with pytest.raises(ModelPathError, match="hf download") as exc:
            check_model_dir(bad)
        assert "init-model" not in str(exc.value)


def test_a_missing_local_path_still_suggests_init_model(hub, tmp_path):
    with pytest.raises(ModelPathError, match="gyre init-model --preset tiny"):
        resolve_model_path(str(tmp_path / "nope"))


def test_a_local_directory_wins_and_refuses_a_revision(hub, tmp_path, tiny_model_dir, monkeypatch):
    local = tmp_path / "org" / "tiny"
    shutil.copytree(tiny_model_dir, local)
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("org/tiny") == str(local)
    with pytest.raises(ModelPathError, match="Remove model.revision"):
        resolve_model_path("org/tiny", "v2")


def test_hf_home_is_followed_when_hf_hub_cache_is_unset(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / "hub"


def test_an_incomplete_snapshot_says_to_fetch_it_again(hub):
    snapshot = hub / "models--org--tiny" / "snapshots" / MAIN
    (snapshot / "model.safetensors").unlink()
    with pytest.raises(ModelPathError, match=f"fetch it whole with `hf download org/tiny --revision {MAIN}`"):
        check_model_dir(resolve_model_path("org/tiny"))


def test_stored_dtype_reads_config_then_weights(tmp_path, tiny_model_dir, bf16_model):
    assert stored_dtype(tiny_model_dir) == "float32" and stored_dtype(bf16_model) == "bfloat16"
    legacy = tmp_path / "legacy"
    shutil.copytree(bf16_model, legacy)
    config = json.loads((legacy / "config.json").read_text())
    config["torch_dtype"] = config.pop("dtype")  # transformers 4 wrote torch_dtype
    (legacy / "config.json").write_text(json.dumps(config))
    assert stored_dtype(legacy) == "bfloat16"
    config.pop("torch_dtype")
    (legacy / "config.json").write_text(json.dumps(config))
    assert stored_dtype(legacy) == "bfloat16"  # from the safetensors header
    assert stored_dtype(tmp_path / "absent") is None


def test_final_save_keeps_the_input_dtype_and_the_users_tokenizer_files(tmp_path, bf16_model):
    model = load_causal_lm(bf16_model)  # the trainer holds float32 masters
    tokenizer = load_tokenizer(bf16_model)
    assert tokenizer.pad_token is not None and tokenizer.padding_side == "left"  # gyre's runtime changes
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    save_hf_model(model, state, tmp_path / "final", "bfloat16", bf16_model)
    out = tmp_path / "final"
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert saved.dtype == torch.bfloat16 and json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert stored_dtype(out) == "bfloat16"
    for name, tensor in saved.state_dict().items():
        assert torch.equal(tensor, state[name].to(torch.bfloat16)), name
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (bf16_model / name).read_bytes(), name
    assert not (out / "special_tokens_map.json").exists()  # nothing re-saved through transformers
    assert model.config.dtype == "float32"  # the live model's config is left as it was


def test_copy_tokenizer_files_follows_cache_links(hub, tmp_path):
    snapshot = resolve_model_path("org/tiny")
    copied = copy_tokenizer_files(snapshot, tmp_path)
    assert sorted(p.name for p in copied) == ["tokenizer.json", "tokenizer_config.json"]
    assert all(not p.is_symlink() for p in copied)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["my_custom_field"] == {"keep": [1, 2, 3]}


def test_attn_implementation_reaches_transformers(tiny_model_dir):
    assert load_causal_lm(tiny_model_dir, attn_implementation="eager").config._attn_implementation == "eager"
    assert load_causal_lm(tiny_model_dir).config._attn_implementation == "sdpa"  # transformers' own choice
