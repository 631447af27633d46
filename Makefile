# hydrali: the two commands of the README.
#   make train   set up .venv, then run `hydrali` with its defaults (add ARGS="key=value ...")
#   make test    set up .venv, then check the code with ruff (lint, format) and run the test suite on TEST_WORKERS
#                processes (pytest-xdist; a file's tests run on one: its module fixtures train once; the files
#                that share the session's trained runs run on one, the longest files first, with one OpenMP and
#                one TensorFlow intra-op thread: tests/conftest.py), its 25 slowest tests listed at the end
#   make lint    ruff alone: `ruff check` and `ruff format --check` (pyproject.toml [tool.ruff])
PYTHON ?= python3
VENV   ?= .venv
# torch and torchvision (timm needs it), installed first: on a GPU machine the index's newest builds; elsewhere a pinned
# pair. There is no CPU build of torchvision on PyPI, and its CUDA wheels do not load with a CPU torch, so the pair is
# the CUDA build, which runs on the CPU (about 4.5 GB, taken from a local wheel index where pip has one).
# "yes" where an NVIDIA driver is present
GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
TORCH_SPEC ?= $(if $(GPU),torch torchvision,torch==2.14.1 torchvision==0.29.1)
ARGS ?=
# test processes of `make test` (pytest-xdist): CI's machine has 2 cores; each test's runs are mostly one busy core
TEST_WORKERS ?= 2
# backend=keras's extra (pyproject.toml): on a GPU machine TensorFlow with its CUDA libraries and an XLA-ready cuDNN
KERAS_EXTRA ?= $(if $(GPU),keras-cuda,keras)
# triton (torch's compiler of GPU kernels) crashes a process that loads it after TensorFlow (in-process tests of both
# frameworks), and a CPU has no use for it: removed where no NVIDIA driver is present
REMOVE_TRITON ?= $(if $(GPU),true,$(VENV)/bin/pip uninstall -y triton)

.PHONY: setup train lint test clean

$(VENV)/.installed: pyproject.toml
	@echo "hydrali: setting up $(VENV): torch, DALI, Lightning, TensorFlow, MLflow (the first time 3 to 5 minutes" \
	      "and 8.6 GB; pip's output goes to $(VENV)/setup.log)"
	@$(PYTHON) -m venv $(VENV)
	@( $(VENV)/bin/pip install --upgrade pip && \
	   $(VENV)/bin/pip install $(TORCH_SPEC) && \
	   $(VENV)/bin/pip install -e ".[test,$(KERAS_EXTRA)]" && \
	   $(VENV)/bin/pip install --no-build-isolation nvidia-dali-tf-plugin-cuda120 && \
	   $(REMOVE_TRITON) ) > $(VENV)/setup.log 2>&1 \
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
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun mlflow.db mlflow.db.lock mlartifacts data .hydrali_cache
