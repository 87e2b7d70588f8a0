import os

# The book is built and tested with no model hub: make any accidental download fail fast.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: over ~15 s on the 2-core CPU; `make test-lower` leaves these out (the main run keeps them)",
    )


def pytest_collection_modifyitems(session, config, items):
    """Build the book last, and open it in a browser after that: the book renders the chapters
    that nbmake has executed in this run."""
    items.sort(key=lambda item: ("test_book.py" in str(item.fspath)) + 2 * ("test_site_in_browser.py" in str(item.fspath)))
