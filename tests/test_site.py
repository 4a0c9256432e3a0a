"""The site as a reader sees it: build it and open every page in headless Chromium, once per builder of the one
``mkdocs.yml``: ``mkdocs build --strict`` (Material for MkDocs, at its end of life on May 5, 2027) and
``zensical build --strict`` (Zensical, its successor).

At a 1280 px wide window every page must fit: no page scrolls sideways, and no table is wider than its column (a
table that scrolls inside the page hides its right-hand columns just the same). Every image loads and every
internal link (with its ``#anchor``) resolves. Screenshots of the RFC overview, the conformance matrix and the
benchmarks page go to ``build/site-check/`` (Zensical's to ``build/site-check/zensical/``; ignored by git) for a
person to look at. Zensical runs no hooks, and the one part of ``docs/hooks.py`` it has no equivalent for, the API
page's design modules, is checked to be the only gap.

Needs Debian's ``chromium`` and ``chromium-driver`` (``apt-get install -y chromium chromium-driver``) and selenium;
without them the test skips, unless ``SITE_CHECK_REQUIRED=1`` (set by ``.ci/run``) turns the skip into a failure. The
same goes for a missing ``zensical`` (in the ``dev`` extra), except on Python 3.10, which Zensical does not support.
Run it alone with::

    python -m pytest tests/test_site.py
"""

from __future__ import annotations

import base64
import functools
import html.parser
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec, module_from_spec, spec_from_file_location
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "build" / "site-check"
WIDTH, HEIGHT = 1280, 900
# The pages a maintainer reads first, screenshotted whole: (site path, file name).
SHOTS = [("rfc/", "rfc-overview.png"), ("rfc/generated/matrix/", "matrix.png"),
         ("rfc/generated/benchmarks/", "benchmarks.png")]
# Flags for a root user on a machine with no network but loopback (see the module docstring).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", f"--window-size={WIDTH},{HEIGHT}"]

BUILDERS = ("mkdocs", "zensical")
ZENSICAL_HAS_NO_HOOKS = ("Zensical runs no MkDocs hooks, and its only Python extension point, a Markdown extension, "
                         "must be an installed module: docs/hooks.py's mkdocstrings block per registered design module "
                         "is not written into its API page")

pytestmark = pytest.mark.timeout(600)


def _required(reason: str) -> None:
    """Skip for ``reason``, or fail where ``SITE_CHECK_REQUIRED=1`` says the check must run."""
    if os.environ.get("SITE_CHECK_REQUIRED") == "1":
        pytest.fail(f"SITE_CHECK_REQUIRED=1 but the site check cannot run: {reason}")
    pytest.skip(f"site check skipped: {reason}")


def _missing_browser() -> str | None:
    """Why the browser check cannot run here, or None when it can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for program, package in (("chromium", "chromium"), ("chromedriver", "chromium-driver")):
        if shutil.which(program) is None:
            return f"{program} is not on PATH (apt-get install -y chromium chromium-driver; missing: {package})"
    return None


@pytest.fixture(scope="module", params=BUILDERS)
def builder(request) -> str:
    if request.param == "zensical" and find_spec("zensical") is None:
        if sys.version_info < (3, 11):
            pytest.skip("Zensical needs Python 3.11+ (the dev extra installs it from there on)")
        _required("zensical is not installed (pip install -e '.[dev]')")
    return request.param


@pytest.fixture(scope="module")
def site(builder: str, tmp_path_factory) -> Iterator[Path]:
    if builder == "mkdocs":
        out = tmp_path_factory.mktemp("site")
        command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    else:
        # No --site-dir option: mkdocs.yml's site_dir reads SITE_DIR, and Zensical wants it inside the project.
        (ROOT / "build").mkdir(exist_ok=True)
        out = Path(tempfile.mkdtemp(prefix="site-zensical-", dir=ROOT / "build"))
        command = [sys.executable, "-m", "zensical", "build", "--config-file", "mkdocs.yml", "--strict"]
    try:
        build = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                               env={**os.environ, "SITE_DIR": str(out)})
        assert build.returncode == 0, f"{builder} build --strict failed:\n{build.stdout}\n{build.stderr}"
        yield out
    finally:
        if builder != "mkdocs":
            shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="module")
def server(site: Path):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    reason = _missing_browser()
    if reason:
        _required(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=shutil.which("chromedriver")))
    driver.set_page_load_timeout(60)
    driver.set_window_size(WIDTH, HEIGHT)
    yield driver
    driver.quit()


def site_pages(site: Path) -> list[str]:
    """Every page of the built site as a path relative to its root (``rfc/`` for ``rfc/index.html``)."""
    pages = []
    for path in sorted(site.rglob("*.html")):
        rel = path.relative_to(site).as_posix()
        pages.append(rel.removesuffix("index.html") if rel.endswith("index.html") else rel)
    return pages


class _Ids(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)


def _target_file(site: Path, path: str) -> Path | None:
    """The file the local server returns for ``path``, or None (a directory URL needs its index.html)."""
    target = site / unquote(path).lstrip("/")
    if target.is_dir():
        target = target / "index.html"
    return target if target.is_file() else None


@functools.cache
def _ids_in(page: Path) -> frozenset[str]:
    parser = _Ids()
    parser.feed(page.read_text(encoding="utf-8"))
    return frozenset(parser.ids)


# Measures a loaded page, its collapsed blocks opened: sideways scrolling, tables wider than their column, images,
# links.
MEASURE = """
document.querySelectorAll('details').forEach(d => { d.open = true; });  // what a reader expands must fit too
const doc = document.documentElement;
const tables = [...document.querySelectorAll('.md-content table')].map((t, i) => {
  const box = t.closest('.md-typeset__scrollwrap') || t.parentElement;
  const heading = [...document.querySelectorAll('h1, h2, h3, h4')]
      .filter(h => h.compareDocumentPosition(t) & Node.DOCUMENT_POSITION_FOLLOWING).pop();
  return {index: i, under: heading ? heading.textContent.replace('¶', '').trim() : '(top)',
          width: Math.max(t.scrollWidth, box.scrollWidth), room: box.clientWidth};
});
return {
  window: window.innerWidth, pageWidth: doc.scrollWidth, viewport: doc.clientWidth,
  tables: tables,
  images: [...document.images].map(img => ({src: img.currentSrc || img.src, ok: img.complete && img.naturalWidth > 0})),
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
};
"""


def _load(driver, url: str) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, 30).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && [...document.images].every(i => i.complete)"))
    return driver.execute_script(MEASURE)


def _screenshot(driver, path: Path) -> None:
    """The whole page, not only the first screen."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": WIDTH, "height": min(height, 16000), "scale": 1},
    })
    path.write_bytes(base64.b64decode(shot["data"]))


