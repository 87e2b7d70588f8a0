"""`make book` reads the pages of the table of contents and nothing else, whatever else lies in
the repository: the virtual environments, caches and build folders that `make test`, `make student`
and `make book` create (hidden or not, today's or a future one's).

The documents are found the way the build finds them: a Sphinx application made from the book's
own configuration (jupyter-book's translation of _config.yml and _toc.yml), asked for the files it
would read. Probe folders stand for every folder a future target may create.
"""

import shutil
import tempfile
import uuid
from pathlib import Path

import yaml
from jupyter_book.config import get_final_config
from sphinx.application import Sphinx
from sphinx.util.docutils import docutils_namespace, patch_docutils

ROOT = Path(__file__).resolve().parents[1]


def toc_documents() -> set[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    docs = {toc["root"]}
    for part in toc["parts"]:
        docs |= {c["file"] for c in part["chapters"]}
    return {str(Path(d).with_suffix("")) for d in docs}


def documents_the_build_reads() -> set[str]:
    config, _ = get_final_config(user_yaml=ROOT / "_config.yml", cli_config={"latex_individualpages": False}, sourcedir=ROOT,
                                 use_external_toc=True)
    with tempfile.TemporaryDirectory() as out, patch_docutils(None), docutils_namespace():
        app = Sphinx(str(ROOT), None, f"{out}/html", f"{out}/doctrees", "dummy", confoverrides=config,
                     status=None, warning=None, freshenv=True)
        app.env.find_files(app.config, app.builder)
        return set(app.env.found_docs)


def test_the_book_reads_only_its_table_of_contents():
    tag = uuid.uuid4().hex[:8]
    probes = [ROOT / f".venv-probe-{tag}", ROOT / f"probe-{tag}", ROOT / "_scratch" / f"probe-{tag}"]
    page = "# A stray page\n\n{{ a Jinja template, as in a virtual environment's packages }}\n"
    try:
        for folder in probes:
            (folder / "pkg").mkdir(parents=True)
            (folder / "pkg" / "README.md").write_text(page)
            (folder / "notes.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
        found = documents_the_build_reads()
    finally:
        for folder in probes:
            shutil.rmtree(folder, ignore_errors=True)
    assert found == toc_documents(), f"read but not in _toc.yml: {sorted(found - toc_documents())}"
