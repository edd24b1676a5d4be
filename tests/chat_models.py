"""Tiny models with a chat template, as instruct models have (the preset tokenizer has none)."""

from __future__ import annotations

import shutil
from pathlib import Path


def with_chat_template(source: Path, target: Path, template: str) -> Path:
    """A copy of the model directory ``source`` at ``target`` whose tokenizer files carry ``template``."""
    from gyre.models.loading import load_tokenizer

    shutil.copytree(source, target)
    tokenizer = load_tokenizer(target)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(target)
    return target
