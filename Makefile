# `make train`: create .venv, install, train the default (CartPole-v1) until solved.
# `make test`:  create/update .venv, run the linter (`make lint` alone), then the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test lint install clean

install: $(STAMP)

# torch first, then the package without build isolation, so that setup.py sees torch and compiles
# the kernels in sf_engine/csrc against it; NumPy with torch, since setup.py imports torch, which warns
# "Failed to initialize NumPy" where NumPy is not installed yet
$(STAMP): pyproject.toml setup.py $(wildcard sf_engine/csrc/*.cpp)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q torch==2.13.0 'numpy>=1.24'
	$(BIN)/python -m pip install -q --no-build-isolation -e '.[test]'
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/python train.py --stop_at_return 475 $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest tests -q $(ARGS)

clean:
	rm -rf $(VENV) train_dir *.egg-info build sf_engine/model/_recurrent_loops*.so sf_engine/model/_cpu_kernels*.so
