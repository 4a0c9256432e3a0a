"""mkdocs hooks: build the parts of the site that depend on which designs exist at build time.

* The ``RFC > Designs`` nav section lists every ``rfc/designs/*.md`` (designs in registry order first, then any
  other page alphabetically), so a new design page appears without editing ``mkdocs.yml``.
* ``docs/api.md`` gets one mkdocstrings block (``::: prototypes.<name>``) per module registered in
  ``prototypes._DESIGN_MODULES``, read from ``prototypes/__init__.py`` without importing torch or Lightning.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "prototypes" / "__init__.py"
DESIGN_PAGES = ROOT / "rfc" / "designs"
API_PLACEHOLDER = "<!-- API: design modules -->"

log = logging.getLogger("mkdocs.hooks.designs")


def registered_modules() -> list[str]:
    """The modules named in ``_DESIGN_MODULES`` of ``prototypes/__init__.py``, in registry order."""
    tree = ast.parse(REGISTRY.read_text(encoding="utf-8"), filename=str(REGISTRY))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
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


def on_config(config, **kwargs):
    if config.nav and not _fill_designs(config.nav):
        log.warning("mkdocs.yml nav has no empty 'Designs: []' section for docs/hooks.py to fill")
    return config


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    if page.file.src_uri != "api.md":
        return markdown
    if API_PLACEHOLDER not in markdown:
        log.warning("docs/api.md lost its placeholder %r", API_PLACEHOLDER)
        return markdown
    blocks = []
    for module in registered_modules():
        if not (ROOT / (module.replace(".", "/") + ".py")).is_file():
            log.warning("registered design module %s has no file", module)
            continue
        blocks.append(f"::: {module}\n    options:\n      heading_level: 3\n")
    return markdown.replace(API_PLACEHOLDER, "\n".join(blocks))
