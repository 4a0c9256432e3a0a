"""mkdocs hooks: build the parts of the site that depend on which designs exist at build time.

* The ``RFC > Designs`` nav section lists every ``rfc/designs/*.md`` (designs in registry order first, then any
  other page alphabetically), so a new design page appears without editing ``mkdocs.yml``.
* A nav entry may name a section of a page (``Comparison: rfc/index.md#comparison``); mkdocs only links whole
  pages from the nav, so the entry becomes a link to that page's URL plus the anchor.
* ``docs/api.md`` gets one mkdocstrings block (``::: prototypes.<name>``) per module registered in
  ``prototypes._DESIGN_MODULES``, read from ``prototypes/__init__.py`` without importing torch or Lightning.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "prototypes" / "__init__.py"
DESIGN_PAGES = ROOT / "rfc" / "designs"
API_PLACEHOLDER = "<!-- API: design modules -->"
SECTION_ENTRY_RE = re.compile(r"^(?P<page>[^:#]+\.md)#(?P<anchor>[\w-]+)$")

log = logging.getLogger("mkdocs.hooks.designs")


def registered_modules() -> list[str]:
    """The modules named in ``_DESIGN_MODULES`` of ``prototypes/__init__.py``, in registry order."""
    tree = ast.parse(REGISTRY.read_text(encoding="utf-8"), filename=str(REGISTRY))
    for node in tree.body:
        assigned = [node.target] if isinstance(node, ast.AnnAssign) else []
        targets = node.targets if isinstance(node, ast.Assign) else assigned
        if any(isinstance(t, ast.Name) and t.id == "_DESIGN_MODULES" for t in targets) and node.value is not None:
            return [str(m) for m in ast.literal_eval(node.value)]
    raise RuntimeError(f"{REGISTRY}: no _DESIGN_MODULES tuple found; docs/hooks.py reads the registry from it")


def design_pages() -> list[dict[str, str]]:
    """``{name: "rfc/designs/<name>.md"}`` nav entries (paths relative to docs/), registered designs first."""
    if not DESIGN_PAGES.is_dir():
        return []
    pages = {p.stem: p for p in DESIGN_PAGES.glob("*.md")}
    order = [m.rsplit(".", 1)[-1] for m in registered_modules()]
    names = [n for n in order if n in pages] + sorted(n for n in pages if n not in order)
    return [{n: f"rfc/designs/{pages[n].name}"} for n in names]


def _fill_designs(nav: list[Any]) -> bool:
    for index, entry in enumerate(nav):
        if not isinstance(entry, dict):
            continue
        for title, value in entry.items():
            if title == "Designs" and isinstance(value, list) and not value:
                pages = design_pages()
                if pages:
                    entry[title] = pages
                else:
                    log.info("no rfc/designs/*.md yet: the Designs nav section is left out")
                    del nav[index]
                return True
            if isinstance(value, list) and _fill_designs(value):
                return True
    return False


def _mark_section_entries(nav: list[Any], found: dict[str, re.Match[str]]) -> None:
    """Turn ``page.md#anchor`` entries into ``/page.md#anchor``: mkdocs leaves an absolute path alone (a page path
    with an anchor would be a "not found" warning), and ``on_nav`` makes it the page's URL."""
    for entry in nav:
        for title, value in (entry.items() if isinstance(entry, dict) else []):
            if isinstance(value, list):
                _mark_section_entries(value, found)
            elif isinstance(value, str) and (m := SECTION_ENTRY_RE.match(value)):
                entry[title] = "/" + value
                found["/" + value] = m


def on_config(config, **kwargs):
    if config.nav and not _fill_designs(config.nav):
        log.warning("mkdocs.yml nav has no empty 'Designs: []' section for docs/hooks.py to fill")
    config["section_entries"] = {}
    if config.nav:
        _mark_section_entries(config.nav, config["section_entries"])
    return config


def on_nav(nav, config, files, **kwargs):
    def visit(items):
        for item in items:
            if item.is_section:
                visit(item.children)
            elif item.is_link and item.url in config["section_entries"]:
                m = config["section_entries"][item.url]
                page = files.get_file_from_path(m["page"])
                if page is None:
                    log.warning("mkdocs.yml nav names a section of %s, which is not a page of the site", m["page"])
                    continue
                item.url = f"{page.url}#{m['anchor']}"

    visit(nav.items)
    return nav


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    if page.file.src_uri != "api.md":
        return markdown
    if API_PLACEHOLDER not in markdown:
        log.warning("docs/api.md lost its placeholder %r", API_PLACEHOLDER)
        return markdown
    blocks = []
    for module in registered_modules():
        path = ROOT / module.replace(".", "/")
        if not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()):
            log.warning("registered design module %s has no file (neither %s.py nor a package)", module, path.name)
            continue
        blocks.append(f"::: {module}\n    options:\n      heading_level: 3\n")
    return markdown.replace(API_PLACEHOLDER, "\n".join(blocks))
