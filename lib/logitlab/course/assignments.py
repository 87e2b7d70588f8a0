"""Student versions of the chapters: the same notebooks with the solutions taken out.

This module belongs to the book's "Teaching with this book" page (``book/teaching.md``)::

    python -m logitlab.course.assignments chapters/ --out student/

reads every chapter notebook (a folder, or single ``.ipynb`` files) and writes a student copy of
each under ``--out``, with the same file name. What the conversion removes is marked in the
chapters as follows.

* **Code answers** sit between two marker lines in a code cell (the markers may be indented)::

      def top_k(logits, k):
          # BEGIN SOLUTION
          ...the answer...
          # END SOLUTION

      ll.checks.check_top_k(top_k)

  Each marked region becomes one line, ``raise NotImplementedError(...)``, at the indentation of
  ``# BEGIN SOLUTION``; everything outside the markers is kept exactly, so the student keeps the
  signature, the docstring and the check. A cell may hold several regions; a ``BEGIN`` without
  its ``END``, an ``END`` without a ``BEGIN`` or a nested ``BEGIN`` is an error.
* **Written answers** are sphinx-exercise ``{solution}`` directives in markdown cells, fenced with
  colons (``:::{solution} label`` ... ``:::``) or backticks, three or more of either. The
  directive is removed up to its closing fence (same character, at least as long); a cell left
  empty is removed. The gated form, a ``{solution-start}`` cell through a ``{solution-end}``
  cell, is removed with every cell in between. ``{exercise}`` directives are kept.
* **Code cells tagged** ``solution`` (cell metadata ``tags``) are removed.

Every output and execution count is cleared (``keep_outputs=True`` clears only those of the
cells the conversion changed: the student edition of the website keeps the chapters' figures),
and a short note for the student comes first.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
PLACEHOLDER = 'raise NotImplementedError("Exercise: write your solution here")'
STUDENT_NOTE = (
    "**Student version.** Solutions have been removed: write your code where it says "
    "`raise NotImplementedError`, then run the check cell below it."
)

_FENCE = re.compile(r"^\s*(`{3,}|:{3,})(.*)$")  # an opening fence: the fence, then its info
_GATE = re.compile(r"^(`{3,}|:{3,})\s*\{solution-(start|end)\}")


@dataclass
class Removed:
    """What one conversion took out of a notebook."""

    code_solutions: int = 0  # BEGIN/END regions replaced by the placeholder
    solution_blocks: int = 0  # markdown {solution} directives and gated solution ranges
    solution_cells: int = 0  # code cells tagged "solution"


def _source(cell) -> str:
    return "".join(cell.source) if isinstance(cell.source, list) else cell.source


def strip_code_solutions(source: str, where: str = "cell") -> tuple[str, int]:
    """Replace each ``# BEGIN SOLUTION`` ... ``# END SOLUTION`` region; return (source, count)."""
    kept, begin, count = [], None, 0
    for number, line in enumerate(source.split("\n"), start=1):
        marker = line.strip()
        if marker == BEGIN:
            if begin is not None:
                raise ValueError(f"{where}: nested '{BEGIN}' on line {number} (the one on line {begin} is not closed)")
            begin = number
            kept.append(line[: len(line) - len(line.lstrip())] + PLACEHOLDER)
        elif marker == END:
            if begin is None:
                raise ValueError(f"{where}: '{END}' on line {number} has no '{BEGIN}' before it")
            begin, count = None, count + 1
        elif begin is None:
            kept.append(line)
    if begin is not None:
        raise ValueError(f"{where}: '{BEGIN}' on line {begin} has no matching '{END}'")
    return "\n".join(kept), count


def _closes(line: str, fence: str) -> bool:
    """Whether ``line`` closes ``fence``: only the same character, at least as many times."""
    text = line.strip()
    return len(text) >= len(fence) and set(text) == {fence[0]}


def strip_solution_directives(source: str, where: str = "cell") -> tuple[str, int]:
    """Remove every ``{solution}`` directive from markdown; return (source, count)."""
    lines, kept, count, i = source.split("\n"), [], 0, 0
    open_fences: list[tuple[str, bool]] = []  # (fence, is a literal code block) still open
    while i < len(lines):
        line, opening = lines[i], _FENCE.match(lines[i])
        if open_fences and _closes(line, open_fences[-1][0]):
            open_fences.pop()
        elif open_fences and open_fences[-1][1]:
            pass  # inside a literal code block nothing is a directive
        elif opening and opening[2].strip().startswith("{solution}"):
            end = next((j for j in range(i + 1, len(lines)) if _closes(lines[j], opening[1])), None)
            if end is None:
                raise ValueError(f"{where}: the {{solution}} directive on line {i + 1} has no closing '{opening[1]}'")
            i, count = end + 1, count + 1
            continue
        elif opening:
            fence, info = opening[1], opening[2].strip()
            open_fences.append((fence, fence[0] == "`" and not info.startswith("{")))
        kept.append(line)
        i += 1
    return ("\n".join(kept).rstrip() if count else source), count


