import os

import pytest

# The book is built and tested with no model hub: make any accidental download fail fast.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: over ~15 s on the 2-core CPU; `make test-lower` leaves these out (the main run keeps them)",
    )
    config.addinivalue_line(
        "markers",
        "statistical: a sampler's output tested against its exact distribution (chi-square over many draws): "
        "the arithmetic under test is torch's, the same in .venv-lower, so `make test-lower` leaves these out "
        "(it keeps the tests of the statistical harness itself, which uses scipy)",
    )


# The tests that take longest on the 2-core CPU (a full `make test` run's durations, longest
# first), run first so that they do not end the run: a worker that starts a long test near the end
# leaves the other core idle until it finishes.
CHAPTER = "test_chapter_runs_with_and_without_each_solution[{}"
LONGEST = [CHAPTER.format(n) for n in ("12_", "04_", "07_", "06_")] + [
    "test_every_lookahead_slot_is_accepted_on_counting", "test_every_medusa_head_is_accepted_on_counting"] + [
    CHAPTER.format(n) for n in ("08_", "02_", "03_", "09_", "05_", "10_", "13_", "11_", "01_")]


def pytest_collection_modifyitems(session, config, items):
    """Run the longest tests first (the chapters among them), then the other tests marked slow,
    then the rest; build the book last, and open it in a browser after that: the book renders
    the chapters that tests/test_chapters.py executed in this run."""

    def order(item):
        path = str(item.fspath)
        if "test_book.py" in path or "test_site_in_browser.py" in path:
            return (3 + ("test_site_in_browser.py" in path), 0)
        rank = next((i for i, name in enumerate(LONGEST) if name in item.nodeid), None)
        if rank is not None:
            return (0, rank)
        slow = item.get_closest_marker("slow") or path.endswith(".ipynb")  # .ipynb: a notebook run by nbmake
        return (1 if slow else 2, 0)

    items.sort(key=order)


@pytest.fixture(scope="session")
def smollm():
    """The real model and its tokenizer on the CPU (fast path), loaded once per test process and
    shared by every module that needs it (each module loading its own copy cost 2-5 s, a dozen
    times per worker). A test that changes the model must undo the change."""
    import logitlab as ll

    return ll.load("smollm2-135m", device="cpu")


@pytest.fixture
def untraced(monkeypatch):
    """The checks without their library tracer, for tests that hand a check the library's own code
    as the right answer (to test the check's cases, not its guard)."""
    import contextlib

    from logitlab.course.checks import common

    monkeypatch.setattr(common, "library_watched", contextlib.nullcontext)
