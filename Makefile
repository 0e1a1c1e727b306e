# tcdsl — developer entry points.  Start with `make demo` or `make test`.

SHELL   := /bin/bash
PYTHON  ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.stamp
SRC     := tcdsl core grammar polyhedral codegen
POCL_ICD := /etc/OpenCL/vendors/pocl.icd
# mypy knows nothing of setuptools' package-dir, so `lint` type-checks a tree of symlinks
# laid out like the installed package (tcdsl/core -> core/, tcdsl/grammar -> grammar/, ...).
TYPETREE := build/typecheck

.PHONY: venv demo test lint docs sysdeps clean

venv: $(STAMP)

# Reinstalls only when pyproject.toml changes (or the venv is new).
$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip setuptools wheel
	$(VPY) -m pip install -q -e '.[test]'
	@touch $@

demo: venv
	$(VPY) examples/demo.py

# Any non-zero pytest exit fails the target, 5 ("no tests collected") included.  The tests run in
# worker processes, one per core up to 4 (pytest-xdist): most of their time is spent in the C
# compiler, one core each.
test: venv sysdeps
	$(VPY) -m pytest -q -n auto --maxprocesses 4

lint: venv
	@rm -rf $(TYPETREE) && mkdir -p $(TYPETREE)/tcdsl
	@for f in tcdsl/*; do \
	  case $$f in */__pycache__) ;; *) ln -s "$(CURDIR)/$$f" "$(TYPETREE)/$$f" ;; esac; \
	done
	@for d in $(filter-out tcdsl,$(SRC)); do ln -s "$(CURDIR)/$$d" "$(TYPETREE)/tcdsl/$$d"; done
	@status=0; \
	(set -x; $(VPY) -m ruff check .) || status=1; \
	(set -x; $(VPY) -m mypy $(TYPETREE)/tcdsl) || status=1; \
	exit $$status

# The documentation site: the API reference from the docstrings, the README and the notebooks with
# their stored outputs, as HTML in docs/_build/html.  Any Sphinx warning fails the target; -E reads
# every page again (Sphinx does not see a changed docstring, and would not repeat an old warning).
docs: venv
	$(VPY) -m sphinx -b html -W --keep-going -E -j 1 -q docs docs/_build/html
	@echo "docs: open docs/_build/html/index.html"

# PoCL runs the OpenCL form of the GPU kernels on the CPU.  Cheap when already installed.
sysdeps:
	@if [ -e $(POCL_ICD) ]; then \
	  :; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "sysdeps: not root, skipping pocl-opencl-icd (OpenCL tests will be skipped)"; \
	else \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends pocl-opencl-icd; \
	fi

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis docs/_build docs/_notebooks
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
