"""The publishable tree (`make publish`): what a repository students can see holds, with no
solution anywhere in it, while the answer key (chapters/, the teacher's pages, the rubrics) stays
in the teacher's own repository.

The student site in it is built here from the chapters as committed (without outputs, so without
figures: `make publish` uses the executed chapters of `make student`), which has the same text:
the solutions it must not show are in that text, not in the figures."""

import fcntl
import html
import json
import os
import re
import shutil
import subprocess
import sys

import nbformat
import pytest
import yaml

from logitlab.course import website
from logitlab.course.run import ROOT, leaked_solutions, publish, solution_lines


def build_tree(folder):
    site = website.assemble(ROOT / "chapters", folder / "student-site", student=True)
    result = website.build(site)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return publish(folder / "publish", site=site / "_build" / "html")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """The publishable tree, a copy for each test process (a test plants lines in it). Under
    pytest-xdist the site is built once per run (15 s): the first worker to need it builds it, under
    a lock, in the run's shared temporary folder, and the others copy it."""
    own = tmp_path_factory.mktemp("publish")
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build_tree(own)
    shared = tmp_path_factory.getbasetemp().parent  # the run's folder, above every worker's own
    with open(shared / "publish.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "publish" / "publish").is_dir():
            build_tree(shared / "publish")
    return shutil.copytree(shared / "publish" / "publish", own / "publish")


@pytest.mark.slow
def test_the_publishable_tree_holds_no_solution(tree):
    chapters = sorted(p.name for p in (ROOT / "chapters").glob("*.ipynb"))
    assert sorted(p.name for p in (tree / "student" / "chapters").glob("*.ipynb")) == chapters
    assert sorted(p.name for p in tree.iterdir()) == ["README.md", "docs", "lib", "pyproject.toml", "requirements.txt", "student"]
    assert (tree / "docs" / "chapters" / chapters[0].replace(".ipynb", ".html")).is_file()
    assert not list(tree.rglob("teachers_guide*")) and not list(tree.rglob("exercises.yml"))
    assert "student/chapters/01_logits_and_temperature.ipynb" in (tree / "README.md").read_text()

    lines = solution_lines(ROOT / "chapters")
    assert len(lines) >= 60, lines
    assert leaked_solutions(tree, lines) == []

    # The search finds what it looks for: every line in the answer key, and a line planted in
    # the site's highlighted code, in a student notebook and in the library.
    assert {hit.split(": ", 1)[1] for hit in leaked_solutions(ROOT / "chapters", lines)} == set(lines)
    line = next(text for text in lines if "(" in text and "=" in text)
    page = tree / "docs" / "chapters" / chapters[0].replace(".ipynb", ".html")
    original = page.read_text()
    words = html.escape(line, quote=False).replace("(", '</span><span class="p">(</span><span class="n">', 1)
    page.write_text(original.replace("</body>", f'<pre><span class="n">{words}</span></pre></body>'))
    notebook = tree / "student" / "chapters" / chapters[0]
    saved = notebook.read_bytes()
    nb = nbformat.read(notebook, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(f"def f():\n    {line}\n"))
    nbformat.write(nb, notebook)
    (tree / "lib" / "logitlab" / "planted.py").write_text(line)
    try:
        assert {hit.split(": ")[0] for hit in leaked_solutions(tree, [line])} == {
            str(page.relative_to(tree)), str(notebook.relative_to(tree)), "lib/logitlab/planted.py"}
    finally:
        (tree / "lib" / "logitlab" / "planted.py").unlink()
        page.write_text(original)
        notebook.write_bytes(saved)


@pytest.mark.slow
def test_the_colab_buttons_open_the_release_the_setup_cells_install(tree):
    """What a student opens (the student site's Colab button, the README's link) and what its
    setup cell installs are the same ref: the course's release, repository.branch."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    url, ref = config["url"], config["branch"]
    colab = url.replace("https://github.com/", "https://colab.research.google.com/github/")
    readme = (tree / "README.md").read_text()
    assert f'pip install "logitlab @ git+{url}@{ref}"' in readme
    for notebook in sorted((tree / "student" / "chapters").glob("*.ipynb")):
        setup = next(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code")
        assert f'REPO = "{url}"' in setup and f'RELEASE = "{ref}"' in setup, notebook.name
        want = f"{colab}/blob/{ref}/student/chapters/{notebook.name}"
        page = (tree / "docs" / "chapters" / f"{notebook.stem}.html").read_text()
        assert set(re.findall(r'https://colab\.research\.google\.com/[^"\s<]+', page)) == {want}, notebook.name
        assert f"({want})" in readme, notebook.name


@pytest.mark.slow
def test_the_published_library_imports_and_grades_without_the_answer_key(tree):
    """The library of the tree, alone on the path (no chapters, no rubrics): it imports, and its
    checks refuse the student notebook's placeholder."""
    probe = ("import sys, io, contextlib; sys.path.insert(0, sys.argv[1]); import logitlab as ll\n"
             "assert ll.__file__.startswith(sys.argv[1]), ll.__file__\n"
             "try:\n    ll.checks.check_expected_tokens(lambda a, g: 1 / (1 - a) if a < 1 else g + 1)\n"
             "except ll.checks.CheckFailed as e:\n    print('refused:', e)\n")
    result = subprocess.run([sys.executable, "-I", "-c", probe, str(tree / "lib")], capture_output=True, text=True)
    assert result.returncode == 0 and "refused: expected_tokens(" in result.stdout, result.stderr[-2000:]


def test_publishing_needs_a_new_folder_and_a_built_site(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        publish(tmp_path / "old")
    with pytest.raises(ValueError, match="no built site"):
        publish(tmp_path / "new", site=tmp_path / "nowhere")
    assert (tmp_path / "old" / "keep.txt").read_text() == "x"


def test_solution_lines_are_those_between_the_markers(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "def f(x):\n    # BEGIN SOLUTION\n    secret_value = x * 12345  # the answer\n    return x\n"
        "    # END SOLUTION\n\nll.checks.check_softmax(f)\nvisible_afterwards = 1")])
    nbformat.write(nb, tmp_path / "01_x.ipynb")
    assert solution_lines(tmp_path) == ["secret_value = x * 12345"]  # "return x": too short to tell
    (tmp_path / "site.html").write_text('<span class="n">secret_value</span> <span class="o">=</span> x * 12345')
    (tmp_path / "data.json").write_text(json.dumps({"a": "secret_value = x * 12345"}))
    assert sorted(leaked_solutions(tmp_path, ["secret_value = x * 12345"])) == [
        "01_x.ipynb: secret_value = x * 12345", "data.json: secret_value = x * 12345", "site.html: secret_value = x * 12345"]
