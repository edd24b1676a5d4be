"""gyre export: a run's checkpoints as Hugging Face directories (consolidated, in the dtype asked for)."""

import json
import os

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from gyre.pipelines.export import ExportError, ExportSpec, export_model, loadable_model, read_policy_weights
from gyre.pipelines.model_source import resolve_source


def weights(directory):
    return load_file(str(directory / "model.safetensors"))


def test_the_last_checkpoint_exports_to_the_runs_final_model(trained_run, tiny_model_dir, tmp_path):
    """The run saved step 2 both as a checkpoint and as its final model: the export equals the final model,
    with the run's model's config and its tokenizer files unchanged."""
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


def _fsdp_worker(rank, model_dir, port, directory):
    """Two FSDP2 ranks save a trained checkpoint (each its shard); rank 0 records the full weights."""
    import torch.distributed as dist

    from gyre.config.schema import OptimizerConfig, SchedulerConfig
    from gyre.engines.trainer import TrainerBackend, TrainerSpec

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    backend = TrainerBackend(TrainerSpec(str(model_dir), strategy="fsdp2"), torch.device("cpu"))
    backend.setup()
    backend.configure_optimizer(OptimizerConfig(lr=0.1), SchedulerConfig(), 1, None)
    with torch.no_grad():  # move every weight off the initial model, differently per tensor
        for i, p in enumerate(backend.model.parameters()):
            p.add_(0.01 * (i + 1))
    backend.save(directory)
    full = backend.full_state_dict()
    if rank == 0:
        torch.save(full, f"{directory}/full.pt")
    dist.destroy_process_group()
    os._exit(0)  # see tests/engines/test_trainer.py: FSDP2 over gloo may abort at interpreter exit


def test_sharded_fsdp2_checkpoints_are_consolidated(tiny_model_dir, tmp_path):
    from tests.engines.test_trainer import _free_port

    directory = tmp_path / "policy"
    mp.spawn(_fsdp_worker, args=(tiny_model_dir, _free_port(), str(directory)), nprocs=2, join=True)
    assert len(list(directory.glob("*.distcp"))) == 2  # one shard file per rank
    full = torch.load(directory / "full.pt")
    read = read_policy_weights(directory)
    assert read.keys() == full.keys()
    for name, tensor in full.items():
        assert torch.equal(read[name], tensor), name
