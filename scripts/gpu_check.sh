#!/usr/bin/env bash
# One command for whoever has an NVIDIA GPU: checks the GPU paths that no CPU machine (and no CI
# run) can, and prints ONE summary table (exit code, wall time, key number per step).
#
#   scripts/gpu_check.sh            # all steps (the Multi30k run needs its data, see below)
#   scripts/gpu_check.sh --quick    # skip the Multi30k experiment, shorter benchmark
#
# Steps:
#   1. train.py on the toy corpus (tests/fixtures/toy, de->en, debug=fast), one GPU, bf16 +
#      torch.compile, 40 updates                          -> final step, test BLEU
#   2. the same under torchrun on 2 GPUs (DDP), only with >= 2 GPUs, else "skipped (1 GPU)"
#   3. python -m benchmarks.benchmark on the GPU (fp32 / bf16 / bf16+compile, base preset), JSON
#                                                         -> ours' tokens/s and MFU, bf16+compile
#   4. train.py experiment=multi30k_en_de_gpu on Multi30k from $DATA_DIR (default
#      ../shared/data/multi30k); skipped with a message without the data or with --quick
#                                                         -> steps, test BLEU (results.json)
# Everything (logs, run dirs, benchmark.json) stays under one new temp dir, printed at the end.
# Uses the repo's .venv/bin/python when present, else python3 (override: PYTHON=...).
# Exits 1 when there is no CUDA GPU (one line, nothing run) or when any step failed.

set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

QUICK=0
for arg in "$@"; do
    case "$arg" in
        --quick) QUICK=1 ;;
        -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument '$arg' (use --quick or --help)" >&2; exit 2 ;;
    esac
done

if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PY="$ROOT/.venv/bin/python"
else
    PY="python3"
fi

# (a) No GPU: one line, nothing else.
if ! "$PY" -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
    echo "gpu_check.sh: no CUDA GPU (torch.cuda.is_available() is False for $PY); nothing run" >&2
    exit 1
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
N_GPUS="$("$PY" -c "import torch; print(torch.cuda.device_count())")"
DATA="${DATA_DIR:-$ROOT/../shared/data/multi30k}"
TOY=(debug=fast "data.dir=$ROOT/tests/fixtures/toy" data.src_lang=de data.tgt_lang=en
     "data.test_splits=[test]" logger=none "data.cache_dir=$WORK/cache"
     trainer.device=cuda trainer.precision=bf16 trainer.compile=true
     trainer.max_steps=40 trainer.eval_every=20 trainer.log_every=10)

echo "gpu_check.sh: $N_GPUS GPU(s): $("$PY" -c \
    "import torch; print(torch.cuda.get_device_name(0), '| torch', torch.__version__)")"
echo "gpu_check.sh: logs, run dirs and JSON under $WORK"

STEPS=() CODES=() SECONDS_=() KEYS=()
FAILED=0

# record NAME CODE SECONDS KEY: one row of the summary table.
record() {
    STEPS+=("$1") CODES+=("$2") SECONDS_+=("$3") KEYS+=("$4")
}

# run_step NAME LOG KEY_FUNCTION KEY_ARG -- COMMAND...: run it, log to LOG, time it, record it.
run_step() {
    local name="$1" log="$2" key_fn="$3" key_arg="$4"
    shift 5
    echo
    echo "== $name"
    echo "   $*"
    local start end code key
    start=$(date +%s.%N)
    "$@" >"$log" 2>&1
    code=$?
    end=$(date +%s.%N)
    if [[ $code -eq 0 ]]; then
        key="$("$key_fn" "$key_arg" 2>&1 | tail -n 1)"
    else
        FAILED=1
        key="FAILED, see $log"
        echo "   exit $code; last lines of $log:"
        tail -n 25 "$log" | sed 's/^/   | /'
    fi
    echo "   -> exit $code: $key"
    record "$name" "$code" "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", b - a }')" \
        "$key"
}

