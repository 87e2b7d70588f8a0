"""The book builds with warnings as errors, from chapters executed once.

`make test` executes the chapters into _scratch/chapters (tests/test_chapters.py, with
``LOGITLAB_EXECUTED_DIR``), in parallel with the library's tests; then, in a second
pytest call, this test builds the site from those executed copies with execution turned off, so
each chapter runs once per test run. The Makefile says when the first call started
(``LOGITLAB_EXECUTED_SINCE``, seconds since the epoch), and every copy must have been executed
since. In one serial pytest call over tests/ and the copies, conftest.py runs this test last.
Run on its own (no fresh executed copies), it lets the build execute the chapters instead.
"""

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
import yaml

from logitlab.course import website

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = ROOT / "_scratch" / "chapters"
SITE = ROOT / "_scratch" / "site"
STUDENT_SITE = ROOT / "_scratch" / "student-site"
SINCE = float(os.environ.get("LOGITLAB_EXECUTED_SINCE") or time.time())


def executed_this_run(chapter: Path) -> bool:
    copy = EXECUTED / chapter.name
    if not copy.is_file() or copy.stat().st_mtime < SINCE:
        return False
    nb = nbformat.read(copy, as_version=4)
    # nbclient records when it ran each cell: every code cell must carry that record.
    return all("execution" in c.metadata for c in nb.cells if c.cell_type == "code" and c.source.strip())


@pytest.fixture(scope="module")
def builds():
    """Both editions built from the executed chapters, at the same time: each build is one
    process, most of it Sphinx on one core, so side by side they take little longer than one.
    Without copies executed in this run, the book alone, executing its chapters."""
    chapters = sorted((ROOT / "chapters").glob("*.ipynb"))
    reuse = all(executed_this_run(c) for c in chapters)
    if os.environ.get("LOGITLAB_EXECUTED_SINCE"):  # set by `make test`
        assert reuse, f"tests/test_chapters.py did not execute the chapters into {EXECUTED}"
    out = website.assemble(EXECUTED if reuse else ROOT / "chapters", SITE, execute=not reuse)
    student = website.assemble(EXECUTED, STUDENT_SITE, student=True) if reuse else None
    with ThreadPoolExecutor(2) as pool:
        book, student_build = pool.submit(website.build, out), student and pool.submit(website.build, student)
        return {"book": (book.result(), out / "_build" / "html", reuse),
                "student": student_build and (student_build.result(), student / "_build" / "html")}


@pytest.fixture(scope="module")
def built_site(builds):
    return builds["book"]


@pytest.fixture(scope="module")
def student_site(builds):
    if not builds["student"]:
        pytest.skip("the student edition is built from the chapters executed by `make test`")
    return builds["student"]


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


def test_student_edition_builds_without_a_solution(student_site):
    result, html = student_site
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    url, ref = config["url"].removeprefix("https://github.com/"), config["branch"]
    for chapter in sorted((ROOT / "chapters").glob("*.ipynb")):
        page = (html / "chapters" / f"{chapter.stem}.html").read_text()
        assert "solution dropdown admonition" not in page and "BEGIN SOLUTION" not in page, chapter.name
        assert "NotImplementedError" in page, f"{chapter.name}: no exercise left for the student"
        assert len(re.findall(r"<img [^>]*src=\"[^\"]*\.png\"", page)) >= 3, f"{chapter.name}: the figures are gone"
        # at the release, where the student notebook's setup cell installs the library of that release
        assert f"colab.research.google.com/github/{url}/blob/{ref}/student/chapters/{chapter.name}" in page
    assert "student edition" in (html / "book" / "teaching.html").read_text()
    assert not (html / "book" / "teachers_guide.html").exists(), "the rubrics are answers: not in the student edition"
