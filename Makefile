# Two commands do all set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint clean

install: $(STAMP)

# Reinstalls only when the pins or the package metadata change.
$(STAMP): requirements/cpu.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements/cpu.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps torchrec==1.8.0
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gemtrain demo configs/demo.yaml

# The report tests render HTML in headless Chromium (Debian's package; needs root or sudo).
test: $(STAMP)
	bash .ci/install-chromium.sh || echo "warning: chromium could not be installed; the browser tests will fail"
	$(PY) -m pytest -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs data .pytest_cache
