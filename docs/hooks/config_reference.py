"""mkdocs hook: the configuration reference and the "coming from TRL / verl / OpenRLHF" key table, generated
from the schema (gyre.config.reference) and the alias table (gyre.config.aliases) at every build, so the
pages cannot go stale. One page per top-level section of gyre train's config, one for gyre sft's and one
for gyre dpo's; the nav entry "Configuration reference" lists them."""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's gyre, not whichever one is installed

from mkdocs.structure.files import File  # noqa: E402

from gyre.config import aliases  # noqa: E402
from gyre.config.reference import NAME, FieldDoc, field_docs, find, schema_for  # noqa: E402

REFERENCE = "reference/config"
NAV_TITLE = "Configuration reference"
ALIAS_MARKER = "<!-- generated: alias table -->"
REPORT_MARKER = "<!-- generated: run report screenshot -->"
REPORT_IMAGE = "report.png"
"""A screenshot of a run report, written by the report's browser test; the page shows it when it exists."""
STANDALONE = {"sft": "gyre sft", "dpo": "gyre dpo"}


@functools.cache
def _docs(pipeline: str) -> list[FieldDoc]:
    return field_docs(schema_for(pipeline))


def sections() -> list[str]:
    """The top-level sections of gyre train's config, each a page (``pipeline`` is not a section)."""
    return [name for name in schema_for("rlvr").model_fields if name != "pipeline"]


def page_of(path: str, pipeline: str = "rlvr") -> str:
    """The reference page (relative to docs/) that documents the key at dotted ``path``."""
    if pipeline in STANDALONE:
        return f"{REFERENCE}/{pipeline}.md"
    return f"{REFERENCE}/{path.split('.')[0]}.md"


def anchor(path: str) -> str:
    """The HTML id of a key's heading: reward.domains.<name>.type -> reward-domains-name-type."""
    return re.sub(r"[^A-Za-z0-9_]+", "-", path).strip("-")


