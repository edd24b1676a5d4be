"""The docs site builds in strict mode (a broken link or anchor fails), and its configuration reference and
key table are generated from the code: a page for every config section, an entry for every key."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.fail("the docs need mkdocs and mkdocs-material: pip install -e .[docs]")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + result.stdout + result.stderr
    return out


def _hook():
    spec = importlib.util.spec_from_file_location("config_reference_hook", ROOT / "docs/hooks/config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_config_section_has_a_generated_reference_page(site):
    from gyre.config.reference import field_docs, schema_for

    pages = site / "reference" / "config"
    sections = [name for name in schema_for("rlvr").model_fields if name != "pipeline"]
    assert sorted(p.stem for p in pages.glob("*.html")) == sorted([*sections, "index", "sft", "dpo"])
    hook = _hook()
    for pipeline in ("rlvr", "sft", "dpo"):
        for doc in field_docs(schema_for(pipeline)):
            if pipeline == "rlvr" and "." not in doc.path:
                continue  # a section: its page is the section's own
            html = (site / hook.page_of(doc.path, pipeline).replace(".md", ".html")).read_text()
            assert f'id="{hook.anchor(doc.path)}"' in html, f"{pipeline}: no entry for {doc.path}"
    rollout = (pages / "rollout.html").read_text()
    assert "alpha of ROLL Flash" in rollout and "<code>window | lockstep</code>" in rollout


def test_the_foreign_key_table_is_generated_from_the_aliases(site):
    from gyre.config.aliases import BY_NAME, BY_PATH

    html = (site / "guides" / "coming-from.html").read_text()
    for name in [*BY_NAME, *BY_PATH]:
        assert f"<code>{name}</code>" in html, name
    assert 'href="../reference/config/rollout.html#rollout-samples_per_prompt"' in html


def test_the_site_needs_no_network(site):
    """No fonts, scripts or maths from a CDN: the built pages load nothing from another host."""
    for page in site.rglob("*.html"):
        text = page.read_text()
        for host in ("fonts.googleapis.com", "cdn.jsdelivr.net", "unpkg.com", "polyfill.io", "mathjax"):
            assert host not in text.lower(), f"{page.relative_to(site)} loads {host}"
