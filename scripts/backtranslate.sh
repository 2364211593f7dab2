#!/usr/bin/env bash
# Back-translation end to end (Sennrich et al. 2016; tagged: Caswell et al. 2019) on a simulated
# low-resource Multi30k English -> German: the first REAL training pairs are the parallel data,
# the German side of the other pairs is the monolingual text.
#
#   scripts/backtranslate.sh WORK [MULTI30K_DIR]          # MULTI30K_DIR: ../shared/data/multi30k
#
# Steps (each skipped when its output exists, so a rerun continues where it stopped):
#   1. WORK/data: train.{en,de} (the first REAL pairs), mono.de (the German of the others),
#      valid.*, test2016.* (copied)
#   2. WORK/reverse: a de->en model on the real pairs (experiment=multi30k_de_en)
#   3. WORK/data/bt.{en,de}: mono.de and its translation into English by that model
#      (translate.py, BT_ARGS: default beam 5)
#   4. WORK/real_only: en->de on the real pairs (experiment=multi30k_en_de)
#   5. WORK/real_bt: en->de on real + back-translated pairs tagged <BT>, weights 1:1
#      (experiment=multi30k_en_de_bt); UNTAGGED=1 adds WORK/real_bt_untagged (no tag)
# and prints each run's test2016 BLEU. Environment: REAL (10000), TRAIN_ARGS (train.py
# overrides for every run, e.g. "trainer.max_steps=300"), BT_ARGS (translate.py search flags,
# default "--beam 5"), PYTHON (python).
set -euo pipefail

WORK=${1:?usage: scripts/backtranslate.sh WORK [MULTI30K_DIR]}
CORPUS=${2:-../shared/data/multi30k}
REAL=${REAL:-10000}
PYTHON=${PYTHON:-python}
read -r -a TRAIN_ARGS <<< "${TRAIN_ARGS:-}"
read -r -a BT_ARGS <<< "${BT_ARGS:---beam 5}"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA=$WORK/data

fail() { echo "backtranslate.sh: error: $*" >&2; exit 2; }
[[ -f $CORPUS/train.en && -f $CORPUS/train.de ]] ||
    fail "$CORPUS has no train.en/train.de; pass the Multi30k folder as the second argument"
[[ $REAL =~ ^[0-9]+$ ]] && (( REAL > 0 )) || fail "REAL=$REAL must be a positive number"
total=$(wc -l < "$CORPUS/train.de")
(( REAL < total )) || fail "REAL=$REAL leaves no monolingual text: $CORPUS has $total pairs"
mkdir -p "$DATA"
WORK=$(cd "$WORK" && pwd) && DATA=$WORK/data && CORPUS=$(cd "$CORPUS" && pwd)

train() {  # train RUN_NAME overrides...: one run, resumed if it stopped, skipped if done
    local name=$1; shift
    [[ -f $WORK/$name/results.json ]] && return
    (cd "$ROOT" && "$PYTHON" train.py "$@" "data.dir=$DATA" "${TRAIN_ARGS[@]}" \
        "hydra.run.dir=$WORK/$name")
}

if [[ ! -f $DATA/mono.de ]]; then
    echo "== 1. data: $REAL real pairs, $(( total - REAL )) monolingual German sentences"
    head -n "$REAL" "$CORPUS/train.en" > "$DATA/train.en"
    head -n "$REAL" "$CORPUS/train.de" > "$DATA/train.de"
    for file in "$CORPUS"/valid.* "$CORPUS"/test*.*; do cp "$file" "$DATA/"; done
    tail -n +"$(( REAL + 1 ))" "$CORPUS/train.de" > "$DATA/mono.de.tmp"
    mv "$DATA/mono.de.tmp" "$DATA/mono.de"
fi

echo "== 2. reverse model de->en on the real pairs"
train reverse experiment=multi30k_de_en

if [[ ! -f $DATA/bt.en ]]; then
    echo "== 3. back-translating $DATA/mono.de (${BT_ARGS[*]})"
    (cd "$ROOT" && "$PYTHON" translate.py -c "$WORK/reverse" --input "$DATA/mono.de" \
        --output "$DATA/bt.en.tmp" "${BT_ARGS[@]}")
    cp "$DATA/mono.de" "$DATA/bt.de"
    mv "$DATA/bt.en.tmp" "$DATA/bt.en"
fi

echo "== 4. en->de on the real pairs only"
train real_only experiment=multi30k_en_de
echo "== 5. en->de on real + back-translated pairs tagged <BT>"
train real_bt experiment=multi30k_en_de_bt
if [[ ${UNTAGGED:-0} == 1 ]]; then
    echo "== 5b. en->de on real + back-translated pairs, untagged"
    train real_bt_untagged experiment=multi30k_en_de_bt data.corpora.bt.tag=null
fi

echo "== test BLEU"
for name in real_only real_bt real_bt_untagged; do
    [[ -f $WORK/$name/results.json ]] || continue
    "$PYTHON" - "$WORK/$name/results.json" "$name" <<'EOF'
import json, sys
results = json.load(open(sys.argv[1]))
for split, score in results["test"].items():
    print(f"{sys.argv[2]:18} {split:16} BLEU {score['bleu']:.2f}  {score['signature']}")
EOF
done
