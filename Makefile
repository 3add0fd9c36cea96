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
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

BUILD_ARGS = $(NAME) $(if $(TARGET),--target $(TARGET)) $(if $(MODEL),--model $(MODEL)) $(if $(WEIGHTS),--weights $(WEIGHTS))
REPO = dist/$(NAME)-$(or $(TARGET),portable)

.PHONY: help setup ensemble build serve test lint clean

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

test: $(STAMP) ## run the test suite (unit tests and real-tritonserver tests)
	$(BIN)/python -m pytest

lint: $(STAMP) ## ruff
	$(BIN)/ruff check .

clean: ## remove dist/ (keeps .venv)
	rm -rf dist
