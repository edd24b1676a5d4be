"""Start-up checks of code domains: the sandbox's layers are reported, a remote sandbox must answer, and
assert tests that cannot be compared outside the sandbox are counted."""

from __future__ import annotations

import json

import pytest

from gyre.app.preflight import check_code_sandboxes
from gyre.config import load_config
from gyre.rewards.sandbox import SandboxUnavailable, sandbox_capabilities
from gyre.types import PromptRecord

BASE = ["model.path=m", "data.train_files=[t]"]


def record(uid: str, asserts: list[str]) -> PromptRecord:
    return PromptRecord(uid, "p", [1], json.dumps({"asserts": asserts}), domain="default")


def test_code_domain_reports_the_layers_and_counts_unsplittable_asserts():
    if sandbox_capabilities()["mode"] == "weak":
        pytest.skip("no kernel containment here")
    cfg = load_config(None, [*BASE, "reward.type=code"])
    lines: list[str] = []
    rows = [record("a:1", ["assert f(1) == 2", "assert all(f(i) > 0 for i in range(3))"]), record("a:2", ["x = 1"])]
    check_code_sandboxes(cfg, rows, lines.append)
    assert any("PID, mount, network, IPC and UTS namespaces" in line for line in lines), lines
    assert any("2 of 3 assert tests cannot be compared outside the sandbox (e.g. a:1:" in line for line in lines), lines


def test_a_remote_sandbox_that_does_not_answer_is_refused():
    cfg = load_config(None, [*BASE, "reward.type=code", "reward.sandbox.url=http://127.0.0.1:1"])
    with pytest.raises(SandboxUnavailable, match="does not answer.*gyre sandbox-serve"):
        check_code_sandboxes(cfg, [], print)


def test_other_domains_are_not_checked():
    cfg = load_config(None, [*BASE, "reward.type=math"])
    lines: list[str] = []
    check_code_sandboxes(cfg, [], lines.append)
    assert lines == []
