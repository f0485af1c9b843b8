# dlrm-cache developer entry points. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# CPU machines: torch 2.13.0 (CPU build) pairs with fbgemm-gpu-cpu 1.8.0 and torchrec 1.8.0.
# torchrec is installed with --no-deps: it declares the multi-GB CUDA fbgemm-gpu package.
TORCH_PINS    ?= torch==2.13.0 fbgemm-gpu-cpu==1.8.0
TORCHREC_PIN  ?= torchrec==1.8.0
TORCHREC_DEPS ?= tensordict torchmetrics pyre-extensions iopath
SYNTH_ARGS    ?=
TRAIN_ARGS    ?=
NPROC         ?= 2
PLAN_ARGS     ?=
# pytest-xdist workers for `make test`: one per CPU this process may use, at most 4 (a container
# may show the host's CPUs; each worker holds its own datasets and torch); each runs whole modules
# (--dist loadfile: a module's shared runs and datasets are made once)
TEST_WORKERS  ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
PARALLEL      := -n $(TEST_WORKERS) --dist loadfile

.PHONY: help install train test test-quick lint format data train-dist bench plan gpu-extra clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip "setuptools>=68" wheel
	$(BIN)/pip install --quiet $(TORCH_PINS) $(TORCHREC_DEPS)
	$(BIN)/pip install --quiet --no-deps $(TORCHREC_PIN)
	$(BIN)/pip install --quiet -e '.[test,lint]'
	touch $(STAMP)

install: $(STAMP) ## create .venv with everything (idempotent)

data: $(STAMP) ## generate the default synthetic Criteo data and preprocess it
	$(BIN)/dlrm-cache synth $(SYNTH_ARGS)
	$(BIN)/dlrm-cache preprocess

train: data ## install, make the default data, train + evaluate (the main job)
	$(BIN)/dlrm-cache train $(TRAIN_ARGS)

train-dist: data ## the same job as `make train` over NPROC processes (torchrun, gloo on CPU)
	$(BIN)/torchrun --standalone --nproc-per-node $(NPROC) --no-python $(BIN)/dlrm-cache train $(TRAIN_ARGS)

plan: data ## predicted freq_cache hit rate per cache ratio for the default job (its data, batch, model)
	$(BIN)/dlrm-cache plan $(PLAN_ARGS)

bench: $(STAMP) ## embedding-layer benchmark (docs/benchmarks.md: real numbers need a GPU)
	$(BIN)/dlrm-cache bench

test: $(STAMP) ## install and run the test suite (TEST_WORKERS parallel workers, whole modules each)
	$(BIN)/python -m pytest -q $(PARALLEL)

test-quick: $(STAMP) ## the unit-level tests only (not the modules marked slow in tests/conftest.py)
	$(BIN)/python -m pytest -q -m "not slow" $(PARALLEL)

lint: $(STAMP) ## ruff (lint rules and format, pyproject.toml) and mypy on dlrm_cache/
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP) ## rewrite the sources in ruff's format (line length 100)
	$(BIN)/ruff format .

# A GPU machine without a network nor pytest (an offline bundle): carry pytest (pure Python) there.
GPU_EXTRA_PKGS := pytest _pytest pluggy iniconfig packaging pygments py.py
gpu-extra: $(STAMP) ## pack pytest into .gpu-extra/ for an offline GPU machine (scripts/gpu_check.sh)
	mkdir -p .gpu-extra
	cd $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") && \
	  tar --exclude=__pycache__ -czf $(CURDIR)/.gpu-extra/pytest.tar.gz.tmp \
	  $(GPU_EXTRA_PKGS) $$(ls -d pytest-*.dist-info pluggy-*.dist-info iniconfig-*.dist-info \
	  packaging-*.dist-info pygments-*.dist-info)
	mv .gpu-extra/pytest.tar.gz.tmp .gpu-extra/pytest.tar.gz
	@ls -l .gpu-extra/pytest.tar.gz

clean: ## remove generated data, runs and the virtualenv
	rm -rf $(VENV) runs outputs multirun data/synth
