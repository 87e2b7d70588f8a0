"""Student versions of the notebooks (logitlab.course.assignments), on small notebooks built here."""

import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from logitlab.course.assignments import (
    PLACEHOLDER,
    STUDENT_NOTE,
    make_student_notebook,
    make_student_versions,
)

RAISE = 'raise NotImplementedError("Exercise: write your solution here")'


def notebook(*cells, **metadata):
    return new_notebook(cells=list(cells), metadata=metadata)


def student_cells(*cells):
    """The student cells after the note, as (type, source) pairs."""
    student = make_student_notebook(notebook(*cells))
    assert student.cells[0].cell_type == "markdown" and student.cells[0].source == STUDENT_NOTE
    return [(cell.cell_type, cell.source) for cell in student.cells[1:]]


def test_placeholder_is_the_documented_line():
    assert PLACEHOLDER == RAISE


def test_one_region_keeps_signature_docstring_and_check():
    source = (
        "def double(x):\n"
        '    """Return 2 x."""\n'
        "    # BEGIN SOLUTION\n"
        "    y = x + x\n"
        "    return y\n"
        "    # END SOLUTION\n"
        "\n"
        "ll.checks.check_double(double)"
    )
    expected = (
        "def double(x):\n"
        '    """Return 2 x."""\n'
        f"    {RAISE}\n"
        "\n"
        "ll.checks.check_double(double)"
    )
    assert student_cells(new_code_cell(source)) == [("code", expected)]


def test_two_regions_at_their_own_indentation():
    source = (
        "class Sampler:\n"
        "    def a(self):\n"
        "        # BEGIN SOLUTION\n"
        "        return 1\n"
        "        # END SOLUTION\n"
        "\n"
        "# BEGIN SOLUTION\n"
        "helper = 2\n"
        "# END SOLUTION\n"
        "check(Sampler)\n"
    )
    expected = (
        "class Sampler:\n"
        "    def a(self):\n"
        f"        {RAISE}\n"
        "\n"
        f"{RAISE}\n"
        "check(Sampler)\n"
    )
    assert student_cells(new_code_cell(source)) == [("code", expected)]


def test_tab_indentation_and_cells_without_markers_are_kept_exactly():
    plain = "import torch\nx = torch.zeros(3)  # BEGIN SOLUTION is only a comment here\n"
    tabbed = "def f():\n\t# BEGIN SOLUTION\n\treturn 1\n\t# END SOLUTION"
    assert student_cells(new_code_cell(plain), new_code_cell(tabbed)) == [
        ("code", plain),
        ("code", f"def f():\n\t{RAISE}"),
    ]


@pytest.mark.parametrize(
    "source, message",
    [
        ("def f():\n    # BEGIN SOLUTION\n    return 1\n", r"cell 1: '# BEGIN SOLUTION' on line 2 has no matching"),
        ("x = 1\n# END SOLUTION\n", r"cell 1: '# END SOLUTION' on line 2 has no '# BEGIN SOLUTION'"),
        ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", r"cell 1: nested '# BEGIN SOLUTION' on line 2"),
    ],
)
def test_marker_errors_name_the_cell(source, message):
    nb = notebook(new_markdown_cell("# Title"), new_code_cell(source))
    with pytest.raises(ValueError, match=message):
        make_student_notebook(nb)


@pytest.mark.parametrize(
    "solution",
    [
        ":::{solution} ex-top-k\n:class: dropdown\n\nKeep the k largest.\n:::",
        "::::{solution} ex-top-k\n:::{note}\nA note inside.\n:::\n::::",
        "```{solution} ex-top-k\nKeep the k largest.\n```",
        "````{solution} ex-top-k\n```python\nx = 1\n```\n````",
        "\n  :::{solution} ex-top-k\nText.\n:::\n",
    ],
)
def test_solution_cells_are_removed(solution):
    cells = student_cells(new_markdown_cell("Before."), new_markdown_cell(solution), new_markdown_cell("After."))
    assert cells == [("markdown", "Before."), ("markdown", "After.")]


def test_solution_after_exercise_text_removes_only_the_solution():
    source = (
        ":::{exercise} ex-min-p\n"
        "Write `min_p`.\n"
        ":::\n"
        "\n"
        "::::{solution} ex-min-p\n"
        ":class: dropdown\n"
        ":::{hint}\n"
        "Scale by the maximum.\n"
        ":::\n"
        "::::\n"
        "\n"
        "Then try the next one.\n"
        "\n"
        "```{solution} ex-other\n"
        "Another answer.\n"
        "```\n"
    )
    expected = ":::{exercise} ex-min-p\nWrite `min_p`.\n:::\n\n\nThen try the next one."
    assert student_cells(new_markdown_cell(source)) == [("markdown", expected)]


def test_exercise_cells_and_literal_examples_are_kept():
    exercise = "```{exercise} ex-1\nImplement `top_k`.\n```"
    literal = "How to write one:\n\n````markdown\n:::{solution} ex-1\nAnswer.\n:::\n````"
    assert student_cells(new_markdown_cell(exercise), new_markdown_cell(literal)) == [
        ("markdown", exercise),
        ("markdown", literal),
    ]


