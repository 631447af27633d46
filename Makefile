# hydrali: the two commands of the README.
#   make train   set up .venv, then run `hydrali` with its defaults (add ARGS="key=value ...")
#   make test    set up .venv, then check the code with ruff (lint, format) and run the test suite
#   make lint    ruff alone: `ruff check` and `ruff format --check` (pyproject.toml [tool.ruff])
PYTHON ?= python3
VENV   ?= .venv
# torch: a CPU build is pinned where no NVIDIA driver is present, so that pip does not pull
# several GB of CUDA packages; on a GPU machine the index's default (CUDA) build is used.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
ARGS ?=

.PHONY: setup train lint test clean

$(VENV)/.installed: pyproject.toml
	@echo "hydrali: setting up $(VENV): torch, DALI, Lightning, TensorFlow, MLflow (the first time 3 to 5 minutes" \
	      "and 4.7 GB; pip's output goes to $(VENV)/setup.log)"
	@$(PYTHON) -m venv $(VENV)
	@( $(VENV)/bin/pip install --upgrade pip && \
	   $(VENV)/bin/pip install "$(TORCH_SPEC)" && \
	   $(VENV)/bin/pip install -e ".[test,keras]" && \
	   $(VENV)/bin/pip install --no-build-isolation nvidia-dali-tf-plugin-cuda120 ) > $(VENV)/setup.log 2>&1 \
	 || { tail -n 25 $(VENV)/setup.log; echo "hydrali: set-up failed: the whole log is $(VENV)/setup.log"; exit 1; }
	@# DALI's TensorFlow plugin (last step) builds against the installed TensorFlow: after it, without isolation
	@touch $@
	@echo "hydrali: $(VENV) is ready"

setup: $(VENV)/.installed

train: setup
	$(VENV)/bin/hydrali $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(VENV)/bin/python -m pytest -q $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun mlflow.db mlflow.db.lock mlartifacts data
