# Two commands from a fresh clone:  `make train`  and  `make test`.
# Both create (or reuse) .venv and install everything into it.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# torch goes in first so nothing later can upgrade it. On a machine with an NVIDIA driver,
# PyPI's default Linux wheel is the CUDA build; without one, set TORCH_SPEC/TORCH_PIP_ARGS to
# choose a CPU build (e.g. TORCH_PIP_ARGS="--index-url <pytorch cpu index>").
TORCH_SPEC     ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# The Multi30k folder `make train` trains on (data.dir), whether or not the Hub is reachable:
# by default ../shared/data/multi30k when that folder exists, else empty, and then train.py
# loads bentrevett/multi30k from the Hugging Face Hub. A DATA_DIR given is always passed.
DATA_DIR ?= $(firstword $(wildcard ../shared/data/multi30k))
EXPERIMENT ?= multi30k_en_de
TRAIN_ARGS ?=

.PHONY: venv train test test-all lint bench clean

venv: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

# Default experiment (CPU-sized Multi30k en->de: 37 min on a 2-core AMD EPYC Zen 4 with
# AVX512-BF16, venv included, test2016 BLEU 38.58 beam 5; README, Results).
# Uses local Multi30k files when ../shared/data/multi30k exists, else the Hub dataset
# bentrevett/multi30k.
# Override: make train DATA_DIR=/path/to/multi30k TRAIN_ARGS="trainer.max_steps=500"
train: venv
	$(BIN)/python train.py experiment=$(EXPERIMENT) \
		$(if $(DATA_DIR),data.dir=$(DATA_DIR)) $(TRAIN_ARGS)

test: venv
	$(BIN)/python -m pytest -q -m "not slow and not corpus"

test-all: venv
	$(BIN)/python -m pytest -q

lint: venv
	$(BIN)/ruff check .

bench: venv
	$(BIN)/python -m pip install -q -e ".[bench]"
	$(BIN)/python -m benchmarks.benchmark $(BENCH_ARGS)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
