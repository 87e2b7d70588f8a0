"""logitlab.course.checks as a package: one module per chapter, the shared helpers in checks.common,
and every check still reachable as ll.checks.check_<name> (the notebooks call them that way)."""

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
import torch

import logitlab as ll
from logitlab.course.checks.common import CheckFailed, as_list, call, show

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
CHECKS_DIR = Path(ll.checks.__file__).parent
CHAPTER_MODULES = sorted(m.name for m in pkgutil.iter_modules([str(CHECKS_DIR)]) if re.match(r"ch\d\d_", m.name))


def checks_defined_in(module_name):
    module = importlib.import_module(f"logitlab.course.checks.{module_name}")
    return {name for name, fn in inspect.getmembers(module, inspect.isfunction)
            if name.startswith("check_") and fn.__module__ == module.__name__}


def test_one_checks_module_per_chapter():
    assert [path.name[:2] for path in CHAPTERS] == [name[2:4] for name in CHAPTER_MODULES]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_each_chapter_module_holds_the_checks_its_notebook_calls(path):
    (module,) = [name for name in CHAPTER_MODULES if name.startswith(f"ch{path.name[:2]}_")]
    called = set(re.findall(r"ll\.checks\.(check_\w+)\(", path.read_text()))
    assert called and checks_defined_in(module) == called


def test_the_package_reexports_every_check_and_check_failed():
    everything = {name for module in CHAPTER_MODULES for name in checks_defined_in(module)}
    assert set(ll.checks.__all__) == everything | {"CheckFailed"}
    for module in CHAPTER_MODULES:
        for name in checks_defined_in(module):
            assert getattr(ll.checks, name) is getattr(importlib.import_module(f"logitlab.course.checks.{module}"), name)
    assert ll.checks.CheckFailed is CheckFailed and issubclass(CheckFailed, AssertionError)


def test_show_writes_small_tensors_out_and_large_ones_by_shape():
    assert show(torch.tensor([[1.0, 2.0 / 3.0]])) == "[[1.0, 0.6667]]"
    assert show(torch.tensor([3, -1])) == "[3, -1]"
    assert show(torch.zeros(2, 7)) == "a tensor of shape (2, 7)"


def test_call_reports_the_case_and_lets_unwritten_exercises_through():
    assert call(lambda a, b: a + b, "Case 1", 2, 3) == 5
    with pytest.raises(CheckFailed, match="^Case 2: your function raised ZeroDivisionError: division by zero$"):
        call(lambda: 1 / 0, "Case 2")

    def unwritten():
        raise NotImplementedError("Exercise: write your solution here")

    with pytest.raises(NotImplementedError):
        call(unwritten, "Case 3")


def test_as_list_accepts_lists_tuples_and_tensors():
    assert as_list(torch.tensor([-1, 0, 0])) == [-1, 0, 0]
    assert as_list((-1, 0)) == [-1, 0]
    assert as_list([-1]) == [-1]
    assert as_list(None) is None  # anything else is left as it is, for the check to report


@pytest.mark.parametrize("path", sorted(CHECKS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_checks_import_no_private_name_and_give_every_generator_a_device(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert not [a.name for a in node.names if a.name.startswith("_")], f"{path.name}:{node.lineno}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Generator":
            assert any(k.arg == "device" for k in node.keywords), f"{path.name}:{node.lineno}"
