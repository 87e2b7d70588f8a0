"""The built site, opened in a real browser (Debian's chromium, driven by Playwright).

`make test` runs this after test_book.py, on the site that test built (``_scratch/site``) from the
chapters executed in the same run. Each page is served over HTTP from that folder, as a reader's
browser would load it, and checked for what a static check of the HTML cannot see: that MathJax
typeset every formula (no raw TeX left), that every figure loaded, that each widget shows its
figure or table at the default settings, that exercise solutions stay folded until opened, that
internal links lead to pages and anchors that exist, and that each chapter's Colab button opens
that chapter's notebook in the repository.

Without chromium (``apt-get install -y chromium``; `.ci/run` installs it) or Playwright, every
test here is skipped with a message saying so.
"""

import http.server
import json
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_scratch" / "site" / "_build" / "html"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
# TeX that MathJax would have replaced: delimiters and commands with an argument.
RAW_TEX = re.compile(r"\$\$|\\\(|\\\[|\\(frac|sum|mathrm|log|sqrt|begin|left|right|le|ge)\b")


def widget_chapters() -> list[str]:
    """The chapters that call a widget of ``ll.widgets``."""
    return [c.stem for c in CHAPTERS if "ll.widgets." in c.read_text()]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the built site, without a log line per request."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=str(HTML), **kwargs)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium): the site was not checked in a browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright): the site was not checked in a browser")
    if not (HTML / "index.html").is_file():
        pytest.skip(f"no built site in {HTML}: run tests/test_book.py first (make test does)")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with sync_playwright() as p:
        chrome = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chrome, f"http://127.0.0.1:{server.server_address[1]}/"
        chrome.close()
    server.shutdown()


def site_pages() -> list[str]:
    """Every page of the book (index.html only redirects to the introduction: tested apart)."""
    pages = [f"book/{p.stem}.html" for p in sorted((ROOT / "book").glob("*.md"))]
    return pages + [f"chapters/{c.stem}.html" for c in CHAPTERS]


def test_the_front_page_leads_to_the_introduction(browser):
    chrome, base = browser
    page = chrome.new_page()
    page.goto(base + "index.html")
    page.wait_for_url("**/book/intro.html", timeout=10_000)
    assert "How to read this book" in page.inner_text("main")
    page.close()


@pytest.fixture(scope="module")
def visit(browser):
    """``visit(path)``: what a reader's browser shows of ``path``, read once per page for every
    test below (opening each page once instead of once per test took this file from 153 s to 40 s
    on a 2-core Intel Xeon): the page is loaded, MathJax (where the page loads it)
    has typeset it, and its widgets (where it has any) have rendered; then each solution is
    opened by its toggle button, last, as it changes the page."""
    chrome, base = browser
    seen = {}

    def read(path: str) -> dict:
        if path not in seen:
            page = chrome.new_page()
            page.goto(base + path, wait_until="load")
            if page.evaluate("() => typeof window.MathJax !== 'undefined'"):
                page.wait_for_function("() => window.MathJax.startup && window.MathJax.startup.promise", timeout=30_000)
                page.evaluate("() => window.MathJax.startup.promise")
            if path.startswith("chapters/") and Path(path).stem in widget_chapters():
                page.wait_for_selector(".jupyter-widgets", timeout=30_000)
            seen[path] = {"prose": page.evaluate(PROSE), "typeset": page.locator("mjx-container").count(),
                          "broken": page.evaluate(BROKEN_IMAGES), "links": page.evaluate(LINKS),
                          "widgets": page.evaluate(WIDGETS), "solutions": toggled_solutions(page)}
            page.close()
        return seen[path]

    return read


# The prose as a reader sees it: code cells and their outputs are left out (code may hold TeX).
PROSE = """() => {
    const main = document.querySelector('main') || document.body;
    const copy = main.cloneNode(true);
    copy.querySelectorAll('pre, code, script, style, .cell_output, mjx-assistive-mml').forEach(e => e.remove());
    return copy.innerText;
}"""
BROKEN_IMAGES = "() => [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"
LINKS = "() => [...document.querySelectorAll('a[href]')].map(a => a.href)"
# Each interactive widget renders its controls and, in its output area, what it drew at the
# default settings: a figure, a table, or coloured text.
WIDGETS = """() => [...document.querySelectorAll('.widget-interact')].map(w => ({
    controls: w.querySelectorAll('.widget-slider, .widget-dropdown, .widget-text, input, select').length,
    shown: w.querySelectorAll('.widget-output img, .widget-output table, .widget-output .speculative-outcome').length,
}))"""


