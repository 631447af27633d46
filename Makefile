# hydrali: the two commands of the README.
#   make train   set up .venv, then run `hydrali` with its defaults (add ARGS="key=value ...")
#   make test    set up .venv, then run the test suite
PYTHON ?= python3
VENV   ?= .venv
# torch: a CPU build is pinned where no NVIDIA driver is present, so that pip does not pull
# several GB of CUDA packages; on a GPU machine the index's default (CUDA) build is used.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
ARGS ?=

.PHONY: setup train test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VENV)/bin/pip install -q -e ".[test,keras]"
	# DALI's TensorFlow plugin builds against the installed TensorFlow: after it, without isolation
	$(VENV)/bin/pip install -q --no-build-isolation nvidia-dali-tf-plugin-cuda120
	touch $@

setup: $(VENV)/.installed

train: setup
	$(VENV)/bin/hydrali $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest -q $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun mlflow.db mlartifacts data