def test_unclosed_solution_directive_is_an_error():
    with pytest.raises(ValueError, match=r"cell 0: the \{solution\} directive on line 1 has no closing ':::'"):
        make_student_notebook(notebook(new_markdown_cell(":::{solution} ex\nAnswer.\n")))


def test_solution_tagged_code_cells_are_removed():
    tagged = new_code_cell("print('answer')", metadata={"tags": ["solution", "hide-input"]})
    other = new_code_cell("print('keep')", metadata={"tags": ["hide-input"]})
    assert student_cells(tagged, other) == [("code", "print('keep')")]


def test_gated_solution_removes_every_cell_in_between():
    cells = student_cells(
        new_markdown_cell(":::{exercise} ex\nDo it.\n:::"),
        new_markdown_cell(":::{solution-start} ex\n:::"),
        new_code_cell("answer = 1"),
        new_markdown_cell("Explained."),
        new_markdown_cell(":::{solution-end}\n:::"),
        new_code_cell("check()"),
    )
    assert cells == [("markdown", ":::{exercise} ex\nDo it.\n:::"), ("code", "check()")]
    with pytest.raises(ValueError, match=r"cell 0: \{solution-start\} has no matching"):
        make_student_notebook(notebook(new_markdown_cell("```{solution-start} ex\n```")))


def test_outputs_cleared_metadata_kept_and_input_unchanged():
    cell = new_code_cell("1 + 1", execution_count=3, outputs=[new_output("execute_result", {"text/plain": "2"}, execution_count=3)])
    nb = notebook(cell, new_markdown_cell(":::{solution} ex\nA.\n:::"), kernelspec={"name": "python3", "display_name": "Python 3"})
    before = nbformat.writes(nb)
    student = make_student_notebook(nb)
    assert nbformat.writes(nb) == before
    assert student.metadata.kernelspec == {"name": "python3", "display_name": "Python 3"}
    assert student.cells[1].outputs == [] and student.cells[1].execution_count is None
    assert len(student.cells) == 2
    nbformat.validate(student)


def instructor_notebook():
    return notebook(
        new_markdown_cell("# Tiny chapter"),
        new_code_cell("def check(f):\n    assert f(3) == 6\n    print('correct')"),
        new_code_cell("def double(x):\n    # BEGIN SOLUTION\n    return 2 * x\n    # END SOLUTION\n\ncheck(double)"),
        new_code_cell("print('after the exercise')"),
        new_markdown_cell(":::{solution} ex\nMultiply by two.\n:::"),
        new_code_cell("print('solution cell')", metadata={"tags": ["solution"]}),
    )


def test_make_student_versions_writes_files(tmp_path):
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    nbformat.write(instructor_notebook(), chapters / "01_a.ipynb")
    nbformat.write(notebook(new_code_cell("x = 1")), chapters / "02_b.ipynb")
    written = make_student_versions([chapters], tmp_path / "student")
    assert [path.name for path in written] == ["01_a.ipynb", "02_b.ipynb"]
    student = nbformat.read(written[0], as_version=4)
    assert [cell.source for cell in student.cells[3:]] == [
        f"def double(x):\n    {RAISE}\n\ncheck(double)",
        "print('after the exercise')",
    ]
    with pytest.raises(ValueError, match="refusing to overwrite"):
        make_student_versions([chapters / "01_a.ipynb"], chapters)


def run_cli(*args, cwd):
    command = [sys.executable, "-m", "logitlab.course.assignments", *map(str, args)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_cli_writes_one_student_notebook_per_input(tmp_path):
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    nbformat.write(instructor_notebook(), chapters / "01_a.ipynb")
    single = tmp_path / "extra.ipynb"
    nbformat.write(notebook(new_code_cell("x = 1")), single)
    result = run_cli(chapters, single, "--out", "out/student", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out" / "student").iterdir()) == ["01_a.ipynb", "extra.ipynb"]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    assert "01_a.ipynb: removed 1 code solutions, 1 solution blocks, 1 solution cells" in lines[0]
    assert "extra.ipynb: removed 0 code solutions" in lines[1]


def test_cli_rejects_a_missing_input(tmp_path):
    result = run_cli(tmp_path / "no_such_chapter.ipynb", "--out", tmp_path / "student", cwd=tmp_path)
    assert result.returncode == 2
    assert "no such file or folder" in result.stderr and "no_such_chapter.ipynb" in result.stderr
    assert not (tmp_path / "student").exists()


def execute(nb, tmp_path):
    NotebookClient(nb, kernel_name="python3", timeout=60, resources={"metadata": {"path": str(tmp_path)}}).execute()


def test_student_notebook_fails_at_the_exercise_and_instructor_passes(tmp_path):
    instructor = instructor_notebook()
    execute(instructor, tmp_path)
    assert instructor.cells[2].outputs[0].text == "correct\n"

    student = make_student_notebook(instructor_notebook())
    exercise = next(i for i, cell in enumerate(student.cells) if "def double" in cell.source)
    with pytest.raises(CellExecutionError) as raised:
        execute(student, tmp_path)
    assert raised.value.ename == "NotImplementedError"
    errors = [i for i, cell in enumerate(student.cells) if any(o.output_type == "error" for o in cell.get("outputs", []))]
    assert errors == [exercise]  # the check call under the stub raises, in the exercise cell
    assert student.cells[exercise + 1].execution_count is None  # and execution stopped there
