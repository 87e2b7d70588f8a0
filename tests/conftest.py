import os

# The book is built and tested with no model hub: make any accidental download fail fast.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: over ~15 s on the 2-core CPU; `make test-lower` leaves these out (the main run keeps them)",
    )


# The chapters that take longest on the 2-core CPU, run first so that they do not end the run.
LONGEST_CHAPTERS = ["02_", "04_", "07_", "06_", "09_", "08_", "03_", "05_"]


def pytest_collection_modifyitems(session, config, items):
    """Run the chapters first, the longest first; build the book last, and open it in a browser
    after that: the book renders the chapters that tests/test_chapters.py executed in this run."""

    def order(item):
        path = str(item.fspath)
        if path.endswith("test_chapters.py") and "runs_with_and_without" in item.name:
            rank = next((i for i, c in enumerate(LONGEST_CHAPTERS) if f"[{c}" in item.name), len(LONGEST_CHAPTERS))
            return (0, rank)
        return (1 + ("test_book.py" in path) + 2 * ("test_site_in_browser.py" in path), 0)

    items.sort(key=order)
