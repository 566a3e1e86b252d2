#!/usr/bin/env bash
# One GPU, at most 10 minutes (the step limits below add up to about 560 s): install mmtf beside the image's torch, run the CUDA tests, the
# attention / decoding / training-step benchmarks at GPU sizes and a short main job with
# trainer=gpu; everything goes to one results file.
#
#   bash experiments/gpu_check/run.sh            # from the repository root
#
# Results: $OUT/gpu_check_results.md when OUT is set, else experiments/gpu_check/results/.
# Needs: a CUDA GPU, python with torch 2.11-2.14 (+ its torchaudio/torchvision), and the package
# registry for what the image lacks. torch, torchaudio and torchvision are never replaced: the
# install is constrained to the versions already there.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
RESULTS_DIR=${OUT:-experiments/gpu_check/results}
mkdir -p "$RESULTS_DIR"
RESULTS="$RESULTS_DIR/gpu_check_results.md"
LOGS="$RESULTS_DIR/logs"
mkdir -p "$LOGS"
START=$(date +%s)
: > "$RESULTS"

note() { echo "$*" | tee -a "$RESULTS"; }
elapsed() { echo $(( $(date +%s) - START )); }

# step NAME SECONDS CMD...: run with a time limit; keep the full log, put its tail (and the last
# JSON line, if any) in the results file; never stop the script on a failure.
step() {
    local name=$1 limit=$2; shift 2
    note ""
    note "## $name  (limit ${limit} s, started at +$(elapsed) s)"
    note '```'
    note "\$ $*"
    timeout --signal=INT --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    grep -v '^\s*$' "$LOGS/$name.log" | tail -n 40 >> "$RESULTS"
    note '```'
    note "exit status $rc$([ $rc -eq 124 ] && echo ' (time limit)'), took $(( $(date +%s) - START )) s since start"
}

note "# mmtf GPU check, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/GPU: /' | tee -a "$RESULTS"

# -- install: the machine may reach no package registry. With wheels carried in .whl/ (the
# packages the image lacks, see the README), they go to a private target dir and mmtf runs from
# the checkout; otherwise pip installs mmtf and what is missing, torch* pinned as installed --
PINS=$(mktemp)
$PY - > "$PINS" <<'EOF'
import importlib.metadata as md
for name in ("torch", "torchaudio", "torchvision"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
EOF
note "pinned: $(tr '\n' ' ' < "$PINS")"
if compgen -G ".whl/*.whl" > /dev/null; then
    SITE=$(mktemp -d)
    step install 90 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$SITE" .whl/*.whl
    export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
    step install 120 bash -c "$PY -m pip install --no-deps -e . && $PY -m pip install -c $PINS -e '.[dev,bench]'"
fi
step versions 20 $PY -c "import torch, torchaudio, torchvision, lightning, transformers, mmtf; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchaudio', torchaudio.__version__, 'torchvision', torchvision.__version__, 'lightning', lightning.__version__, 'transformers', transformers.__version__); print('device', torch.cuda.get_device_name(), 'bf16', torch.cuda.is_bf16_supported())"

# -- CUDA tests: the fused-kernel checks of the attention core (tests marked gpu) --
step cuda_tests 60 $PY -m pytest -m gpu tests/unit/perf/test_cuda_attention.py -q -rs -p no:cacheprovider

# -- benchmarks at GPU sizes (short settings: the whole script must fit 8 minutes) --
step attention 45 $PY experiments/gpu_check/attention.py --dtype bfloat16 --quick
step decoding 50 $PY experiments/kv_cache_decoding/run.py --device cuda --no-compile --repeats 3
step training_throughput 110 $PY experiments/training_throughput/run.py --device cuda \
    --sizes default,whisper --batch 128 --repeats 3 --steps 5 --loss-steps 40 --no-compile

# -- the prefix LLM (TinyLlama-size, random weights): bf16-mixed plain vs FSDP2, generation --
step llm_prefix 120 $PY experiments/gpu_check/llm_prefix.py

# -- DDP: two processes need two GPUs under NCCL; say what this machine has --
note ""
note "GPUs on this machine: $($PY -c 'import torch; print(torch.cuda.device_count())' 2>&1)"

# -- the main job on the GPU, short: 2 epochs (data generation included); checkpoints stay in
# a temporary run dir, its metrics and log come back --
RUN_DIR=$(mktemp -d)/run
step main_job 90 $PY -m mmtf.train experiment=audio_captioning trainer=gpu trainer.max_epochs=2 \
    data.loader.num_workers=4 data.loader.persistent_workers=true "hydra.run.dir=$RUN_DIR"
cp "$RUN_DIR/metrics.json" "$LOGS/main_job_metrics.json" 2>/dev/null
grep -h "\[perf\]" "$LOGS/main_job.log" "$RUN_DIR"/*.log 2>/dev/null | sort -u | head -n 8 \
    | sed 's/^/perf: /' >> "$RESULTS"
note "metrics: $(tr -d '\n ' < "$RUN_DIR/metrics.json" 2>/dev/null | cut -c1-600)"

note ""
note "total: $(elapsed) s"
echo "results: $RESULTS"
