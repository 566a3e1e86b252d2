#!/usr/bin/env bash
# One arm of the experiment: train through experiment=audio_captioning_clotho on the short
# utterances, test the best checkpoint with mmtf.evaluate, print the WER.
#   experiments/short_utterances_specaugment/run.sh <name> [hydra overrides ...]
# e.g. run.sh fixed model.encoder.spec_augment.time_mask_mode=fixed
#      run.sh none model.encoder.spec_augment.time_masks=0
# ROOT: the data (make_data.py); OUT: where runs go; PYTHON: the interpreter;
# EPOCHS (6) and VAL_EVERY (3): the training budget and how often it validates; SEED (12345).
set -euo pipefail
name=$1; shift
ROOT=${ROOT:-/tmp/short_utts}
OUT=${OUT:-/tmp/su_runs}
PYTHON=${PYTHON:-python}
here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
$PYTHON -m mmtf.train experiment=audio_captioning_clotho data.root="$ROOT" \
    model/encoder=audio_small model/decoder=text_small tokenizer.vocab_size=256 \
    data.loader.num_workers=0 data.loader.persistent_workers=false \
    model.optimizer.lr=2e-3 model.warmup_steps=100 \
    model.generation.strategy=greedy '~model.generation.num_beams' \
    trainer.max_epochs=${EPOCHS:-6} trainer.check_val_every_n_epoch=${VAL_EVERY:-3} \
    "model.test_metrics=[bleu,rouge_l,cider_d]" test=false \
    seed=${SEED:-12345} paths.log_dir="$OUT/$name" "$@"
run=$(ls -d "$OUT/$name"/*/runs/* | tail -1)
best=$(ls "$run"/checkpoints/epoch_*.ckpt | tail -1)
$PYTHON -m mmtf.evaluate ckpt_path="$best" paths.log_dir="$OUT/$name/eval"
pred=$(ls -t "$OUT/$name"/eval/*/runs/*/predictions.jsonl 2>/dev/null | head -1 || true)
[ -n "$pred" ] || pred=$(find "$OUT/$name/eval" -name predictions.jsonl | head -1)
$PYTHON "$here/wer.py" "$pred" | tee "$OUT/$name/wer.json"