def test_every_page_fits_1280_px_loads_its_images_and_links_resolve(browser, builder, site, server):
    pages = site_pages(site)
    assert "rfc/generated/matrix/" in pages and "rfc/generated/benchmarks/" in pages, pages
    origin = urlsplit(server).netloc
    problems: list[str] = []
    tables_seen = 0
    for page in pages:
        seen = _load(browser, server + page)
        assert seen["window"] == WIDTH, f"the browser window is {seen['window']} px wide, not {WIDTH}"
        tables_seen += len(seen["tables"])
        if seen["pageWidth"] > seen["viewport"]:
            problems.append(f"{page}: scrolls sideways ({seen['pageWidth']} px of content in {seen['viewport']} px)")
        for table in seen["tables"]:
            if table["width"] > table["room"] + 1:
                problems.append(f"{page}: table {table['index'] + 1} under {table['under']!r} is {table['width']} px "
                                f"wide in a {table['room']} px column: its right-hand columns are hidden")
        problems += [f"{page}: image {img['src']} does not load" for img in seen["images"] if not img["ok"]]
        for href in seen["links"]:
            parts = urlsplit(href)
            if parts.scheme not in ("http", "https") or parts.netloc != origin:
                continue
            target = _target_file(site, parts.path)
            fragment = unquote(urldefrag(href).fragment)
            if target is None:
                problems.append(f"{page}: link {href} leads nowhere")
            elif fragment and target.suffix == ".html" and fragment not in _ids_in(target):
                problems.append(f"{page}: link {href} names an anchor its page lacks")
    assert tables_seen, "no table measured on any page: the check looks for tables where the theme no longer puts them"
    shots = SCREENSHOTS if builder == "mkdocs" else SCREENSHOTS / builder  # MkDocs's where they always were
    shots.mkdir(parents=True, exist_ok=True)
    for page, name in SHOTS:
        _load(browser, server + page)
        _screenshot(browser, shots / name)
    assert not problems, "\n".join(sorted(set(problems)))


@functools.cache
def _site_hooks():
    """docs/hooks.py, which imports nothing of MkDocs at module level."""
    spec = spec_from_file_location("site_hooks", ROOT / "docs" / "hooks.py")
    hooks = module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_a_design_page_mkdocs_yml_does_not_list_fails_the_strict_build_and_shows_under_mkdocs(caplog):
    """Zensical runs no hooks: its Designs nav is what mkdocs.yml lists, so the MkDocs build insists on the list."""
    hooks = _site_hooks()
    pages = hooks.design_pages()
    nav = [{"RFC": [{"Designs": pages[:-1]}]}]
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.designs"):
        hooks._check_designs(nav)
    assert nav == [{"RFC": [{"Designs": pages}]}]
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    name, path = next(iter(pages[-1].items()))
    assert len(warnings) == 1 and f"- {name}: {path}" in warnings[0], warnings


def test_the_api_page_documents_every_registered_design_module(builder, site):
    """docs/hooks.py writes them into docs/api.md under MkDocs; under Zensical this is the site's one known gap, and
    the test fails once Zensical's page has any of them, so that the exemption goes."""
    modules = _site_hooks().registered_modules()
    documented = _ids_in(site / "api" / "index.html")
    assert {"prototypes", "prototypes.common"} <= documented, "the API page documents no module at all"
    missing = [module for module in modules if module not in documented]
    if builder == "zensical":
        closed = sorted(set(modules) - set(missing))
        assert not closed, f"Zensical's API page documents {closed}: the gap is closed, drop this exemption"
        pytest.xfail(ZENSICAL_HAS_NO_HOOKS)
    assert not missing, f"the API page lacks the registered design modules {missing}"


def _setup_commands(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip().startswith("python3 -m venv")]


def test_the_quickstart_sets_up_what_the_readme_sets_up():
    """One setup command in both places: a quickstart that installs less cannot collect every clause (C19 needs
    TorchRec), and two commands kept by hand drift. Needs no browser."""
    readme = _setup_commands(ROOT / "README.md")
    assert len(readme) == 1, f"README.md: expected one setup command, found {readme}"
    assert _setup_commands(ROOT / "docs" / "quickstart.md") == readme
