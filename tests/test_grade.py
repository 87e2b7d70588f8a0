"""`python -m logitlab.grade`: every returned notebook runs in its own kernel and scratch folder,
and each exercise gets passed, failed (with the check's message), not attempted, error, timeout
or missing; a broken notebook gets a row saying so and the run goes on."""

import csv

import nbformat
import pytest

from logitlab.grade import grade, main

SETUP = "import logitlab as ll\nimport torch"
RIGHT = "def expected_tokens(alpha, gamma):\n    return sum(alpha ** i for i in range(gamma + 1))\n\nll.checks.check_expected_tokens(expected_tokens)"
WRONG = "def expected_tokens(alpha, gamma):\n    return 1 / (1 - alpha)\n\nll.checks.check_expected_tokens(expected_tokens)"
UNWRITTEN = ("def expected_tokens(alpha, gamma):\n    raise NotImplementedError(\"Exercise: write your solution here\")\n\n"
             "ll.checks.check_expected_tokens(expected_tokens)")
SOFTMAX = "def sm(z, t):\n    return torch.softmax(z / t, -1) if t > 0 else torch.nn.functional.one_hot(z.argmax(-1), z.shape[-1]).float()\n\nll.checks.check_softmax(sm)"
SHORT_CUT = "ll.checks.check_softmax(lambda z, t: ll.softmax(z, t))"


def notebook(folder, name, *cells):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, folder / f"{name}.ipynb")


@pytest.mark.slow
def test_a_class_is_graded_exercise_by_exercise(tmp_path):
    class_ = tmp_path / "returned"
    class_.mkdir()
    notebook(class_, "ada", SETUP, RIGHT, SOFTMAX)
    notebook(class_, "bob", SETUP, WRONG, SHORT_CUT)
    notebook(class_, "cy", SETUP, UNWRITTEN, "undefined_name + 1\nll.checks.check_softmax(None)")
    hog = "try:\n    hog = torch.ones(2 * 2**30)  # 8 GiB: over the limit\n    limited = False\nexcept RuntimeError:\n    limited = True"
    notebook(class_, "dee", SETUP, hog, "assert limited, 'no memory limit'\n" + RIGHT)  # deleted the softmax exercise
    notebook(class_, "eve", SETUP, "open('../../stolen.txt', 'w').write('x')\nimport time\ntime.sleep(60)", RIGHT, SOFTMAX)
    (class_ / "fay.ipynb").write_text("{ not json")
    rows = {r["student"]: r for r in grade(class_, tmp_path / "grades.csv", timeout=25, memory_gb=6)}

    assert rows["ada"]["check_expected_tokens"] == rows["ada"]["check_softmax"] == "passed"
    assert rows["bob"]["check_expected_tokens"].startswith("failed: expected_tokens(")
    assert "asks for your own implementation" in rows["bob"]["check_softmax"]
    assert rows["cy"]["check_expected_tokens"] == "not attempted"
    assert rows["cy"]["check_softmax"].startswith("error: NameError")
    assert rows["dee"]["check_softmax"] == "missing" and "deleted" in rows["dee"]["note"]
    assert rows["dee"]["check_expected_tokens"] == "passed"  # the memory limit stopped one cell, not the notebook
    assert rows["eve"]["check_expected_tokens"] == "timeout" and "timed out" in rows["eve"]["note"]
    assert rows["fay"]["check_softmax"] == "not graded" and "not a valid notebook" in rows["fay"]["note"]
    assert [rows[s]["passed"] for s in ["ada", "bob", "cy", "dee", "eve", "fay"]] == [2, 0, 0, 1, 0, 0]
    with open(tmp_path / "grades.csv") as f:
        sheet = list(csv.DictReader(f))
    assert [r["student"] for r in sheet] == ["ada", "bob", "cy", "dee", "eve", "fay"]
    assert list(sheet[0])[:3] == ["student", "check_expected_tokens", "check_softmax"]
    assert not (tmp_path / "stolen.txt").exists() and not list(tmp_path.glob("*/stolen.txt"))


def test_bad_arguments_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path / "nowhere")])
    assert "folder must be a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path)])  # empty
    assert "no .ipynb notebook" in capsys.readouterr().err
