#!/usr/bin/env bash
# One command for whoever has an NVIDIA GPU: measures and checks the GPU paths that no CPU
# machine (and no CI run) can, and prints ONE summary table (exit code, wall time, key number).
#
#   scripts/gpu_check.sh                        # all steps (Multi30k from $DATA_DIR, see 3.)
#   scripts/gpu_check.sh --quick                # small sizes, no Multi30k run: a smoke check
#   scripts/gpu_check.sh --out DIR --minutes 5  # logs, JSON and runs under DIR; 3.'s budget
#   scripts/gpu_check.sh --only train --minutes 10 --set trainer.max_tokens=8192
#                                               # one step; --set: 3.'s train.py overrides
#
# Steps:
#   1. python -m benchmarks.train_step: train.py's update for `base` and `big` at 16k tokens,
#      bf16, eager and compiled: tokens/s, MFU, syncs/update, kernel time over wall time,
#      peak memory                                        -> the best MFU
#   2. python -m benchmarks.finetune: an imported NLLB-shaped model fine-tuned in bf16, ours
#      against a plain Transformers loop on the same batches -> tokens/s, peak memory
#   3. train.py experiment=multi30k_en_de_gpu with trainer.max_minutes=$MINUTES (default 5)
#      on Multi30k from $DATA_DIR (default ../shared/data/multi30k), alone on the GPU; skipped
#      with a message without the data or with --quick  -> updates, test BLEU, wall seconds
#   4. train.py on the toy corpus under torchrun on 2 GPUs (DDP), only with >= 2 GPUs
# --quick runs 1. and 2. at small sizes, and a 40-update bf16 + compile toy run as 3.
# --only takes a comma list of step, finetune, train, torchrun (default: all four); --set
# KEY=VALUE (repeatable) is added to 3.'s train.py command. A step fails when its command or
# the reading of its key number fails.
# Uses the repo's .venv/bin/python when present, else python3 (override: PYTHON=...).
# Exits 1 when there is no CUDA GPU (one line, nothing run) or when any step failed.

set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

QUICK=0 OUT_DIR="" MINUTES=5 ONLY="step,finetune,train,torchrun" SETS=()
usage() {
    echo "gpu_check.sh: $1 (use --quick, --out DIR, --minutes N, --only STEPS, --set KEY=VALUE" \
        "or --help)" >&2
    exit 2
}
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --out) [[ $# -ge 2 && "$2" != --* ]] || usage "--out needs a folder"
               OUT_DIR="$2"; shift ;;
        --minutes) [[ "${2:-}" =~ ^[0-9]+([.][0-9]+)?$ ]] || usage "--minutes needs a number"
                   MINUTES="$2"; shift ;;
        --only) STEP_NAMES="(step|finetune|train|torchrun)"
                [[ "${2:-}" =~ ^$STEP_NAMES(,$STEP_NAMES)*$ ]] ||
                    usage "--only needs a comma list of step, finetune, train, torchrun"
                ONLY="$2"; shift ;;
        --set) KEY="[A-Za-z_][A-Za-z0-9_.]*"
               [[ "${2:-}" =~ ^((\+{1,2})?$KEY=.+|~$KEY(=.+)?)$ ]] ||
                   usage "--set needs a KEY=VALUE (Hydra's +KEY=, ++KEY=, ~KEY too)"
               SETS+=("$2"); shift ;;
        -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) usage "unknown argument '$1'" ;;
    esac
    shift
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

if [[ -n "$OUT_DIR" ]]; then
    mkdir -p "$OUT_DIR" && WORK="$(cd "$OUT_DIR" && pwd)"
else
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
fi
N_GPUS="$("$PY" -c "import torch; print(torch.cuda.device_count())")"
DATA="${DATA_DIR:-$ROOT/../shared/data/multi30k}"
TOY=(debug=fast "data.dir=$ROOT/tests/fixtures/toy" data.src_lang=de data.tgt_lang=en
     "data.test_splits=[test]" logger=none "data.cache_dir=$WORK/cache"
     trainer.device=cuda trainer.precision=bf16 trainer.compile=true
     trainer.max_steps=40 trainer.eval_every=20 trainer.log_every=10)

echo "gpu_check.sh: $N_GPUS GPU(s): $("$PY" -c \
    "import torch; print(torch.cuda.get_device_name(0), '| torch', torch.__version__)")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/gpu_check.sh: nvidia-smi: /'
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
    if [[ $code -eq 0 ]] && ! key="$("$key_fn" "$key_arg" 2>&1 | tail -n 1)"; then
        code=1  # the command passed, but what it wrote cannot be read
        key="FAILED reading its key number: $key"
        FAILED=1
    elif [[ $code -eq 0 ]]; then
        tail -n 12 "$log" | sed 's/^/   | /'
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
wall = f", wall {r['wall_seconds']:.0f} s" if "wall_seconds" in r else ""
print(f"step {r['steps']} (best {r['best_step']}), valid BLEU {r['valid']['bleu']:.2f}, "
      f"{tests}{wall}")