def _escape(text: str) -> str:
    """Docstrings are Markdown with ``code``; a bare < (lo <= x, <name>) must not open an HTML tag."""
    parts = re.split(r"(``?[^`]+``?)", text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;") for p in parts)


def _field_block(doc: FieldDoc, depth: int) -> str:
    facts = [f"**type** `{doc.type}`", f"**default** `{doc.default}`"]
    if doc.choices and doc.type != " | ".join(doc.choices):
        facts.append("**allowed** " + ", ".join(f"`{c}`" for c in doc.choices))
    level = "#" * min(2 + depth, 4)
    body = _escape(" ".join(doc.doc.split()))
    return f"{level} `{doc.path}` {{#{anchor(doc.path)}}}\n\n{' · '.join(facts)}\n\n{body}\n"


def section_page(name: str, pipeline: str = "rlvr") -> str:
    """One section's page: its docstring, then every key under it, nested sections in place."""
    docs = _docs(pipeline)
    if pipeline in STANDALONE:
        root = schema_for(pipeline)
        title = f"`{STANDALONE[pipeline]}` config"
        intro = (f"{root.__doc__.strip()}\n\nEvery key of a `{STANDALONE[pipeline]}` config (`pipeline: {pipeline}`); "
                 f"`gyre config --describe KEY --pipeline {pipeline}` prints one.")
        keys = docs
    else:
        head = find(docs, name)
        title = f"`{name}`"
        intro = (f"{_escape(head.doc)}\n\n**type** `{head.type}` · **default** `{head.default}`. "
                 f"`gyre config --describe {name}` prints this section's keys; `gyre config --describe "
                 f"{name}.KEY` one of them.")
        keys = [d for d in docs if d.path.startswith(name + ".")]
    if name == "reward":
        intro += (f"\n\n!!! note \"One domain or several\"\n    A run with one reward domain writes its keys "
                  f"directly under `reward` (`reward.type: math`): that is the domain named `default`. With several "
                  f"domains each key is written `reward.domains.{NAME}.KEY` as listed here; see "
                  f"[multi-domain training](../../guides/multi-domain.md).")
    base = 0 if pipeline in STANDALONE else 1
    blocks = [_field_block(d, d.path.count(".") - base) for d in keys]
    return (f"# {title}\n\n<!-- generated from the schema by docs/hooks/config_reference.py: edit the docstrings "
            f"in gyre/config/, not this page -->\n\n{intro}\n\n" + "\n".join(blocks))


def index_page() -> str:
    rows = [f"| [`{s}`]({s}.md) | {_escape(find(_docs('rlvr'), s).doc.split(chr(10))[0])} |"
            for s in sections()]
    return ("# Configuration reference\n\nGenerated from the schema at every build: each key's dotted path, type, "
            "default, allowed values and docstring. A run is one YAML file plus `key.path=value` overrides; the "
            "schema is strict, so a misspelt key (or another framework's name for it) is an error naming the key "
            "to write. On the command line, `gyre config --describe KEY` prints the same entry.\n\n"
            "## `gyre train` (`pipeline: rlvr`)\n\n| section | what it holds |\n|---|---|\n" + "\n".join(rows) +
            "\n\n## Standalone trainers\n\n- [`gyre sft` config](sft.md) (`pipeline: sft`)\n"
            "- [`gyre dpo` config](dpo.md) (`pipeline: dpo`)\n")


def generated_pages() -> dict[str, str]:
    pages = {f"{REFERENCE}/index.md": index_page()}
    pages.update({page_of(s): section_page(s) for s in sections()})
    pages.update({page_of("", p): section_page(p, p) for p in STANDALONE})
    return pages


def alias_table() -> str:
    """Other frameworks' keys and gyre's, one table per framework, each gyre key linked to its reference."""
    rows: dict[str, list[str]] = {}
    entries = [(name, a, "rlvr") for table in (aliases.BY_PATH, aliases.BY_NAME) for name, a in table.items()]
    entries += [(name, a, p) for p, table in aliases.BY_PIPELINE.items() for name, a in table.items()]
    for name, alias, pipeline in entries:
        where = f" (in `{STANDALONE[pipeline]}`)" if pipeline in STANDALONE else ""
        note = alias.note or ("moved: the old key still loads, with a notice" if alias.moved else "")
        row = f"| `{name}`{where} | {_gyre_key(alias.key, pipeline)} | {_escape(note)} |"
        for origin in alias.origin.split(", "):
            rows.setdefault(origin, []).append(row)
    out = []
    first = ["TRL", "verl", "OpenRLHF", "ROLL"]
    for origin in sorted(rows, key=lambda o: (first.index(o) if o in first else len(first), o)):
        out.append(f"### {origin}\n\n| their key | gyre's key | how it differs |\n|---|---|---|\n" +
                   "\n".join(sorted(rows[origin], key=str.lower)) + "\n")
    return "\n".join(out)


def _gyre_key(key: str, pipeline: str) -> str:
    head = key.split(".")[0]
    pipeline = head if head in STANDALONE else pipeline  # TRL's SFTConfig names point into gyre sft's keys
    doc = find(_docs(pipeline), key)
    if doc is None:
        return f"`{key}`"
    # links are relative to guides/coming-from.md
    return f"[`{key}`](../{page_of(doc.path, pipeline)}#{anchor(doc.path)})"


# ---- mkdocs events ---------------------------------------------------------------------------------------


def on_config(config):
    """Fill the nav entry "Configuration reference" with the generated pages."""
    pages = list(generated_pages())
    entry = [{"Overview": pages[0]}, *[{p.rsplit("/", 1)[1].removesuffix(".md"): p} for p in pages[1:]]]
    for i, item in enumerate(config.nav or []):
        if isinstance(item, dict) and NAV_TITLE in item:
            config.nav[i] = {NAV_TITLE: entry}
    return config


def on_files(files, config):
    for src_uri, content in generated_pages().items():
        files.append(File.generated(config, src_uri, content=content))
    return files


def on_page_markdown(markdown, page, config, files):
    markdown = markdown.replace(ALIAS_MARKER, alias_table()) if ALIAS_MARKER in markdown else markdown
    if REPORT_MARKER in markdown:
        # Only a link to an image that exists: a strict build fails on a missing one.
        there = (Path(config.docs_dir) / REPORT_IMAGE).is_file()
        depth = page.file.src_uri.count("/")
        shown = f"![A run report]({'../' * depth}{REPORT_IMAGE})" if there else ""
        markdown = markdown.replace(REPORT_MARKER, shown)
    return markdown