# results_key RUN_DIR: "step N, <split> BLEU x" from results.json.
results_key() {
    "$PY" - "$1/results.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
tests = ", ".join(f"{split} BLEU {s['bleu']:.2f}" for split, s in r["test"].items())
print(f"step {r['steps']} (best {r['best_step']}), valid BLEU {r['valid']['bleu']:.2f}, {tests}")
EOF
}

# benchmark_key JSON: ours' training tokens/s and MFU, bf16+compile at the largest batch.
benchmark_key() {
    "$PY" - "$1" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
entries = sorted(report["train"], key=lambda e: ("compile" in e["variant"], e["batch_tokens"]))
if not entries:
    sys.exit("no training entries in the benchmark JSON")
e = entries[-1]
r = e["results"]["ours"]
mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
print(f"{e['variant']} {e['batch_tokens']} tok: {r['tokens_per_s']:,.0f} tok/s, MFU {mfu}")
EOF
}

# 1. One GPU, bf16 + torch.compile, on the toy corpus.
run_step "train 1 GPU bf16+compile (toy)" "$WORK/train_1gpu.log" results_key "$WORK/toy_1gpu" -- \
    "$PY" train.py "${TOY[@]}" "hydra.run.dir=$WORK/toy_1gpu"

# 2. Two GPUs under torchrun (python -m torch.distributed.run is torchrun, from this Python).
if [[ "$N_GPUS" -ge 2 ]]; then
    run_step "train 2 GPUs torchrun (toy)" "$WORK/train_2gpu.log" results_key \
        "$WORK/toy_2gpu" -- \
        "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 train.py "${TOY[@]}" \
        "hydra.run.dir=$WORK/toy_2gpu"
else
    echo
    echo "== train 2 GPUs torchrun (toy): skipped (1 GPU)"
    record "train 2 GPUs torchrun (toy)" "-" "-" "skipped (1 GPU)"
fi

# 3. The benchmark's GPU defaults: preset base, fp32 / bf16 / bf16+compile, MFU.
BENCH=(--device cuda --json "$WORK/benchmark.json")
if [[ $QUICK -eq 1 ]]; then
    BENCH+=(--batch-tokens 4096 --repeats 3)
fi
run_step "benchmark.py (bf16, compile, MFU)" "$WORK/benchmark.log" benchmark_key \
    "$WORK/benchmark.json" -- "$PY" -m benchmarks.benchmark "${BENCH[@]}"

# 4. The GPU Multi30k experiment (conf/experiment/multi30k_en_de_gpu.yaml).
NAME="multi30k_en_de_gpu"
if [[ $QUICK -eq 1 ]]; then
    echo
    echo "== $NAME: skipped (--quick)"
    record "$NAME" "-" "-" "skipped (--quick)"
elif [[ ! -f "$DATA/train.en" ]]; then
    echo
    echo "== $NAME: skipped (no Multi30k at $DATA; set DATA_DIR=<folder with train.en ...>)"
    record "$NAME" "-" "-" "skipped (no data at $DATA)"
else
    run_step "$NAME" "$WORK/$NAME.log" results_key "$WORK/$NAME" -- \
        "$PY" train.py "experiment=$NAME" "data.dir=$DATA" "data.cache_dir=$WORK/cache" \
        "hydra.run.dir=$WORK/$NAME"
fi

echo
echo "== summary ($N_GPUS GPU(s); logs and run dirs under $WORK)"
printf '%-36s %5s %8s  %s\n' "step" "exit" "wall s" "key number"
for i in "${!STEPS[@]}"; do
    printf '%-36s %5s %8s  %s\n' "${STEPS[$i]}" "${CODES[$i]}" "${SECONDS_[$i]}" "${KEYS[$i]}"
done
if [[ $FAILED -ne 0 ]]; then
    echo "gpu_check.sh: at least one step FAILED" >&2
    exit 1
fi
echo "gpu_check.sh: all steps passed"