def _convert(nb: nbformat.NotebookNode, keep_outputs: bool = False) -> tuple[nbformat.NotebookNode, Removed]:
    student, removed = copy.deepcopy(nb), Removed()
    cells, gate_start = [], None
    for index, cell in enumerate(student.cells):
        where = f"cell {index}"
        gate = _GATE.match(_source(cell).strip()) if cell.cell_type == "markdown" else None
        if gate and gate[2] == "start":
            if gate_start is not None:
                raise ValueError(f"{where}: {{solution-start}} inside the one opened at cell {gate_start}")
            gate_start = index
        elif gate:
            if gate_start is None:
                raise ValueError(f"{where}: {{solution-end}} has no {{solution-start}} before it")
            gate_start, removed.solution_blocks = None, removed.solution_blocks + 1
        elif gate_start is not None:
            continue  # inside a gated solution
        elif cell.cell_type == "code" and "solution" in cell.get("metadata", {}).get("tags", []):
            removed.solution_cells += 1
        elif cell.cell_type == "code":
            cell.source, count = strip_code_solutions(_source(cell), where)
            if count or not keep_outputs:
                cell.outputs, cell.execution_count = [], None
            removed.code_solutions += count
            cells.append(cell)
        elif cell.cell_type == "markdown":
            cell.source, count = strip_solution_directives(_source(cell), where)
            removed.solution_blocks += count
            if cell.source.strip() or not count:
                cells.append(cell)
        else:
            cells.append(cell)
    if gate_start is not None:
        raise ValueError(f"cell {gate_start}: {{solution-start}} has no matching {{solution-end}}")
    note = nbformat.v4.new_markdown_cell(STUDENT_NOTE)
    if (student.nbformat, student.nbformat_minor) < (4, 5):
        note.pop("id", None)  # cell ids exist from nbformat 4.5 on
    else:
        note.id = "student-note"  # not a random one: the same chapter gives the same student file
    student.cells = [note] + cells
    return student, removed


def make_student_notebook(nb: nbformat.NotebookNode, keep_outputs: bool = False) -> nbformat.NotebookNode:
    """Return the student version of ``nb`` (``nb`` itself is not changed); ``keep_outputs`` keeps
    the outputs of the cells it leaves unchanged."""
    return _convert(nb, keep_outputs)[0]


def _notebooks(inputs) -> list[Path]:
    found: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found += sorted(item.glob("*.ipynb"))
        elif item.is_file() and item.suffix == ".ipynb":
            found.append(item)
        elif item.exists():
            raise ValueError(f"{item} is neither a folder nor a .ipynb notebook")
        else:
            raise FileNotFoundError(f"no such file or folder: {item}")
    unique = list({path.resolve(): path for path in found}.values())
    names = [path.name for path in unique]
    if duplicated := sorted({name for name in names if names.count(name) > 1}):
        raise ValueError(f"two input notebooks would be written to the same name: {', '.join(duplicated)}")
    return unique


def make_student_versions(inputs, out_dir, *, verbose: bool = False) -> list[Path]:
    """Write the student version of every notebook in ``inputs`` under ``out_dir``; return the paths.

    ``inputs`` are notebooks or folders (their ``*.ipynb``, not recursive). An input is never
    overwritten: writing a student version over its own source is an error.
    """
    out_dir = Path(out_dir)
    converted = []  # convert everything first, so that an error writes nothing
    for path in _notebooks(inputs):
        target = out_dir / path.name
        if target.resolve() == path.resolve():
            raise ValueError(f"refusing to overwrite the instructor notebook {path}: choose another --out")
        try:
            converted.append((target, *_convert(nbformat.read(path, as_version=4))))
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    for target, student, removed in converted:
        nbformat.write(student, target)
        if verbose:
            print(
                f"{target}: removed {removed.code_solutions} code solutions, "
                f"{removed.solution_blocks} solution blocks, {removed.solution_cells} solution cells"
            )
    return [target for target, _, _ in converted]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m logitlab.course.assignments",
        description="Write student versions of the book's notebooks, with the solutions removed.",
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="chapter notebooks, or folders of them")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the student notebooks")
    args = parser.parse_args(argv)
    try:
        make_student_versions(args.inputs, args.out, verbose=True)
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))


if __name__ == "__main__":
    main(sys.argv[1:])
