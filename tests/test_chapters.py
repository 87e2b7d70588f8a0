"""Every chapter executed, as the book shows it and as a student meets it.

One kernel per chapter runs its code cells in order. At each exercise (a code cell holding a
``# BEGIN SOLUTION`` region) the student's version of the cell runs first, the solution replaced
by the placeholder: it must stop with ``NotImplementedError`` in that cell and nowhere else, which
is the exercise's check refusing an unwritten answer. Then the chapter's own cell, with the
solution, runs and its check must pass. Every other cell must run without an error. So each
exercise is checked with its solution missing and present, in the state the notebook has reached
there, and the chapter runs to its end with every solution present, writing nothing to stderr
(a warning or a log line) unless the cell is tagged ``shows-stderr``. The executed chapter (the
outputs of the solutions) is written to ``$LOGITLAB_EXECUTED_DIR`` when it is set (``make test``
builds the book from it), with the key of its sources, so that ``make book`` and ``make student``
use it as it is (``logitlab.course.chapters``, which runs a chapter the same way); else to a
temporary folder.

A student's copy with a solution missing must also run to its end outside that exercise: no later
cell may use a name that the exercise cell, or a cell removed from the student's copy, defines.
``test_no_cell_depends_on_a_solution`` checks that by reading the code, which is what makes the
run above stand for every student copy with any set of solutions missing."""

import ast
import asyncio
import os
import queue
import time
from pathlib import Path

import nbformat
import pytest

from logitlab.course.chapters import (WIDGET_CELL_TIMEOUT, execute, is_exercise, listen_in_slices, record, sources_key,
                                      timeout_for, up_to_date)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
CELL_TIMEOUT = 600  # seconds: a hang fails the test (a chapter takes 30 s to 2 min on the 2-core CPU)


def is_removed(cell) -> bool:  # a code cell the student's copy leaves out
    return cell.cell_type == "code" and "solution" in cell.get("metadata", {}).get("tags", [])


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_runs_with_and_without_each_solution(path, tmp_path):
    out_dir = Path(os.environ.get("LOGITLAB_EXECUTED_DIR", tmp_path))
    out_dir.mkdir(parents=True, exist_ok=True)
    key = sources_key(path)
    problems = execute(path, out_dir, CELL_TIMEOUT)
    assert not problems, f"{path.name}:\n" + "\n".join(problems)
    if out_dir != tmp_path and key == sources_key(path):  # make book and make student keep it
        record(path, out_dir, key)


