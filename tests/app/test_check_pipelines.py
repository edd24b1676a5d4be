"""gyre check reads every pipeline's config (the shipped SFT and DPO examples too); init-model gives chat
data a template; outputs that cannot be written end in one paragraph (exit 2), not a traceback."""

import json
import os
from pathlib import Path

import pytest

from gyre.app.cli import main
from gyre.models.presets import init_model

ROOT = Path(__file__).resolve().parents[2]
CHAT = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return init_model("tiny", tmp_path_factory.mktemp("models") / "chat", chat_template=True)


def test_check_accepts_the_shipped_sft_and_dpo_examples(chat_model, tmp_path, capsys):
    chats, prefs = tmp_path / "chats.jsonl", tmp_path / "prefs.jsonl"
    chats.write_text("".join(json.dumps({"messages": CHAT}) + "\n" for _ in range(4)))
    prefs.write_text("".join(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n" for _ in range(4)))
    for example, section, data in (("sft_chat.yaml", "sft", chats), ("dpo_preferences.yaml", "dpo", prefs)):
        code = main(["check", str(ROOT / "examples" / example), f"model.path={chat_model}", "model.dtype=float32",
                     f"{section}.train_files=[{data}]", "policy.devices=[0]", "policy.strategy=ddp"])
        out, err = capsys.readouterr()
        assert code == 0, err[-2000:]
        assert f"pipeline: {section}" in out and "placement: policy on" in out
        assert ("data: 4 examples" if section == "sft" else "data: 4 preference pairs") in out
    # gyre train names the command that runs such a config instead of refusing its keys.
    assert main(["train", str(ROOT / "examples" / "sft_chat.yaml"), f"model.path={chat_model}"]) == 2
    assert "run it with gyre sft CONFIG" in capsys.readouterr().err


def test_init_model_gives_a_chat_template_and_keeps_existing_files(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["init-model", "--out", str(out)]) == 0
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.apply_chat_template(CHAT, tokenize=False) == "user: 1+1=\nassistant: 2</s>\n"
    assert main(["init-model", "--out", str(out)]) == 2  # a second run would overwrite the model
    assert "already holds files" in capsys.readouterr().err
    assert main(["init-model", "--out", str(out), "--overwrite", "--no-chat-template"]) == 0
    assert not AutoTokenizer.from_pretrained(out).chat_template


def test_an_output_path_that_cannot_be_written_is_a_paragraph(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["init-model", "--out", str(tmp_path / "file" / "m")]) == 2
    err = capsys.readouterr().err
    assert "Not a directory; a file stands where a directory is needed" in err and "Traceback" not in err
    if os.geteuid() != 0:  # root writes anywhere: a read-only directory only stops other users
        (tmp_path / "ro").mkdir(mode=0o500)
        assert main(["init-model", "--out", str(tmp_path / "ro" / "m")]) == 2
        assert "may not write there" in capsys.readouterr().err


def test_write_failures_by_errno():
    import errno

    from gyre.app.oserrors import write_failure

    full = OSError(errno.ENOSPC, "No space left on device", "/runs/x/metrics.jsonl")
    assert write_failure(full) == ("cannot write /runs/x/metrics.jsonl: No space left on device; the disk is full: "
                                   "free space there, or choose an output directory on another disk.")
    assert "read-only" in write_failure(OSError(errno.EROFS, "Read-only file system", "/x"))
    assert write_failure(ConnectionResetError(errno.ECONNRESET, "reset")) is None  # not the user's path


def test_validation_runs_by_default_when_held_out_prompts_are_given():
    from gyre.config import load_config

    base = ["model.path=m", "data.train_files=[t.jsonl]", "run.steps=25"]
    assert load_config(None, base + ["data.val_files=[v.jsonl]"]).validation.every == 3
    assert load_config(None, base).validation.every == 0
    assert load_config(None, base + ["data.val_files=[v.jsonl]", "validation.every=0"]).validation.every == 0
