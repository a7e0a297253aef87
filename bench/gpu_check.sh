#!/usr/bin/env bash
# GPU check in one call: correctness on CUDA first, then every kernel at paper shapes against its
# peers, then a short table. Installs nothing; runs from the repository root without installing
# swift-fast (PYTHONPATH=.); the native CPU extension is not needed.
#
#   OUT=/some/dir bash bench/gpu_check.sh        # results under $OUT (default ./out/gpu_check)
#
# Liger-Kernel is a peer when importable, or when its wheel lies in .whl/ or bench/wheels/
# (unpacked to a temporary folder, not installed). Budget: at most 8.8 minutes on one H200 (the
# sum of the step timeouts), 12.8 where vLLM is installed; each step has its own, so a slow step
# cannot starve the next.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out/gpu_check}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
PY="${PYTHON:-$(command -v python || command -v python3)}"
START=$(date +%s)
: >"$OUT/status.txt"

LIGER_DIR=""
for whl in .whl/liger_kernel-*.whl bench/wheels/liger_kernel-*.whl; do
    if [ -f "$whl" ]; then
        LIGER_DIR="$(mktemp -d)"
        "$PY" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$whl" "$LIGER_DIR"
        export PYTHONPATH="$PYTHONPATH:$LIGER_DIR"
        break
    fi
done

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null
    "$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
    "$PY" -c "import liger_kernel, importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))" 2>/dev/null \
        || echo "liger-kernel: not importable (Liger rows skipped)"
} | tee "$OUT/env.txt"

step() {  # step NAME TIMEOUT_S COMMAND...
    local name="$1" limit="$2"
    shift 2
    echo "== $name (limit ${limit}s, at $(( $(date +%s) - START ))s)"
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    tail -n 3 "$OUT/$name.txt"
    echo "$name: exit $rc" | tee -a "$OUT/status.txt"
}

# 1. correctness: the GPU cases of the kernel tests (same cases as the interpreter runs)
step gpu_tests 120 "$PY" -m pytest -q -m gpu tests/test_kernels_streaming.py tests/test_kernels_swift_reduce.py \
    tests/test_kernels_token_logprobs.py tests/test_kernels_sar_from_logits.py -p no:cacheprovider \
    --junitxml="$OUT/gpu_tests.xml"

# 2. benchmarks, most important first, one JSON per step (a timeout loses that step only)
BENCH=(-q --benchmark-only -p no:cacheprovider --benchmark-columns=min,median,max)
step bench_copy 25 "$PY" -m pytest bench/test_bench_copy.py "${BENCH[@]}" --benchmark-json="$OUT/bench_copy.json"
step bench_swift_reduce 50 "$PY" -m pytest bench/test_bench_swift_reduce.py "${BENCH[@]}" -k "not sweep" \
    --benchmark-json="$OUT/bench_swift_reduce.json"
step bench_token_logprobs 70 "$PY" -m pytest bench/test_bench_token_logprobs.py "${BENCH[@]}" \
    -k "not sweep and not torch_compile" --benchmark-json="$OUT/bench_token_logprobs.json"
# torch.compile apart: its first compilations take tens of seconds on a fresh machine
step bench_torch_compile 70 "$PY" -m pytest bench/test_bench_token_logprobs.py "${BENCH[@]}" -k "torch_compile" \
    --benchmark-json="$OUT/bench_torch_compile.json"
step bench_sar 45 "$PY" -m pytest bench/test_bench_sar.py "${BENCH[@]}" --benchmark-json="$OUT/bench_sar.json"
step bench_streaming 25 "$PY" -m pytest bench/test_bench_streaming.py "${BENCH[@]}" \
    --benchmark-json="$OUT/bench_streaming.json"
# 3. launch-setting sweeps (informative; the defaults are in the kernels' files)
step bench_sweeps 30 "$PY" -m pytest bench/test_bench_swift_reduce.py bench/test_bench_token_logprobs.py \
    "${BENCH[@]}" -k sweep --benchmark-json="$OUT/bench_sweeps.json"

# 4. scoring inside Hugging Face generate, Llama-3.1-8B shape (random weights on the device),
#    batch 64, 64 new tokens: plain generate vs the scorer (DESIGN 6: naive hooks cost +4.5%)
step hf_generate 90 "$PY" bench/bench_hf_generate.py --device cuda --hidden 4096 --layers 32 --vocab 128256 \
    --batch 64 --new-tokens 64 --reps 3 --json "$OUT/hf_generate.json"

# 5. only where vLLM is installed: generation with the plugin off and on, on Model Runner V2 (vLLM's
#    GPU default: its FULL CUDA graphs replay the plugin's projections into the accumulator), SAR and
#    an emitted head beside; 16-layer Llama shape, random weights. The first engine compiles.
if "$PY" -c "import vllm" 2>/dev/null; then
    step vllm_mrv2 240 "$PY" bench/bench_vllm_throughput.py --runner v2 --hidden 2048 --layers 16 --vocab 32000 \
        --batch 64 --prompt-len 256 --tokens 128 --rounds 3 --kv-gib 8 --sar --emitted --json "$OUT/vllm_mrv2.json"
else
    echo "vllm_mrv2: skipped (vLLM is not installed)" | tee -a "$OUT/status.txt"
fi

[ -n "$LIGER_DIR" ] && rm -rf "$LIGER_DIR"
echo "== done in $(( $(date +%s) - START ))s; full results in $OUT"
cat "$OUT/status.txt"
"$PY" bench/summarize.py "$OUT"/bench_*.json --markdown "$OUT/summary.md"