def top_level_names(source: str) -> set[str]:
    """Names a cell binds at its top level (functions, classes, assignments, imports)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            targets += [item.optional_vars for item in getattr(node, "items", [])]
            names.update(n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def names(source: str, context) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and isinstance(n.ctx, context)}


def code_without_magics(cell) -> str:
    return "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_no_cell_depends_on_a_solution(path):
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    for index, cell in enumerate(cells):
        if not (is_exercise(cell) or is_removed(cell)):
            continue
        defined = top_level_names(code_without_magics(cell))
        for later in cells[index + 1:]:
            code = code_without_magics(later)
            rebound = top_level_names(code) | names(code, ast.Store)  # bound anywhere in it: not the exercise's
            used = names(code, ast.Load) & defined - rebound
            assert not used, (f"{path.name}: a later cell uses {sorted(used)}, defined by an exercise or solution cell; "
                              f"a student's copy without that solution would fail there:\n{later.source[:300]}")
            defined -= rebound  # a name bound again later no longer comes from the exercise


def test_the_cells_that_make_widgets_get_the_short_timeout():
    widget_cells = [cell for path in CHAPTERS for cell in nbformat.read(path, as_version=4).cells
                    if cell.cell_type == "code" and "widgets." in cell.source]
    assert len(widget_cells) >= 10  # one per chapter but the last
    assert all(timeout_for(cell, CELL_TIMEOUT) == WIDGET_CELL_TIMEOUT for cell in widget_cells)
    assert timeout_for(nbformat.v4.new_code_cell("x = 1"), CELL_TIMEOUT) == CELL_TIMEOUT
    assert timeout_for(nbformat.v4.new_code_cell("x = 1")) is None  # the book's build: no limit


class MissingChannel:
    """A kernel channel whose message arrives while a wait is under way and is missed by that
    wait, as nbclient's wait for a widget cell's reply was: a wait sees only what had arrived
    when it began, and ends at its timeout (or never, without one)."""

    def __init__(self, arrives_after: float | None):
        self.arrives = None if arrives_after is None else time.monotonic() + arrives_after

    async def get_msg(self, timeout=None):
        arrived = self.arrives is not None and time.monotonic() >= self.arrives
        if arrived:
            return {"msg_type": "execute_reply"}
        if timeout is None:
            await asyncio.sleep(3600)
        await asyncio.sleep(timeout)
        raise queue.Empty


def test_a_wait_in_slices_finds_a_message_one_long_wait_missed():
    async def wait(channel, timeout):
        start = time.monotonic()
        try:  # a wait without a timeout that misses the message would never end: 3 s bound it here
            return await asyncio.wait_for(channel.get_msg(timeout=timeout), 3), time.monotonic() - start
        except (queue.Empty, asyncio.TimeoutError):
            return None, time.monotonic() - start

    plain = MissingChannel(arrives_after=0.05)
    assert asyncio.run(wait(plain, 1.0))[0] is None  # the long wait missed it, up to its timeout
    for timeout in (None, 2.0):
        sliced = MissingChannel(arrives_after=0.05)
        listen_in_slices(sliced, seconds=0.1)
        message, took = asyncio.run(wait(sliced, timeout))
        assert message == {"msg_type": "execute_reply"} and took < 0.5, (timeout, took)
    never = MissingChannel(arrives_after=None)
    listen_in_slices(never, seconds=0.1)
    message, took = asyncio.run(wait(never, 0.35))
    assert message is None and 0.3 < took < 0.6  # its own timeout still holds


def test_an_executed_chapter_is_kept_until_its_sources_change(tmp_path, monkeypatch):
    """make book and make student execute a chapter again only when the chapter, the library or
    the pins changed since its last run that passed."""
    from logitlab.course import chapters

    chapter = tmp_path / "01_x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), chapter)
    out = tmp_path / "executed"
    out.mkdir()
    assert not up_to_date(chapter, out)
    (out / chapter.name).write_text("{}")
    record(chapter, out, sources_key(chapter))
    assert up_to_date(chapter, out)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 2")]), chapter)
    assert not up_to_date(chapter, out)  # the chapter changed
    record(chapter, out, sources_key(chapter))
    monkeypatch.setattr(chapters, "_library_digest", lambda: "another library")
    assert not up_to_date(chapter, out)  # the library changed
    (out / chapter.name).unlink()
    monkeypatch.undo()
    assert not up_to_date(chapter, out)  # no executed copy


def test_a_notebook_runs_as_a_test_under_nbmake(tmp_path):
    """The README's other way to run a chapter, `pytest --nbmake chapters/NN_....ipynb`: nbmake
    drives nbclient, the client that runs every chapter above, so this checks the route itself on
    a notebook of the chapters' kind (the library, the real model, an exercise's check), and that
    a cell that raises fails it. (Running a whole chapter through it again took 40 s of make test.)"""
    import subprocess
    import sys

    def run(name, *cells):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbmake",
                               f"{name}.ipynb"], cwd=tmp_path, capture_output=True, text=True, timeout=300)

    setup = "import logitlab as ll\nimport torch\n\nmodel, tokenizer = ll.load('smollm2-135m', device=ll.device())"
    answer = ("def expected_tokens(alpha, gamma):\n    return sum(alpha ** i for i in range(gamma + 1))\n\n"
              "ll.checks.check_expected_tokens(expected_tokens)")
    tokens = "print(ll.generate(model, [tokenizer('The sea is').input_ids], max_new_tokens=3, temperature=0).new_tokens)"
    good = run("good", setup, tokens, answer)
    assert good.returncode == 0 and "1 passed" in good.stdout, good.stdout + good.stderr
    wrong = answer.replace("range(gamma + 1)", "range(gamma)")
    bad = run("bad", setup, wrong)
    assert bad.returncode == 1 and "1 failed" in bad.stdout and "check_expected_tokens" in bad.stdout, bad.stdout