EOF
}

# step_key JSON: the best MFU of benchmarks.train_step's entries.
step_key() {
    "$PY" - "$1" <<'EOF'
import json, sys
e = max(json.load(open(sys.argv[1]))["entries"], key=lambda e: e["mfu"] or 0)
print(f"best: {e['preset']} {e['variant']} {e['tokens_per_s']:,.0f} tok/s, "
      f"MFU {100 * (e['mfu'] or 0):.1f}%, busy {100 * e['busy']:.0f}%")
EOF
}

# finetune_key JSON: ours' and Transformers' tokens/s and peak memory.
finetune_key() {
    "$PY" - "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(" | ".join(f"{name} {s['tokens_per_s']:,.0f} tok/s, peak {(s['peak_bytes'] or 0) / 2**30:.1f} GiB"
                 for name, s in r["results"].items()), f"| ours/transformers {r['ratio']['ours/transformers']:.2f}")
EOF
}

# wanted NAME: whether --only asks for step NAME.
wanted() { [[ ",$ONLY," == *",$1,"* ]]; }

# 1. train.py's update, base and big, eager and compiled.
STEP=(--device cuda --json "$WORK/train_step.json")
if [[ $QUICK -eq 1 ]]; then
    STEP+=(--presets tiny --batch-tokens 4096 --cycles 2)
fi
wanted step && run_step "training step (MFU)" "$WORK/train_step.log" step_key \
    "$WORK/train_step.json" -- "$PY" -m benchmarks.train_step "${STEP[@]}"

# 2. An imported NLLB-shaped model fine-tuned, ours against Transformers.
TUNE=(--device cuda --json "$WORK/finetune.json")
if [[ -f "$DATA/train.en" ]]; then
    TUNE+=(--src "$DATA/train.en" --tgt "$DATA/train.de")
fi
if [[ $QUICK -eq 1 ]]; then
    TUNE+=(--tiny --updates 20)
fi
wanted finetune && run_step "imported NLLB fine-tune" "$WORK/finetune.log" finetune_key \
    "$WORK/finetune.json" -- "$PY" -m benchmarks.finetune "${TUNE[@]}"

# 3. Time to BLEU: the GPU Multi30k experiment on a wall-clock budget, alone on the GPU.
NAME="multi30k_en_de_gpu"
if [[ ${#SETS[@]} -gt 0 ]] && { [[ $QUICK -eq 1 || ! -f "$DATA/train.en" ]] || ! wanted train; }
then
    echo "gpu_check.sh: --set applies to the Multi30k run only, which does not run here" >&2
fi
if ! wanted train; then
    :
elif [[ $QUICK -eq 1 ]]; then
    run_step "train 1 GPU bf16+compile (toy)" "$WORK/train_1gpu.log" results_key \
        "$WORK/toy_1gpu" -- "$PY" train.py "${TOY[@]}" "hydra.run.dir=$WORK/toy_1gpu"
elif [[ ! -f "$DATA/train.en" ]]; then
    echo
    echo "== $NAME: skipped (no Multi30k at $DATA; set DATA_DIR=<folder with train.en ...>)"
    record "$NAME" "-" "-" "skipped (no data at $DATA)"
else
    run_step "$NAME, $MINUTES min" "$WORK/$NAME.log" results_key "$WORK/$NAME" -- \
        "$PY" train.py "experiment=$NAME" "data.dir=$DATA" "data.cache_dir=$WORK/cache" \
        "trainer.max_minutes=$MINUTES" trainer.max_steps=0 "hydra.run.dir=$WORK/$NAME" \
        ${SETS[@]+"${SETS[@]}"}
fi

# 4. Two GPUs under torchrun (python -m torch.distributed.run is torchrun, from this Python).
if ! wanted torchrun; then
    :
elif [[ "$N_GPUS" -ge 2 ]]; then
    run_step "train 2 GPUs torchrun (toy)" "$WORK/train_2gpu.log" results_key \
        "$WORK/toy_2gpu" -- \
        "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 train.py "${TOY[@]}" \
        "hydra.run.dir=$WORK/toy_2gpu"
else
    echo
    echo "== train 2 GPUs torchrun (toy): skipped (1 GPU)"
    record "train 2 GPUs torchrun (toy)" "-" "-" "skipped (1 GPU)"
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
