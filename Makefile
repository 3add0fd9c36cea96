# tritonpack — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NAME ?= bert
TARGET ?=
MODEL ?=
WEIGHTS ?=
GRAPHDEF ?=# dali_inception: the TF-slim frozen graph (passed as --weights)
MODEL_FORMAT ?=# dali_inception: graphdef (default) | onnx
ENV ?=# 1: pack the python models' environments into their folders (EXECUTION_ENV_PATH), for SageMaker
ENVS ?= text openvino onnx# make env: which envs/<name>/environment.yml to pack
PYTHON_VERSION ?=# make env / ENV=1: the target container's Python (default: this interpreter's, the local stub's)
TRITON_CONTAINER ?=# make env / make check: a Triton container release (e.g. 24.10) instead of PYTHON_VERSION
MME_PORT ?= 8080
MAX_MODELS ?= 8
BENCH ?= full# make bench: full | smoke (small corpus, one repetition, no peer installs; what CI runs)
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

BUILD_ARGS = $(NAME) $(if $(TARGET),--target $(TARGET)) $(if $(MODEL),--model $(MODEL)) $(if $(WEIGHTS),--weights $(WEIGHTS))$(if $(GRAPHDEF), --weights $(GRAPHDEF))$(if $(MODEL_FORMAT), --model-format $(MODEL_FORMAT))$(if $(ENV), --env)$(if $(PYTHON_VERSION), --env-python $(PYTHON_VERSION))
REPO = dist/$(NAME)-$(or $(TARGET),portable)

.PHONY: help setup ensemble build serve test soak lint clean env check mme bench bench-smoke

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	@touch $@

setup: $(STAMP) ## create .venv with the pinned dependencies (every target does this when needed)

ensemble: $(STAMP) ## build NAME (default bert) for TARGET, serve it in the local Triton and show an answer
	$(BIN)/tritonpack build $(BUILD_ARGS) --smoke

build: $(STAMP) ## build dist/NAME-TARGET/ and its MME tarball without serving
	$(BIN)/tritonpack build $(BUILD_ARGS)

serve: $(STAMP) ## serve dist/NAME-TARGET in the local Triton until Ctrl-C
	$(BIN)/tritonpack serve $(REPO)

env: $(STAMP) ## pack ENVS (text openvino onnx) into dist/envs/ (conda-pack when conda is on PATH, else venv-pack)
	$(BIN)/tritonpack env $(ENVS) $(if $(PYTHON_VERSION),--python $(PYTHON_VERSION))$(if $(TRITON_CONTAINER), --container $(TRITON_CONTAINER))

check: $(STAMP) ## will dist/NAME-TARGET.tar.gz load on an MME? one line per problem, exit 1 if not
	$(BIN)/tritonpack check $(REPO).tar.gz $(if $(TRITON_CONTAINER),--container $(TRITON_CONTAINER))

mme: $(STAMP) ## local SageMaker MME on MME_PORT (8080) serving dist/*.tar.gz; builds NAME-TARGET first if missing
	@test -f $(REPO).tar.gz || $(BIN)/tritonpack build $(BUILD_ARGS)
	@echo "invoke: $(BIN)/tritonpack infer --mme http://127.0.0.1:$(MME_PORT) --target-model $(notdir $(REPO)).tar.gz 'some text'"
	$(BIN)/tritonpack mme --models dist --port $(MME_PORT) --max-models $(MAX_MODELS)

test: $(STAMP) ## run the test suite (unit tests and real-tritonserver tests)
	$(BIN)/python -m pytest

soak: $(STAMP) ## reliability soak: 10,000 mixed requests per ensemble, fuzzed archives, slow tests (figures: dist/soak/)
	$(BIN)/python -m pytest -m soak -s tests/test_soak.py
	$(BIN)/python -m pytest -m slow
	TRITONPACK_FUZZ_EXAMPLES=2000 $(BIN)/python -m pytest tests/test_archive_fuzz.py

bench: $(STAMP) ## served bert side by side with its peers, memory, cold start (~15 min; first run makes the peer venvs) → dist/bench/report.md
	$(BIN)/python -m benchmarks --mode $(BENCH)

bench-smoke: $(STAMP) ## the quick bench (small corpus, one repetition, c=1 and 8, no peer installs) → dist/bench/report.md
	$(BIN)/python -m benchmarks --mode smoke

lint: $(STAMP) ## ruff
	$(BIN)/ruff check .

clean: ## remove dist/ (keeps .venv)
	rm -rf dist
