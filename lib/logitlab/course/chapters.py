"""Every chapter executed once, for the tests and the website alike.

One kernel per chapter runs its code cells in order. At each exercise (a code cell holding a
``# BEGIN SOLUTION`` region) the student's version of the cell runs first, the solution replaced
by the placeholder, and must stop with ``NotImplementedError``; then the chapter's own cell, with
the solution, runs. :func:`execute` returns what went wrong (tests/test_chapters.py fails on it)
and writes the executed chapter, whose outputs are the book's.

An executed chapter is kept with a key of what it was executed from (:func:`sources_key`: the
chapter, every file of the library, the pinned versions). ``make book`` and ``make student``
execute only the chapters whose key changed since the last run that passed, in ``make test`` or
here, and build the site from the rest as they are::

    python -m logitlab.course.chapters _scratch/chapters

No cell has a time limit that a slow or busy machine could reach on a healthy cell; only the
cells that make a widget are bounded (see :func:`timeout_for`). One line per chapter says what
it is doing and how long it took.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import queue
import sys
import time
from pathlib import Path

import nbformat

from .assignments import BEGIN, strip_code_solutions

ROOT = Path(__file__).resolve().parents[3]
LIBRARY = Path(__file__).resolve().parents[1]
# After a cell that makes a widget, nbclient sometimes waited for the kernel's reply until the
# cell's timeout, then went on: chapter 8 lost exactly 600 s after its widget cell in two full
# `make test` runs, chapter 5 60 s in another. The kernel had sent its reply at once (the reply's
# own timestamp is the cell's end): the wait on the socket missed the message's arrival.
# `listen_in_slices` makes every wait look again each second, which finds such a message (a
# notebook of 8 widget cells, executed 40 times in turn with and without it beside a `make test` on
# the 2-core Xeon: 6 of 20 runs stalled without, none of 20 with); the bound below stays for a
# real hang. Those cells take under 2 s (1.9 s at most in two full runs): a minute leaves a busy
# machine thirty times their time. Every other cell runs as long as it needs.
WIDGET_CELL_TIMEOUT = 60


def listen_in_slices(channel, seconds: float = 1.0) -> None:
    """Make ``channel.get_msg`` (a kernel client's asynchronous channel) wait in slices of
    ``seconds``, polling the socket afresh each time, until a message comes or its own timeout
    (if any) runs out: a message whose arrival one long wait missed is found by the next poll."""
    get_msg = channel.get_msg

    async def get_msg_in_slices(timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = seconds if deadline is None else min(seconds, max(0.0, deadline - time.monotonic()))
            try:
                return await get_msg(timeout=left)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    channel.get_msg = get_msg_in_slices


def timeout_for(cell, cell_timeout: int | None = None) -> int | None:
    """Seconds a cell may run: :data:`WIDGET_CELL_TIMEOUT` for a widget's, ``cell_timeout``
    (default: no limit) for any other."""
    return WIDGET_CELL_TIMEOUT if "ll.widgets." in cell.source else cell_timeout


def is_exercise(cell) -> bool:
    return cell.cell_type == "code" and BEGIN in cell.source


def errors(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.output_type == "error"]


def stray_lines(cell) -> list[str]:
    """What the cell wrote to stderr (warnings, log lines), unless the cell is tagged
    ``shows-stderr``: a page must not show a warning the book did not mean to show."""
    if "shows-stderr" in cell.get("metadata", {}).get("tags", []):
        return []
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream" and o.name == "stderr")
    return [line for line in text.splitlines() if line.strip()]


def execute(path: Path, out_dir: Path, cell_timeout: int | None = None) -> list[str]:
    """Run chapter ``path`` in ``out_dir`` as the module docstring says; write the executed copy
    there and return what went wrong, one line per problem. ``cell_timeout`` bounds every cell
    but a widget's (the tests bound a hang; the book does not)."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout_func=lambda cell: timeout_for(cell, cell_timeout), kernel_name="python3",
                            allow_errors=True,
                            resources={"metadata": {"path": str(out_dir)}})
    problems, number = [], 0  # number: the chapter's own cells, as Jupyter would count them
    with client.setup_kernel():
        listen_in_slices(client.kc.shell_channel)
        listen_in_slices(client.kc.iopub_channel)
        info = client.wait_for_reply(client.kc.kernel_info())
        nb.metadata["language_info"] = info["content"]["language_info"]
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            if is_exercise(cell):
                student = nbformat.v4.new_code_cell(strip_code_solutions(cell.source)[0])
                client.execute_cell(student, index, store_history=False)
                found = [f"{e.ename}: {e.evalue}" for e in errors(student)]
                if [e.ename for e in errors(student)] != ["NotImplementedError"]:
                    problems.append(f"cell {index}, the student's version: expected NotImplementedError, got {found}")
            number += 1
            client.execute_cell(cell, index, execution_count=number)
            for e in errors(cell):
                problems.append(f"cell {index}: {e.ename}: {e.evalue.splitlines()[0] if e.evalue else ''}")
            problems += [f"cell {index} wrote to stderr: {line[:200]}" for line in stray_lines(cell)[:3]]
        client.set_widgets_metadata()  # the widgets' state, which the website embeds (as nbclient's execute does)
    nbformat.write(nb, out_dir / path.name)
    return problems


