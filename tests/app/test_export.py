"""gyre export: a run's checkpoints as Hugging Face directories (consolidated, in the dtype asked for)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from gyre.app.export import ExportError, ExportSpec, export_model, loadable_model
from gyre.app.model_source import resolve_source


def weights(directory):
    return load_file(str(directory / "model.safetensors"))


def test_the_last_checkpoint_exports_to_the_runs_final_model(trained_run, tiny_model_dir, tmp_path):
    """The run saved step 2 both as a checkpoint (sharded by its two FSDP2 ranks) and as its final model: the
    export equals the final model, with the run's model's config and its tokenizer files unchanged."""
    assert len(list((trained_run / "checkpoints" / "step_000002" / "policy").glob("*.distcp"))) == 2
    out = export_model(resolve_source(str(trained_run), step=2), ExportSpec(tmp_path / "step2"), echo=lambda s: None)
    exported, final = weights(out), weights(trained_run / "final_model")
    assert exported.keys() == final.keys()
    assert all(torch.equal(exported[k], final[k]) for k in final)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"  # the run's model is float32
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    # Step 1 is another set of weights; bfloat16 when asked for, said so in config.json.
    one = export_model(resolve_source(str(trained_run), step=1), ExportSpec(tmp_path / "step1", "bfloat16"),
                       echo=lambda s: None)
    step1 = weights(one)
    assert {t.dtype for t in step1.values()} == {torch.bfloat16}
    assert json.loads((one / "config.json").read_text())["dtype"] == "bfloat16"
    assert any(not torch.equal(step1[k], final[k].to(torch.bfloat16)) for k in final)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(one).config.vocab_size > 0


def test_an_existing_directory_is_replaced_only_when_asked_and_only_if_it_is_a_model(trained_run, tmp_path):
    source = resolve_source(str(trained_run), step=1)
    quiet = lambda s: None  # noqa: E731
    target = export_model(source, ExportSpec(tmp_path / "out"), echo=quiet)
    before = (target / "model.safetensors").stat().st_mtime_ns
    with pytest.raises(ExportError, match="already exists and is not empty; add --overwrite"):
        export_model(source, ExportSpec(target), echo=quiet)
    assert (target / "model.safetensors").stat().st_mtime_ns == before
    export_model(resolve_source(str(trained_run), step=2), ExportSpec(target, overwrite=True), echo=quiet)
    assert all(torch.equal(a, b) for a, b in zip(weights(target).values(), weights(trained_run / "final_model")
                                                  .values()))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    with pytest.raises(ExportError, match="holds files but no model"):
        export_model(source, ExportSpec(notes, overwrite=True), echo=quiet)
    assert (notes / "todo.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ExportError, match="is a file"):
        export_model(source, ExportSpec(tmp_path / "file"), echo=quiet)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "notes", "out"]  # no staging left behind


def test_a_checkpoint_becomes_a_temporary_model_for_eval(trained_run):
    source = resolve_source(str(trained_run), step=1)
    with loadable_model(source) as directory:
        assert directory.parent == trained_run and (directory / "config.json").is_file()
    assert not directory.exists()


MODELING = '''from transformers import LlamaConfig, LlamaForCausalLM


class WalkConfig(LlamaConfig):
    model_type = "walk_llama"


class WalkForCausalLM(LlamaForCausalLM):
    config_class = WalkConfig
'''


@pytest.fixture
def remote_code_model(tiny_model_dir, tmp_path, monkeypatch):
    """The tiny model as an architecture of its own code (auto_map), the way custom Hub models ship; transformers
    copies such code into its modules cache, here a temporary one."""
    import shutil

    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    model = shutil.copytree(tiny_model_dir, tmp_path / "walk_model")
    (model / "modeling_walk.py").write_text(MODELING)
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="walk_llama", auto_map={"AutoConfig": "modeling_walk.WalkConfig",
                                                     "AutoModelForCausalLM": "modeling_walk.WalkForCausalLM"})
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_a_model_of_its_own_code_exports_only_with_trust_remote_code(remote_code_model, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from gyre.app.cli import main

    out = tmp_path / "exported"
    assert main(["export", str(remote_code_model), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "its own code (modeling_walk.py, named by auto_map" in err and "add --trust-remote-code" in err
    assert not out.exists()
    assert main(["export", str(remote_code_model), "--out", str(out), "--trust-remote-code",
                 "--dtype", "bfloat16"]) == 0
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)  # its code was saved beside it
    assert type(model).__name__ == "WalkForCausalLM" and model.dtype == torch.bfloat16
    source, exported = weights(remote_code_model), weights(out)
    assert source.keys() == exported.keys()
    assert all(torch.equal(source[k].to(torch.bfloat16), exported[k]) for k in source)