def toggled_solutions(page) -> list[tuple[bool, bool]]:
    """For each solution of the page: (visible before its toggle is clicked, visible after)."""
    states = []
    solutions = page.locator(".solution")
    for i in range(solutions.count()):
        solution = solutions.nth(i)
        body = solution.locator(":scope > :not(.admonition-title):not(summary):not(button)").first
        before = body.is_visible()
        # The toggle button, not the title: the title holds a link back to the exercise.
        solution.locator("button.toggle-button, :scope > summary").first.click()
        states.append((before, body.is_visible()))
    return states


@pytest.mark.parametrize("path", site_pages())
def test_page_renders_its_math_and_figures(visit, path):
    if not (HTML / path).is_file():
        pytest.skip(f"{path} is not in the built site")  # e.g. a book page left out of the toc
    shown = visit(path)
    leftover = sorted(set(m.group(0) for m in RAW_TEX.finditer(shown["prose"])))
    assert not leftover, f"{path}: raw TeX left after MathJax: {leftover}"
    source = (ROOT / path.replace(".html", ".ipynb")) if path.startswith("chapters/") else None
    if source is not None and "$" in "".join(c["source"] if isinstance(c["source"], str) else "".join(c["source"])
                                             for c in json.loads(source.read_text())["cells"]
                                             if c["cell_type"] == "markdown"):
        assert shown["typeset"] > 0, f"{path}: the chapter has math but none was typeset"
    assert not shown["broken"], f"{path}: images that did not load: {shown['broken'][:5]}"


@pytest.mark.parametrize("stem", widget_chapters())
def test_widgets_show_their_default_figure(visit, stem):
    found = visit(f"chapters/{stem}.html")["widgets"]
    assert found, f"{stem}: no widget rendered"
    for widget in found:
        assert widget["controls"] > 0 and widget["shown"] > 0, f"{stem}: a widget without its controls or figure: {found}"


def test_solutions_stay_hidden_until_opened(visit):
    checked = 0
    for chapter in CHAPTERS:
        if ":class: dropdown" not in chapter.read_text():
            continue
        states = visit(f"chapters/{chapter.stem}.html")["solutions"]
        assert states, f"{chapter.stem}: no solution on the page"
        for i, (before, after) in enumerate(states):
            assert not before, f"{chapter.stem}: solution {i + 1} is visible before it is opened"
            assert after, f"{chapter.stem}: solution {i + 1} did not open on click"
            checked += 1
    assert checked >= 10


def test_internal_links_resolve(browser, visit):
    _, base = browser
    missing = []
    for path in site_pages():
        if not (HTML / path).is_file():
            continue
        for link in set(visit(path)["links"]):
            url, anchor = urldefrag(link)
            if not url.startswith(base):
                continue
            target = HTML / unquote(urlparse(url).path.lstrip("/"))
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                missing.append(f"{path} -> {link}")
            elif anchor and f'id="{anchor}"' not in target.read_text(errors="replace"):
                missing.append(f"{path} -> {link} (no such anchor)")
    assert not missing, "links that lead nowhere:\n" + "\n".join(sorted(missing)[:20])


def test_colab_buttons_open_their_own_notebooks(visit):
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = urlparse(config["repository"]["url"]).path.strip("/")
    branch = config["repository"]["branch"]
    for chapter in CHAPTERS:
        links = [link for link in visit(f"chapters/{chapter.stem}.html")["links"] if "colab.research.google.com" in link]
        want = f"https://colab.research.google.com/github/{repo}/blob/{branch}/chapters/{chapter.name}"
        assert links and all(link == want for link in links), f"{chapter.stem}: Colab links {links}, expected {want}"