# What an executed chapter was executed from.

@functools.cache
def _library_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in LIBRARY.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(LIBRARY)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def sources_key(chapter: Path) -> str:
    """A sha256 of the chapter, every file of the library (code, data, trained weights) and the
    pinned versions: an edit to any of them, even a comment, executes the chapter again (simpler
    to trust than a list of what can change an output)."""
    requirements = ROOT / "requirements.txt"
    pins = requirements.read_bytes() if requirements.is_file() else b""
    return hashlib.sha256(chapter.read_bytes() + b"\0" + _library_digest().encode() + b"\0" + pins).hexdigest()


def _key_file(chapter: Path, out_dir: Path) -> Path:
    return out_dir / f"{chapter.stem}.sha256"


def record(chapter: Path, out_dir: Path, key: str) -> None:
    """Say that ``out_dir`` holds ``chapter`` executed, without a problem, from sources of ``key``."""
    _key_file(chapter, out_dir).write_text(key + "\n")


def up_to_date(chapter: Path, out_dir: Path) -> bool:
    """Whether ``out_dir`` holds ``chapter`` executed from its present sources."""
    key = _key_file(chapter, out_dir)
    return (out_dir / chapter.name).is_file() and key.is_file() and key.read_text().strip() == sources_key(chapter)


def _run(job) -> tuple[Path, list[str], float]:
    chapter, out_dir = job
    start, key = time.monotonic(), sources_key(chapter)
    _key_file(chapter, out_dir).unlink(missing_ok=True)
    problems = execute(chapter, out_dir)
    if not problems and key == sources_key(chapter):  # not if a source changed while it ran
        record(chapter, out_dir, key)
    return chapter, problems, time.monotonic() - start


def execute_stale(chapters: list[Path], out_dir: Path, workers: int) -> list[str]:
    """Execute into ``out_dir`` the ``chapters`` not up to date there, ``workers`` at a time,
    printing a line per chapter; return every problem found, each prefixed by its chapter."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    import multiprocessing

    out_dir.mkdir(parents=True, exist_ok=True)
    stale = [c for c in chapters if not up_to_date(c, out_dir)]
    for chapter in chapters:
        if chapter not in stale:
            print(f"{chapter.stem}: executed from these sources already, kept", flush=True)
    problems, start = [], time.monotonic()
    if stale:
        print(f"executing {len(stale)} chapter(s), {workers} at a time", flush=True)
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for done in as_completed([pool.submit(_run, (chapter, out_dir)) for chapter in stale]):
                chapter, found, seconds = done.result()
                print(f"{chapter.stem}: executed in {seconds:.0f} s" + (f", {len(found)} problem(s)" if found else ""),
                      flush=True)
                problems += [f"{chapter.name}: {p}" for p in found]
        print(f"{len(stale)} chapter(s) executed in {time.monotonic() - start:.0f} s", flush=True)
    return problems


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m logitlab.course.chapters", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder of the executed chapters (kept between runs)")
    parser.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 4),
                        help="chapters executed at once (default: one per core, at most 4)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    problems = execute_stale(sorted((ROOT / "chapters").glob("*.ipynb")), args.out.resolve(), args.workers)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
