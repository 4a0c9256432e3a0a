"""The site as a reader sees it: build it with ``mkdocs build --strict`` and open every page in headless Chromium.

At a 1280 px wide window every page must fit: no page scrolls sideways, and no table is wider than its column (a
table that scrolls inside the page hides its right-hand columns just the same). Every image loads and every
internal link (with its ``#anchor``) resolves. Screenshots of the RFC overview, the conformance matrix and the
benchmarks page go to ``build/site-check/`` (ignored by git) for a person to look at.

Needs Debian's ``chromium`` and ``chromium-driver`` (``apt-get install -y chromium chromium-driver``) and selenium;
without them the test skips, unless ``SITE_CHECK_REQUIRED=1`` (set by ``.ci/run``) turns the skip into a failure.
Run it alone with::

    python -m pytest tests/test_site.py
"""

from __future__ import annotations

import base64
import functools
import html.parser
import os
import shutil
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
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

pytestmark = pytest.mark.timeout(600)


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


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout}\n{build.stderr}"
    return out


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
        if os.environ.get("SITE_CHECK_REQUIRED") == "1":
            pytest.fail(f"SITE_CHECK_REQUIRED=1 but the browser check cannot run: {reason}")
        pytest.skip(f"site browser check skipped: {reason}")
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


def test_every_page_fits_1280_px_loads_its_images_and_links_resolve(browser, site, server):
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
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for page, name in SHOTS:
        _load(browser, server + page)
        _screenshot(browser, SCREENSHOTS / name)
    assert not problems, "\n".join(sorted(set(problems)))


def _setup_commands(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip().startswith("python3 -m venv")]


def test_the_quickstart_sets_up_what_the_readme_sets_up():
    """One setup command in both places: a quickstart that installs less cannot collect every clause (C19 needs
    TorchRec), and two commands kept by hand drift. Needs no browser."""
    readme = _setup_commands(ROOT / "README.md")
    assert len(readme) == 1, f"README.md: expected one setup command, found {readme}"
    assert _setup_commands(ROOT / "docs" / "quickstart.md") == readme
