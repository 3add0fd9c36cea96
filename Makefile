# tritonpack — `make help` lists the targets.
SHELL := /bin/bash
NEEDS_PYTHON := 3.11# .venv's: the bundled tritonserver runs the python stub of the interpreter that builds and serves
PYTHON ?= python$(NEEDS_PYTHON)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NAME ?= bert
TARGET ?=
MODEL ?=
WEIGHTS ?=
GRAPHDEF ?=# dali_inception: the TF-slim frozen graph (passed as --weights)
MODEL_FORMAT ?=# dali_inception: graphdef (default) | onnx
IO_NAMES ?=# INPUT:OUTPUT, e.g. INPUT0:OUTPUT0: the ensemble's public tensor names for existing client code
NO_ENV ?=# 1: the MME tarball without its packed environment (the server's Python provides the packages)
ENVS ?= text openvino onnx# make env: which envs/<name>/environment.yml to pack
PYTHON_VERSION ?=# the MME tarball's environment for this Python instead of TRITON_CONTAINER's (e.g. 3.11: the local stub's)
TRITON_CONTAINER ?=# the Triton container release the tarball is for (default 24.09, the current SageMaker Triton image)
MME_PORT ?= 8080
CONTAINER_PYTHON ?=# make mme: the stub's Python: auto (the container's where this machine runs it, as the endpoint), local (this interpreter's), or X.Y
MAX_MODELS ?= 8
BENCH ?= full# make bench: full | smoke (small corpus, one repetition, no peer installs; what CI runs)
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

BUILD_ARGS = $(NAME) $(if $(TARGET),--target $(TARGET))$(if $(IO_NAMES), --io-names $(IO_NAMES)) $(if $(MODEL),--model '$(MODEL)') $(if $(WEIGHTS),--weights '$(WEIGHTS)')$(if $(GRAPHDEF), --weights '$(GRAPHDEF)')$(if $(and $(WEIGHTS),$(GRAPHDEF)),$(error WEIGHTS and GRAPHDEF both name the weights: give one))$(if $(MODEL_FORMAT), --model-format $(MODEL_FORMAT))$(if $(NO_ENV), --no-env)$(if $(TRITON_CONTAINER), --container $(TRITON_CONTAINER))$(if $(PYTHON_VERSION), --env-python $(PYTHON_VERSION))
MME_ARGS = --models dist --port $(MME_PORT) --max-models $(MAX_MODELS)$(if $(CONTAINER_PYTHON), --container-python $(CONTAINER_PYTHON))
# The repository of NAME: for TARGET if given, else the target its last build chose (recorded by `tritonpack build`).
CHOSEN = $(or $(TARGET),$(shell cat dist/.$(NAME).target 2>/dev/null),portable)
REPO = dist/$(NAME)-$(CHOSEN)

.PHONY: help setup ensemble build serve test soak lint clean env check mme mme-load bench bench-smoke

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || { $(PYTHON) -c 'import sys; sys.exit("%d.%d" % sys.version_info[:2] != "$(NEEDS_PYTHON)")' 2>/dev/null \
	  || { echo "error: .venv needs Python $(NEEDS_PYTHON) (the bundled tritonserver's python stub runs its version), and $(PYTHON) is missing or another version: install it (apt install python$(NEEDS_PYTHON)-venv, or pyenv install $(NEEDS_PYTHON)) or name one: make $(or $(MAKECMDGOALS),setup) PYTHON=/path/to/python$(NEEDS_PYTHON)" >&2; exit 2; }; \
	  $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	@touch $@

setup: $(STAMP) ## create .venv with the pinned dependencies (every target does this when needed)

ensemble: $(STAMP) ## build NAME (default bert) for TARGET, check it, serve it in the local Triton, show an answer
	$(BIN)/tritonpack build $(BUILD_ARGS) --smoke

build: $(STAMP) ## build dist/NAME-TARGET/ and its MME tarball without serving
	$(BIN)/tritonpack build $(BUILD_ARGS)

serve: $(STAMP) ## serve dist/NAME-TARGET in the local Triton until Ctrl-C
	$(BIN)/tritonpack serve $(REPO)

env: $(STAMP) ## pack ENVS (text openvino onnx) into dist/envs/ (conda-pack when conda is on PATH, else venv-pack)
	$(BIN)/tritonpack env $(ENVS) $(if $(PYTHON_VERSION),--python $(PYTHON_VERSION))$(if $(TRITON_CONTAINER), --container $(TRITON_CONTAINER))

check: $(STAMP) ## will dist/NAME-TARGET.tar.gz load on an MME? artifacts vs configs too (--deep); exit 1 if not
	$(BIN)/tritonpack check $(REPO).tar.gz --deep $(if $(TRITON_CONTAINER),--container $(TRITON_CONTAINER))

mme: $(STAMP) ## local SageMaker MME on MME_PORT (8080) serving dist/*.tar.gz from their environments, as the endpoint (CONTAINER_PYTHON=local: this interpreter's packages); builds NAME-TARGET first if missing
	@$(BIN)/python -c 'import sys; from tritonpack.cli import parsed; parsed(sys.argv[1:])' mme $(MME_ARGS)  # before a build
	@test -f $(REPO).tar.gz || $(BIN)/tritonpack build $(BUILD_ARGS)
	@$(if $(filter portable,$(CHOSEN)),echo "invoke: $(BIN)/tritonpack infer --mme http://127.0.0.1:$(MME_PORT) --target-model $(notdir $(REPO)).tar.gz 'some text'",echo "note: $(notdir $(REPO)).tar.gz is a $(CHOSEN) build: the local MME cannot load it (its Triton has only the python backend); make build NAME=$(NAME) TARGET=portable builds one it serves")
	$(BIN)/tritonpack mme $(MME_ARGS)

mme-load: $(STAMP) ## local MME under locust load, faults injected on a schedule (~90 s) → dist/mme-load/report.md
	$(BIN)/python -m tests.reliability.mme_load --out dist/mme-load

test: $(STAMP) ## run the test suite (unit tests and real-tritonserver tests)
	$(BIN)/python -m pytest

soak: $(STAMP) ## reliability soak: 10,000 mixed requests per ensemble, fuzzed archives (figures: dist/soak/)
	$(BIN)/python -m pytest -m soak -s tests/test_soak.py tests/test_mme_load.py
	TRITONPACK_FUZZ_EXAMPLES=2000 $(BIN)/python -m pytest tests/test_archive_fuzz.py

bench: $(STAMP) ## served bert side by side with its peers, memory, cold start (~20-25 min; first run makes the peer venvs) → dist/bench/report.md
	$(BIN)/python -m benchmarks --mode $(BENCH)

bench-smoke: $(STAMP) ## the quick bench (small corpus, one repetition, c=1 and 8, no peer installs) → dist/bench/report.md
	$(BIN)/python -m benchmarks --mode smoke

lint: $(STAMP) ## ruff
	$(BIN)/ruff check .

clean: ## remove dist/ (keeps .venv)
	rm -rf dist
