"""mkdocs hooks: build the parts of the site that depend on which designs exist at build time.

* The ``RFC > Designs`` nav section must list every ``rfc/designs/*.md`` (designs in registry order first, then any
  other page alphabetically). Zensical runs no hooks, so ``mkdocs.yml`` lists the pages itself; a page it does not
  list (a new design's) still appears under MkDocs, with a warning that fails ``mkdocs build --strict`` and names the
  line to add.
* A nav entry may name a section of a page by its URL (``Decisions: rfc/#decisions``), which Zensical resolves
  itself; MkDocs only links whole pages from the nav (a URL is a "not found" warning), so the entry becomes a link to
  that page's URL plus the anchor.
* ``docs/api.md`` gets one mkdocstrings block (``::: prototypes.<name>``) per module registered in
  ``prototypes._DESIGN_MODULES``, read from ``prototypes/__init__.py`` without importing torch or Lightning. Zensical
  has no equivalent (no hooks; a Markdown extension would have to be an installed module), so its API page leaves
  the design modules out; ``tests/test_site.py`` records that gap.
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
SECTION_ENTRY_RE = re.compile(r"^(?P<url>[^:#]+/)#(?P<anchor>[\w-]+)$")

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


def _designs_section(nav: list[Any]) -> tuple[list[Any], int] | None:
    """Where the ``Designs`` section is, at any depth: the list that holds it and its index there; or None."""
    for index, entry in enumerate(nav):
        for title, value in (entry.items() if isinstance(entry, dict) else []):
            if title == "Designs" and isinstance(value, list):
                return nav, index
            if isinstance(value, list) and (found := _designs_section(value)):
                return found
    return None


def _check_designs(nav: list[Any]) -> None:
    """Warn unless the Designs section lists the design pages (Zensical's nav is what it lists), then show them."""
    found = _designs_section(nav)
    if found is None:
        log.warning("mkdocs.yml nav has no 'Designs' section for the rfc/designs/*.md pages")
        return
    parent, index = found
    pages = design_pages()
    if parent[index]["Designs"] != pages:
        lines = "".join(f"\n          - {name}: {path}" for page in pages for name, path in page.items())
        log.warning("mkdocs.yml's Designs section does not list rfc/designs/*.md in registry order; Zensical runs no "
                    "hooks, so its nav shows what mkdocs.yml lists. Write it as:\n      - Designs:%s", lines)
    if pages:
        parent[index]["Designs"] = pages
    else:
        log.info("no rfc/designs/*.md yet: the Designs nav section is left out")
        del parent[index]


def _mark_section_entries(nav: list[Any], found: dict[str, re.Match[str]]) -> None:
    """Turn ``url/#anchor`` entries into ``/url/#anchor``: mkdocs leaves an absolute path alone (a relative URL
    would be a "not found" warning), and ``on_nav`` makes it the page's URL."""
    for entry in nav:
        for title, value in (entry.items() if isinstance(entry, dict) else []):
            if isinstance(value, list):
                _mark_section_entries(value, found)
            elif isinstance(value, str) and (m := SECTION_ENTRY_RE.match(value)):
                entry[title] = "/" + value
                found["/" + value] = m


def on_config(config, **kwargs):
    config["section_entries"] = {}
    if config.nav:
        _check_designs(config.nav)
        _mark_section_entries(config.nav, config["section_entries"])
    return config


def on_nav(nav, config, files, **kwargs):
    page_urls = {file.url for file in files.documentation_pages()}

    def visit(items):
        for item in items:
            if item.is_section:
                visit(item.children)
            elif item.is_link and item.url in config["section_entries"]:
                m = config["section_entries"][item.url]
                if m["url"] not in page_urls:
                    log.warning("mkdocs.yml nav names a section of %s, which is not a page of the site", m["url"])
                    continue
                item.url = f"{m['url']}#{m['anchor']}"

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
