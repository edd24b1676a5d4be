"""The GPU smoke check's kit (bench/gpusmoke/kit.py) and checks that need no GPU: stripping a wheel, the size limit,
unpacking only what a box lacks, finding the tests CI skips, the pre-flight comparison, and one section run
the way ``make gpu-smoke`` runs it. Nothing is downloaded: wheels here are made up."""

from __future__ import annotations

import importlib
import json
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "bench"))  # appended: bench/'s scripts never shadow an installed module
kit = importlib.import_module("gpusmoke.kit")
checks = importlib.import_module("gpusmoke.checks")


def wheel(path: Path, name: str, version: str, files: dict[str, bytes], requires=(), modes=None) -> Path:
    """A minimal wheel: ``files`` plus METADATA (with ``requires``) and a RECORD listing every file."""
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    members = {**files, f"{info}/METADATA": meta.encode()}
    record = "".join(f"{n},,\n" for n in members) + f"{info}/RECORD,,\n"
    out = path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for member, data in {**members, f"{info}/RECORD": record.encode()}.items():
            zi = zipfile.ZipInfo(member)
            zi.external_attr = ((modes or {}).get(member, 0o644) | stat.S_IFREG) << 16
            z.writestr(zi, data)
    return out


def test_stripping_a_wheel_drops_the_members_and_their_record_lines(tmp_path):
    src = wheel(tmp_path, "ray", "1.0", {"ray/__init__.py": b"x", "ray/jars/big.jar": b"j" * 1000,
                                         "ray/rllib/algo.py": b"r", "ray/dashboard/client/build/js/main.js.map": b"m",
                                         "ray/dashboard/client/build/js/main.js": b"js"})
    (tmp_path / "out").mkdir()
    dst = tmp_path / "out" / src.name
    report = kit.strip_wheel(src, dst, kit.STRIP["ray"])
    with zipfile.ZipFile(dst) as z:
        names = set(z.namelist())
        record = z.read("ray-1.0.dist-info/RECORD").decode()
    assert report["dropped_files"] == 3 and report["kept_files"] == len(names)
    assert {"ray/__init__.py", "ray/dashboard/client/build/js/main.js"} <= names
    assert not any("jars" in n or "rllib" in n or n.endswith(".map") for n in names)
    assert "jars" not in record and "rllib" not in record and "ray/__init__.py" in record


def test_the_size_check_counts_the_checkout_too():
    mib = 2**20
    assert kit.size_problem(50 * mib, 4 * mib) is None
    problem = kit.size_problem(62 * mib, 4 * mib)
    assert problem and "66.0 MiB" in problem and "64 MiB" in problem


def test_unpack_installs_the_roots_and_what_the_box_lacks_and_keeps_the_rest(tmp_path, monkeypatch):
    box = tmp_path / "kit" / "wheels"
    box.mkdir(parents=True)
    root = wheel(box, "gyrefakeroot", "1.0", {"gyrefakeroot/__init__.py": b"", "gyrefakeroot/raylet": b"#!"},
                 requires=["packaging>=1", "gyrefakedep", "neverthere; extra == 'x'"],
                 modes={"gyrefakeroot/raylet": 0o755})
    dep = wheel(box, "gyrefakedep", "2.0", {"gyrefakedep.py": b"", "gyrefakedep-2.0.data/purelib/extra.py": b"",
                                             "gyrefakedep-2.0.data/scripts/tool": b""})
    pkg = wheel(box, "packaging", "0.1", {"packaging/__init__.py": b""})  # this environment's is newer: kept
    entries = [{"name": "gyrefakeroot", "version": "1.0", "file": root.name, "root": True},
               {"name": "gyrefakedep", "version": "2.0", "file": dep.name, "root": False},
               {"name": "packaging", "version": "0.1", "file": pkg.name, "root": False}]
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    (tmp_path / "kit" / "kit.json").write_text(json.dumps({"python": here, "wheels": entries}))
    monkeypatch.setattr(kit, "ROOTS", ("gyrefakeroot",))
    site = kit.unpack(tmp_path / "kit", tmp_path / "site")
    installed = json.loads((site / "gyre-kit-install.json").read_text())
    assert installed == {"from_kit": ["gyrefakeroot==1.0", "gyrefakedep==2.0"], "from_box": ["packaging"]}
    assert (site / "gyrefakedep.py").is_file() and (site / "extra.py").is_file() and not (site / "tool").exists()
    assert (site / "gyrefakeroot" / "raylet").stat().st_mode & 0o111  # programs stay executable
    assert kit.unpack(tmp_path / "kit", tmp_path / "site") == site  # unchanged kit: nothing redone
    (tmp_path / "kit" / "kit.json").write_text(json.dumps({"python": "2.7", "wheels": entries}))
    with pytest.raises(SystemExit, match="built for Python 2.7"):
        kit.unpack(tmp_path / "kit", tmp_path / "site")


