# `make train`: create .venv, install, train the default (CartPole-v1) until solved.
# `make test`:  create/update .venv, run the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test install clean

install: $(STAMP)

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/python train.py --stop_at_return 475 $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest tests -q $(ARGS)

clean:
	rm -rf $(VENV) train_dir *.egg-info
