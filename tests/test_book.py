"""The book builds with warnings as errors, from chapters executed once.

`make test` copies the chapters to _scratch/chapters and nbmake executes them there
(``--overwrite`` keeps the outputs), in parallel with the library's tests; then, in a second
pytest call, this test builds the site from those executed copies with execution turned off, so
each chapter runs once per test run. The Makefile says when the first call started
(``LOGITLAB_EXECUTED_SINCE``, seconds since the epoch), and every copy must have been executed
since. In one serial pytest call over tests/ and the copies, conftest.py runs this test last.
Run on its own (no fresh executed copies), it lets the build execute the chapters instead.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = ROOT / "_scratch" / "chapters"
SITE = ROOT / "_scratch" / "site"
SINCE = float(os.environ.get("LOGITLAB_EXECUTED_SINCE") or time.time())


def executed_this_run(chapter: Path) -> bool:
    copy = EXECUTED / chapter.name
    if not copy.is_file() or copy.stat().st_mtime < SINCE:
        return False
    nb = nbformat.read(copy, as_version=4)
    # nbclient records when it ran each cell: every code cell must carry that record.
    return all("execution" in c.metadata for c in nb.cells if c.cell_type == "code" and c.source.strip())


@pytest.fixture(scope="module")
def built_site():
    chapters = sorted((ROOT / "chapters").glob("*.ipynb"))
    reuse = all(executed_this_run(c) for c in chapters)
    if os.environ.get("LOGITLAB_EXECUTED_SINCE"):  # set by `make test`
        assert reuse, f"nbmake did not execute the chapters into {EXECUTED}"
    if SITE.exists():
        shutil.rmtree(SITE)
    SITE.mkdir(parents=True)
    shutil.copytree(ROOT / "book", SITE / "book", ignore=shutil.ignore_patterns("vendor"))
    (SITE / "book" / "vendor").symlink_to(ROOT / "book" / "vendor", target_is_directory=True)
    shutil.copy(ROOT / "_toc.yml", SITE / "_toc.yml")
    shutil.copytree(EXECUTED if reuse else ROOT / "chapters", SITE / "chapters")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off" if reuse else "force"
    (SITE / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    jb = Path(sys.executable).with_name("jupyter-book")
    result = subprocess.run([str(jb), "build", str(SITE), "-W", "-n", "--keep-going"], capture_output=True, text=True)
    return result, SITE / "_build" / "html", reuse


def test_book_builds_with_warnings_as_errors(built_site):
    result, html, _ = built_site
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert (html / "index.html").is_file()


def test_chapter_pages_show_executed_outputs(built_site):
    _, html, _ = built_site
    for chapter in sorted((ROOT / "chapters").glob("*.ipynb")):
        page = (html / "chapters" / f"{chapter.stem}.html").read_text()
        assert len(re.findall(r"<img [^>]*src=\"[^\"]*\.png\"", page)) >= 3, f"{chapter.name}: no plots"
        assert "Traceback" not in page and "traceback" not in page, f"{chapter.name}: a cell failed"
        assert "colab.research.google.com" in page, "Colab launch button missing"


def test_site_is_self_contained(built_site):
    _, html, _ = built_site
    assert (html / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert (html / "_static" / "widgets" / "embed-amd.js").is_file()
    for page in [html / "index.html", *html.glob("chapters/*.html")]:
        text = page.read_text()
        scripts = re.findall(r"<script[^>]*src=\"([^\"]+)\"", text)
        remote = [s for s in scripts if s.startswith(("http:", "https:", "//"))]
        assert not remote, f"{page.name} loads scripts from the network: {remote}"


def test_widget_state_is_embedded(built_site):
    _, html, _ = built_site
    page = (html / "chapters" / "01_logits_and_temperature.html").read_text()
    assert "application/vnd.jupyter.widget-state+json" in page
    assert "widgets/embed-amd.js" in page and "require.js" in page