def test_a_member_outside_the_site_is_refused(tmp_path):
    bad = wheel(tmp_path, "evil", "1.0", {"../escape.py": b""})
    with pytest.raises(ValueError, match="outside"):
        kit._extract(bad, tmp_path / "site")


def test_the_tests_ci_skips_for_want_of_a_gpu_are_found():
    ids = checks.gpu_test_ids(ROOT)
    assert "tests/engines/test_trainer.py::test_offload_frees_the_gpu_and_training_resumes" in ids
    assert "tests/engines/test_trainer.py::test_two_ranks_give_the_single_rank_gradient" in ids  # a marked param
    assert "tests/pipelines/test_rlvr_integration.py::test_colocated_gpu_run_with_offload" in ids
    assert not any("test_flash_attention_needs_cuda" in i for i in ids)  # names CUDA, needs none


def test_the_preflight_section_sets_estimates_against_measured_peaks(tmp_path):
    from gpusmoke.common import QWEN2_TINY, Ctx

    (tmp_path / "mid").mkdir()
    (tmp_path / "mid" / "config.json").write_text(json.dumps(
        {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
         "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True}))
    (tmp_path / "qwen2.json").write_text(json.dumps(QWEN2_TINY | {"num_attention_heads": 4}))
    prior = {"offload": {"result": {"workload": {"rows": 4, "prompt_tokens": 512, "response_tokens": 512},
                                    "ddp": {"peak_gib": 12.0}, "fsdp2": {"peak_gib": 13.0}}},
             "engine_7b": {"result": {"shape": "tiny", "workload": {"prompt_tokens": 8, "new_tokens": 8,
                                                                    "batches": [2]}, "batch 2": {"peak_gib": None}}}}
    out = checks.preflight(Ctx(gpu=False, work=tmp_path, root=ROOT, prior=prior))
    ddp = out["trainer step (ddp, one rank)"]
    assert ddp["estimate_over_measured"] == pytest.approx(ddp["estimate_gib"] / 12.0, rel=1e-2)
    assert set(ddp["terms_gib"]) == {"weights", "gradients", "optimizer", "activations", "logits"}
    assert "estimate_over_measured" not in out["engine, batch 2"] and "KV cache" in out["engine, batch 2"]["terms_gib"]


@pytest.mark.slow  # ~18 s; CI's bench-smoke runs the whole smallest run (bench/gpu_smoke.py --smoke) anyway
def test_a_section_runs_in_a_process_of_its_own_into_one_summary(tmp_path):
    """What ``make gpu-smoke`` runs, here without CUDA: prepare (the tiny model) and the transport section."""
    out = tmp_path / "smoke.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_smoke.py"), "--smoke", "--sections",
                           "transport", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert list(summary["sections"]) == ["prepare", "transport"] and summary["size"] == "cpu"
    gloo = summary["sections"]["transport"]["result"]["gloo"]
    assert gloo["ok"] and gloo["second"]["exact"] and gloo["second"]["errors"] == []
    assert "| d | transport | ok |" in out.with_suffix(".md").read_text()
