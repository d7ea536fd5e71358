#!/usr/bin/env bash
# gpu_check.sh: one prepared end-to-end check of autotune on a machine with NVIDIA GPUs.
#
# What it runs, each step under `timeout`, carrying on past failures (the plan: --dry-run prints it):
#   1. environment set-up (below), versions and nvidia-smi into the log
#   2. autotune make-data (128 synthetic images)
#   3. autotune trial at 256 px, 10 timed steps each, on: fp32 baseline; fp16 + GradScaler; bf16;
#      pin_memory + num_workers 8; cudnn_benchmark + channels_last; fused AdamW; checkpoint_segments 5;
#      nccl DDP gpus=2 (skipped by name, with the reason, on one GPU); gloo DDP gpus=2 sharing the one
#      GPU (AUTOTUNE_DDP_BACKEND=gloo; only on one GPU); a forced CUDA OOM (must be OOM); --global-batch
#      accumulation (batch 8, global 32: grad_accum 4); on one GPU, over gloo: DDP with accumulation
#      (gpus 2, batch 8, global 32: world 2, grad_accum 2, the no_sync path; over nccl with two GPUs)
#      and a real allocation failure on rank 1 (exit 3, status oom in rank 1's verdict)
#   4. compile=default, before the search: the model is compiled and its compile time is in warm-up;
#      then on one GPU DDP + compile (inductor) + checkpoint_segments 5 over gloo: it trains, compiled
#   5. parity (bf16 vs its fp32 baseline, 64 px, 10 steps, through autotune.search.parity): the verdict
#      has a deviation, a tolerance and pass/fail; `autotune train --compare-baseline` (1 epoch, 64 px):
#      train.json holds both runs, comparison.speedup and comparison.time_to_target
#   6. autotune search through the warm fork server, then the study is loaded and must hold at
#      least GPU_CHECK_MIN_TRIALS complete feasible trials measured on the GPU; right after it, side by
#      side, a num_workers 8 + pin_memory trial and a baseline trial: best.yaml's confirmed speedup must
#      be >= 0.9 x theirs (the ratio is printed)
#   7. one table: every check, PASS or MISS; exit 1 on any miss
# Each trial's result JSON is asserted, not just its exit code: the device is the GPU; gpu_util is not
# null; the loss stayed finite; NVML's UUID of the sampled GPU is torch's UUID of the trial's device.
# Where the worker can see a knob's effect it is asserted from `applied.observed`, what the running
# model did, not from what the config asked (autotune/trial/observe.py): the first conv's output dtype
# (autocast), its input and output memory format (channels_last), cudnn.benchmark as the worker saw
# it, dynamo's graph count; the rest from `applied`'s in_effect (pin_memory, workers, fused AdamW,
# checkpointed segments, world size, grad_accum). A step skipped for lack of time is a MISS, not a pass.
# The whole run is meant to take at most 8 minutes on one H200; each step's `timeout` is its measured
# (or, for the rows added without a GPU, estimated) time capped by what is left of the time guard.
#
# Without a GPU (torch.cuda.is_available() is false) it runs only the CPU-safe parts: set-up,
# make-data (16 images) and one fp32 smoke trial at 64 px, then prints "no GPU: GPU checks skipped"
# and exits 0 when those passed. So `bash scripts/gpu_check.sh` is also a quick CPU self-test.
#
# Environment, in this order of preference:
#   - $GPU_CHECK_PYTHON, if set.
#   - the checkout's .venv, if its python runs here and imports torch, smp and optuna (a dev box).
#   - otherwise the machine's python3, when it already has torch (a GPU box whose CUDA torch must
#     stay). Packages it lacks (segmentation-models-pytorch, optuna, ...) are installed from wheels
#     in .whl/ with --no-index --no-deps --target into $WORK/site, so a GPU machine without a
#     package index works too: make the wheels on a machine that has one with
#     `bash scripts/gpu_check.sh --fetch-wheels`, and copy .whl/ along with the checkout.
#     The project is NOT pip-installed there: with no index pip could not satisfy pyproject's
#     torch==2.14.1 pin, and the machine's torch (2.11 when last seen) must stay. It runs from the
#     checkout through PYTHONPATH and `python -m autotune`; the torch version is logged.
#   - only if python3 has no torch at all (some other machine, with an index): a venv in $WORK
#     gets torch==2.14.1 torchvision==0.29.1 and then `pip install -e .`, each briefly time-boxed.
#   If a needed package is still missing after all this, the checks stop and the summary says why.
#
# Output: everything goes to the terminal and to $OUT/gpu_check.log ($WORK/gpu_check.log when OUT
# is unset). With $OUT set, these come back too: gpu.db (the search's journal), best.yaml,
# gpu_results.json (the trial table as data) and trial_logs.tar.gz (every trial's log).
#
# Knobs (environment): GPU_CHECK_BUDGET_S (default 480: the whole run's time guard; a step that
# no longer fits is skipped and counted as a MISS), GPU_CHECK_WORK (default /tmp/gpu_check),
# GPU_CHECK_WHEELS (default .whl), GPU_CHECK_BATCH (default 32), GPU_CHECK_SEARCH_BUDGET (default
# 150s), GPU_CHECK_MIN_TRIALS (default 3).
#
# Usage, from the repository root:
#   bash scripts/gpu_check.sh --fetch-wheels   # only for a GPU machine without a package index: on one with it
#   bash scripts/gpu_check.sh                  # on the GPU machine
#   bash scripts/gpu_check.sh --dry-run        # print the plan, run nothing
set -uo pipefail # no -e: a failed step is recorded and the script goes on

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
WHEELS=${GPU_CHECK_WHEELS:-$ROOT/.whl}
BUDGET_S=${GPU_CHECK_BUDGET_S:-480}
BATCH=${GPU_CHECK_BATCH:-32}
SEARCH_BUDGET=${GPU_CHECK_SEARCH_BUDGET:-150s}
MIN_TRIALS=${GPU_CHECK_MIN_TRIALS:-3}
DRY=0
[[ ${1:-} == --dry-run ]] && DRY=1
# Wheels a GPU machine's own python may lack; versions as tested in the checkout's .venv.
WHEEL_SPECS=(segmentation-models-pytorch==0.6.0 optuna==5.0.0 alembic==1.20.1 sqlalchemy==2.1.9
  colorlog==6.12.0 mako==1.4.3)

# --fetch-wheels: run where pip reaches an index, then copy .whl/ to the GPU machine.
if [[ ${1:-} == --fetch-wheels ]]; then
  mkdir -p "$WHEELS" || exit 1
  py=python3
  [[ -x $ROOT/.venv/bin/python ]] && py=$ROOT/.venv/bin/python
  # Pure-python wheels come as py3-none-any, so any CPython 3 on the GPU machine takes them.
  "$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" "${WHEEL_SPECS[@]}" || exit 1
  if [[ $WHEELS == "$ROOT/.whl" ]] && ! grep -qx '/.whl/' "$ROOT/.git/info/exclude" 2>/dev/null; then
    echo '/.whl/' >>"$ROOT/.git/info/exclude" # keep the wheels out of git
  fi
  du -sh "$WHEELS"
  echo "now copy .whl/ with the checkout to the GPU machine and run: bash scripts/gpu_check.sh"
  exit 0
fi

if ((DRY)); then
  cat <<PLAN
gpu_check plan (time guard ${BUDGET_S}s, work dir $WORK; nothing is run with --dry-run)
  1. env-setup            python with torch, smp, optuna (.venv, \$GPU_CHECK_PYTHON, or python3 + wheels in $WHEELS)
  2. make-data            128 synthetic images (16 without a GPU)
  3. trials, 256 px, batch $BATCH, 10 timed steps, each asserted from its result JSON; every GPU trial:
       status ok, device is the GPU, gpu_util set, loss finite, observed NVML UUID == torch device UUID
       fp32-baseline        observed: conv output float32, cudnn.benchmark off
       fp16-gradscaler      observed: conv output float16 (autocast); applied: GradScaler enabled
       bf16                 observed: conv output bfloat16 (autocast)
       pin-workers8         applied: pin_memory in effect, 8 loader workers
       cudnn-channels-last  observed: cudnn.benchmark on in the worker, conv input and output channels_last
       fused-adamw          applied: AdamW(fused=True) (or apex) in effect
       checkpoint-5         applied: 5 checkpointed segments; observed: conv output float32
       ddp-nccl-2           world size 2 over nccl (skipped by name on one GPU)
       ddp-gloo-2           world size 2 over gloo sharing one GPU (AUTOTUNE_DDP_BACKEND=gloo; one GPU only)
       forced-oom           112 x 1024 px: exit 3, status oom
       headroom             from fp32-baseline's result: memory_total is the device's; a headroom
                            above its free share is refused naming device memory, one below passes
       global-batch-accum   batch 8, global_batch 32: applied grad_accum 4 in effect
       ddp-gloo-accum       gpus 2, batch 8, global_batch 32 over gloo on one GPU: world size 2, grad_accum 2 (no_sync)
       ddp-nccl-accum       the same over nccl, one rank per GPU (instead of ddp-gloo-accum with two GPUs)
       oom-rank1            gpus 2 over gloo on one GPU, tests.fault_pipelines:oom_rank1_real (rank 1 allocates
                            4 TiB): exit 3, rank 1's verdict (result.json.rank1) status oom, rank 0's not oom
  4. compile-default      observed: compiled, dynamo made >= 1 graph; warm-up >= 5 s longer than fp32-baseline's
     ddp-gloo-compile-ckpt  gpus 2 over gloo, compile default (inductor), checkpoint_segments 5: status ok,
                            loss finite, observed compiled, world size 2 (a MISS prints the trial log's tail)
  5. parity-bf16          parity.noise_reference + parity.check, bf16 vs its fp32 baseline, 64 px, batch 8,
                          10 steps: deviation and tolerance finite, verdict pass/fail, 1 candidate run (the
                          reference reused), the candidate ran on the GPU in bf16
     train-compare-baseline  autotune train --epochs 1 --compare-baseline, 64 px: train.json has both runs,
                          comparison.speedup > 0 and comparison.time_to_target
  6. search               --budget $SEARCH_BUDGET through the warm fork server; the study must hold
                          >= $MIN_TRIALS complete feasible trials on the GPU; then show
     pin-workers8-after, baseline-after  side by side right after the search (defaults; num_workers 8 +
                          pin_memory), each asserted as a GPU trial
     search-vs-pin        best.yaml is confirmed and its speedup >= 0.9 x (pin-workers8-after / baseline-after)
  7. one table of every check; exit 1 on any MISS (a step skipped for time is a MISS)
Without a GPU: env-setup, make-data and one 64 px CPU smoke trial only.
PLAN
  exit 0
fi

mkdir -p "$WORK" || exit 1
LOG=${OUT:+$OUT/gpu_check.log}
LOG=${LOG:-$WORK/gpu_check.log}
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
export PYTHONUNBUFFERED=1

START=$SECONDS
SUMMARY=()
FAILED=0

left() { echo $((BUDGET_S - (SECONDS - START))); }

# step NAME EXPECTED_RC LIMIT_S CMD...: run CMD under timeout, record rc and time, never abort.
step() {
  local name=$1 want=$2 limit=$3 rc t0=$SECONDS verdict
  shift 3
  echo
  echo "=== [t+$((SECONDS - START))s] $name (limit ${limit}s, expect rc $want)"
  echo "\$ $*"
  timeout -k 15 "$limit" "$@"
  rc=$?
  verdict=ok
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    verdict="TIMED OUT"
  elif [[ $rc -ne $want ]]; then
    verdict=FAILED
  fi
  [[ $verdict == ok ]] || FAILED=$((FAILED + 1))
  SUMMARY+=("$(printf '%-30s rc %-4s expect %-4s %5ss  %s' "$name" "$rc" "$want" "$((SECONDS - t0))" "$verdict")")
  return "$rc"
}

skip() { # skip NAME WHY [na]: "na" = not applicable here (e.g. DDP on one GPU); otherwise a MISS
  echo
  echo "=== [t+$((SECONDS - START))s] $1: skipped ($2)"
  if [[ ${3:-} == na ]]; then
    SUMMARY+=("$(printf '%-30s %s' "$1" "skipped, not applicable: $2")")
  else
    SUMMARY+=("$(printf '%-30s %s' "$1" "MISS, skipped: $2")")
    FAILED=$((FAILED + 1))
  fi
}

summary() {
  echo
  echo "=== summary (t+$((SECONDS - START))s, log $LOG)"
  printf '  %s\n' "${SUMMARY[@]}"
  if ((FAILED)); then
    echo "gpu_check: $FAILED step(s) not as expected"
  else
    echo "gpu_check: all steps as expected"
  fi
}

finish() { # finish EXIT_CODE: summary, files for $OUT, and let tee write the log's last line
  summary
  collect
  exec 1>&- 2>&-
  wait "$TEE_PID" 2>/dev/null
  exit "$1"
}

collect() { # copy the results worth keeping into $OUT (at most 8 files, 2 levels)
  [[ -n ${OUT:-} ]] || return 0
  [[ -f $WORK/gpu_results.json ]] && cp "$WORK/gpu_results.json" "$OUT/"
  [[ -f $WORK/studies/gpu-check/best.yaml ]] && cp "$WORK/studies/gpu-check/best.yaml" "$OUT/"
  if [[ -d $WORK/trials || -d $WORK/studies ]]; then
    (cd "$WORK" && find trials studies -name trial.log -print0 2>/dev/null |
      tar --null -czf "$OUT/trial_logs.tar.gz" -T - 2>/dev/null)
  fi
}

# ---------------------------------------------------------------------------------------------
# 1. environment

imports_ok() { "$PY" -c "import $1" >/dev/null 2>&1; }
NEEDED="torch, torchvision, segmentation_models_pytorch, optuna, yaml, rich, psutil, autotune.cli"

setup_env() {
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
  if [[ -n ${GPU_CHECK_PYTHON:-} ]]; then
    PY=$GPU_CHECK_PYTHON
  elif [[ -x $ROOT/.venv/bin/python ]] && "$ROOT/.venv/bin/python" -c \
    "import torch, segmentation_models_pytorch, optuna" >/dev/null 2>&1; then
    PY=$ROOT/.venv/bin/python
  else
    PY=$(command -v python3) || {
      echo "no python3 here"
      return 1
    }
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
      echo "installing carried wheels from $WHEELS into $WORK/site (no index, no deps)"
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$WORK/site" "$WHEELS"/*.whl || echo "wheel install failed (python $("$PY" -V 2>&1)?)"
      export PYTHONPATH=$WORK/site:$PYTHONPATH
    fi
    if ! imports_ok "torch, torchvision"; then
      # A python without torch: a machine that reaches an index gets its own venv.
      echo "python3 has no torch: making a venv in $WORK/venv and asking the package index"
      python3 -m venv "$WORK/venv" && PY=$WORK/venv/bin/python || return 1
      timeout 300 "$PY" -m pip install -q --retries 0 --timeout 15 torch==2.14.1 torchvision==0.29.1 || return 1
      timeout 180 "$PY" -m pip install -q --retries 0 --timeout 15 -e "$ROOT" || return 1
    elif ! imports_ok "segmentation_models_pytorch, optuna"; then
      # Keep the machine's torch: only the missing packages (--no-deps, or --target would pull a
      # second torch into the folder), only if an index answers quickly.
      echo "segmentation_models_pytorch/optuna missing and no wheels carried: trying the package index"
      timeout 120 "$PY" -m pip install -q --retries 0 --timeout 10 --no-deps --target "$WORK/site" \
        "${WHEEL_SPECS[@]}" && export PYTHONPATH=$WORK/site:$PYTHONPATH
    fi
  fi
  echo "python: $PY"
  "$PY" -c "import $NEEDED" || return 1
  "$PY" - <<'EOF'
import importlib.metadata as md, platform, torch
def v(n):
    try:
        return md.version(n)
    except md.PackageNotFoundError:
        return "?"
print(f"python {platform.python_version()}  torch {torch.__version__} (project pins 2.14.1)  "
      f"cuda {torch.version.cuda}  cudnn {torch.backends.cudnn.version()}  "
      f"smp {v('segmentation-models-pytorch')}  optuna {v('optuna')}  timm {v('timm')}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name} {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
EOF
}

echo "gpu_check: $(date -u +%FT%TZ) on $(uname -n), $(nproc) CPUs, work dir $WORK, time guard ${BUDGET_S}s"
echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed file(s)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,utilization.gpu --format=csv
fi
PY=python3
echo
echo "=== [t+0s] env-setup"
if ! setup_env; then
  SUMMARY+=("$(printf '%-30s %s' env-setup "FAILED: needs $NEEDED")")
  FAILED=$((FAILED + 1))
  finish 1
fi
SUMMARY+=("$(printf '%-30s rc %-4s expect %-4s %5ss  %s' env-setup 0 0 "$((SECONDS - START))" ok)")
AT=("$PY" -m autotune) # the checkout's autotune, with whichever python set-up chose

GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
echo "GPUs visible to torch: $GPUS"

# ---------------------------------------------------------------------------------------------
# 2. data

DATA=$WORK/data
rm -rf "$DATA" "$WORK/trials" "$WORK/studies"
if ((GPUS == 0)); then
  step make-data 0 120 "${AT[@]}" make-data "$DATA" --n 16 --size 160x120
  mkdir -p "$WORK/trials/cpu-smoke"
  echo '{"batch_size": 2}' >"$WORK/trials/cpu-smoke.json"
  step cpu-smoke-trial 0 300 "${AT[@]}" trial --config "$WORK/trials/cpu-smoke.json" \
    --out "$WORK/trials/cpu-smoke/result.json" --data "$DATA" --image-size 64 --steps 2 --timeout 240
  echo
  echo "no GPU: GPU checks skipped (set-up, make-data and a CPU smoke trial only)"
  finish $((FAILED > 0))
fi
step make-data 0 180 "${AT[@]}" make-data "$DATA" --n 128

# ---------------------------------------------------------------------------------------------
# 3. one trial per knob, 256 px, 10 timed steps

declare -A EXPECT=()
NAMES=()
add() { # add NAME EXPECTED_RC JSON
  NAMES+=("$1")
  EXPECT[$1]=$2
  mkdir -p "$WORK/trials/$1"
  echo "$3" >"$WORK/trials/$1.json"
}
add fp32-baseline 0 "{\"batch_size\": $BATCH}"
add fp16-gradscaler 0 "{\"batch_size\": $BATCH, \"precision\": \"fp16\"}"
add bf16 0 "{\"batch_size\": $BATCH, \"precision\": \"bf16\"}"
add pin-workers8 0 "{\"batch_size\": $BATCH, \"pin_memory\": true, \"num_workers\": 8}"
add cudnn-channels-last 0 "{\"batch_size\": $BATCH, \"cudnn_benchmark\": true, \"channels_last\": true}"
add fused-adamw 0 "{\"batch_size\": $BATCH, \"optimizer_fusion\": \"fused\"}"
add checkpoint-5 0 "{\"batch_size\": $BATCH, \"checkpoint_segments\": 5}"
if ((GPUS >= 2)); then
  add ddp-nccl-2 0 "{\"batch_size\": $BATCH, \"gpus\": 2}"
  skip "trial ddp-gloo-2" "$GPUS GPUs visible: DDP runs over nccl, one rank per GPU" na
else
  skip "trial ddp-nccl-2" "one GPU visible: DDP needs two" na
  # Two ranks on the one GPU over gloo (NCCL refuses two ranks on one device): the DDP path on CUDA.
  add ddp-gloo-2 0 "{\"batch_size\": $BATCH, \"gpus\": 2}"
fi
# The OOM config: measured on an H200 (2026-11-30), 64 x 1024 px peaked at 121.5 GiB and FIT in its
# 139.8 GiB; 112 x 1024 px needs ~1.75x that (~213 GiB) and ran out of memory, as it must. Every single
# tensor stays under 2^31 elements (the largest, 112 x 16 x 1024 x 1024, is 1.9e9), so the failure is a
# plain allocation failure and not an indexing limit. It must fit the dataset (115 train images).
add forced-oom 3 '{"batch_size": 112, "image_size": 1024}'
# --global-batch as the search applies it: micro-batch 8, 32 samples per optimizer step.
add global-batch-accum 0 '{"batch_size": 8, "global_batch": 32}'
if ((GPUS == 1)); then
  # The DDP paths not covered above, as two gloo ranks on the one GPU: accumulation under DDP
  # (no_sync on all but the last micro-batch), and one rank running out of memory for real.
  add ddp-gloo-accum 0 '{"batch_size": 8, "global_batch": 32, "gpus": 2}'
  add oom-rank1 3 '{"batch_size": 4, "gpus": 2}'
else # two GPUs: accumulation under DDP over nccl, one rank per GPU
  add ddp-nccl-accum 0 '{"batch_size": 8, "global_batch": 32, "gpus": 2}'
  skip "trial oom-rank1" "$GPUS GPUs visible: the gloo-on-one-GPU rows run on one GPU only" na
fi

run_trial() { # run_trial NAME [LIMIT]: LIMIT is capped by the time guard (minus 10 s for the table)
  local name=$1 limit=${2:-180} size=256 pre=() pipe=()
  ((limit > $(left) - 10)) && limit=$(($(left) - 10))
  [[ $name == forced-oom ]] && size=1024
  [[ $name == ddp-gloo-* || $name == oom-rank1 ]] && pre=(env AUTOTUNE_DDP_BACKEND=gloo)
  # The tiny fault pipeline of the CPU tests, importable through the checkout on PYTHONPATH.
  [[ $name == oom-rank1 ]] && pipe=(--pipeline tests.fault_pipelines:oom_rank1_real)
  step "trial $name" "${EXPECT[$name]}" "$limit" ${pre[@]+"${pre[@]}"} "${AT[@]}" trial --config "$WORK/trials/$name.json" \
    --out "$WORK/trials/$name/result.json" --data "$DATA" --image-size "$size" --steps 10 --timeout "$((limit - 20))" \
    ${pipe[@]+"${pipe[@]}"}
  echo "$?" >"$WORK/trials/$name/rc"
}

run_trials() { # run_trials NAME...: each needs 60 s of the time guard, or it is a MISS
  local name
  for name in "$@"; do
    if (($(left) < 60)); then
      skip "trial $name" "time guard: $(left)s left"
      continue
    fi
    run_trial "$name"
  done
}
run_trials "${NAMES[@]}"

# shellcheck disable=SC2329 # called through assert_step
check() { # check NAME...: assert each trial's result JSON; one row per trial; MISS rows fail the run
  "$PY" - "$WORK" "$@" <<'EOF'
import json, sys
from pathlib import Path

work, names = Path(sys.argv[1]), sys.argv[2:]
# What each config must show, beyond what every GPU trial must show. OBSERVED: what the worker saw the
# running model do (applied.observed, autotune/trial/observe.py): effects, not echoes of the config.
# APPLIED: the knob's in_effect, for knobs whose effect the worker cannot watch (pin_memory, workers).
OBSERVED = {
    "fp32-baseline": {"conv_output_dtype": lambda v: v == "float32", "cudnn_benchmark": lambda v: v is False},
    "fp16-gradscaler": {"conv_output_dtype": lambda v: v == "float16"},
    "bf16": {"conv_output_dtype": lambda v: v == "bfloat16"},
    "cudnn-channels-last": {"cudnn_benchmark": lambda v: v is True, "conv_input_channels_last": lambda v: v is True,
                            "conv_output_channels_last": lambda v: v is True},
    "checkpoint-5": {"conv_output_dtype": lambda v: v == "float32"},
    "compile-default": {"compiled": lambda v: v is True, "compiled_graphs": lambda v: (v or 0) >= 1},
    "ddp-gloo-compile-ckpt": {"compiled": lambda v: v is True},
}
APPLIED = {
    "fp16-gradscaler": {"grad_scaler": lambda v: v is True},
    "pin-workers8": {"pin_memory": lambda v: v is True, "num_workers": lambda v: v == 8},
    "fused-adamw": {"optimizer_fusion": lambda v: "fused=True" in str(v) or "apex" in str(v)},
    "checkpoint-5": {"checkpoint_segments": lambda v: isinstance(v, list) and len(v) == 5},
    "ddp-gloo-2": {"gpus": lambda v: v == 2},
    "ddp-nccl-2": {"gpus": lambda v: v == 2},
    "global-batch-accum": {"grad_accum": lambda v: v == 4, "batch_size": lambda v: v == 8},
    "ddp-gloo-accum": {"gpus": lambda v: v == 2, "grad_accum": lambda v: v == 2, "batch_size": lambda v: v == 8},
    "ddp-nccl-accum": {"gpus": lambda v: v == 2, "grad_accum": lambda v: v == 2, "batch_size": lambda v: v == 8},
    "ddp-gloo-compile-ckpt": {"gpus": lambda v: v == 2},
}
COMPILE_MIN_S = 5.0  # compile-default's warm-up beyond the baseline's: 31 s measured on an H200
def effect(applied, knob):
    a = applied.get(knob)
    return a.get("in_effect") if isinstance(a, dict) else a
def bare(uuid):
    return str(uuid).split("-", 1)[1] if str(uuid).startswith(("GPU-", "MIG-")) else str(uuid)
def warmup_of(name):
    try:
        return json.loads((work / "trials" / name / "result.json").read_text()).get("warmup_s")
    except (OSError, ValueError):
        return None
def rank_verdict(d, rank):
    try:
        return json.loads((d / f"result.json.rank{rank}").read_text())
    except (OSError, ValueError):
        return {}
def problems_of(name, r):
    applied, seen, out = r.get("applied") or {}, (r.get("applied") or {}).get("observed") or {}, []
    if r.get("status") != "ok":
        out.append(f"status {r.get('status')}: {r.get('message', '')[:80]}")
    if str(r.get("device", "cpu")).startswith("cpu"):
        out.append(f"device {r.get('device')!r} is not the GPU")
    if r.get("gpu_util") is None:
        out.append("gpu_util is null")
    if not r.get("loss_finite", False):
        out.append("loss not finite")
    if not seen.get("nvml_uuid") or bare(seen.get("nvml_uuid")) != bare(seen.get("torch_uuid")):
        out.append(f"NVML sampled {seen.get('nvml_uuid')}, torch runs on {seen.get('torch_uuid')}")
    for knob, ok in OBSERVED.get(name, {}).items():
        if not ok(seen.get(knob)):
            out.append(f"observed {knob}: {seen.get(knob)!r}")
    for knob, ok in APPLIED.get(name, {}).items():
        if not ok(effect(applied, knob)):
            out.append(f"{knob} in effect: {effect(applied, knob)!r}")
    if name.startswith("ddp-") and r.get("world_size") != 2:
        out.append(f"world_size {r.get('world_size')}")
    if name.startswith("ddp-gloo-") and "over gloo" not in str((applied.get("gpus") or {}).get("why")):
        out.append(f"gpus: {applied.get('gpus')!r}, not gloo")
    if name == "compile-default":
        base_w = warmup_of("fp32-baseline")
        if r.get("warmup_s") is None or base_w is None or r["warmup_s"] < base_w + COMPILE_MIN_S:
            out.append(f"warm-up {r.get('warmup_s')} s vs the baseline's {base_w} s: no compile time in it")
    return out
rows, misses, base = [], 0, None
for name in names:
    d = work / "trials" / name
    rc = (d / "rc").read_text().strip() if (d / "rc").exists() else "-"
    try:
        r = json.loads((d / "result.json").read_text())
    except (OSError, ValueError):
        r = {}
    if name == "forced-oom":
        problems = [] if rc == "3" and r.get("status") == "oom" else [
            f"expected exit 3 / status oom, got {rc} / {r.get('status')}"]
    elif name == "oom-rank1":  # rank 1's own verdict names the OOM; rank 0 only lost its peer
        r1 = rank_verdict(d, 1)
        problems = [] if rc == "3" and r1.get("status") == "oom" and r.get("status") != "oom" else [
            f"expected exit 3 / rank 1 oom / rank 0 not oom, got {rc} / {r1.get('status')} "
            f"({str(r1.get('message', ''))[:60]}) / {r.get('status')}"]
        r = {**r, "status": f"rank1 {r1.get('status')}"}
    else:
        problems = problems_of(name, r)
    if problems and r.get("status") != "ok" and (d / "trial.log").exists():  # why it failed, in the log
        print(f"--- {name}: the last lines of {d / 'trial.log'}")
        print("\n".join((d / "trial.log").read_text(errors="replace").splitlines()[-25:]))
    sps = r.get("samples_per_s")
    base = sps if name == "fp32-baseline" and sps else base
    misses += bool(problems)
    rows.append({"config": name, "rc": rc, "status": r.get("status"), "samples_per_s": sps,
                 "x_base": sps / base if sps and base else None, "warmup_s": r.get("warmup_s"),
                 "peak_mib": r["peak_memory_bytes"] / 2**20 if r.get("peak_memory_bytes") else None,
                 "gpu_util": r.get("gpu_util"), "device": r.get("device"),
                 "verdict": "MISS" if problems else "PASS", "problems": problems})
fmt = lambda x, spec: format(x, spec) if x is not None else "-"
print(f"{'config':22s} {'verdict':7s} {'rc':>3s} {'samples/s':>9s} {'x base':>6s} {'warmup s':>8s} "
      f"{'peak MiB':>8s} {'gpu%':>5s}  problems")
for w in rows:
    print(f"{w['config']:22s} {w['verdict']:7s} {w['rc']:>3s} {fmt(w['samples_per_s'], '9.1f'):>9s} "
          f"{fmt(w['x_base'], '6.2f'):>6s} {fmt(w['warmup_s'], '8.1f'):>8s} {fmt(w['peak_mib'], '8.0f'):>8s} "
          f"{fmt(w['gpu_util'], '5.0f'):>5s}  {'; '.join(w['problems'])}")
if rows and rows[0].get("device"):
    print(f"device: {rows[0]['device']}")
out = work / "gpu_results.json"
old = json.loads(out.read_text()) if out.exists() else []
out.write_text(json.dumps([o for o in old if o["config"] not in names] + rows, indent=2))
sys.exit(1 if misses else 0)
EOF
}

NOTE=$WORK/assert_note # a check may write one line here: its figures, shown in its summary row
assert_step() { # assert_step NAME CMD...: a check of its own, PASS or MISS in the summary
  local name=$1 note=""
  shift
  rm -f "$NOTE"
  if "$@"; then
    [[ -s $NOTE ]] && note="  $(head -c 160 "$NOTE")"
    SUMMARY+=("$(printf '%-30s %s' "$name" "PASS$note")")
  else
    [[ -s $NOTE ]] && note="  $(head -c 160 "$NOTE")"
    SUMMARY+=("$(printf '%-30s %s' "$name" "MISS$note")")
    FAILED=$((FAILED + 1))
  fi
  rm -f "$NOTE"
}

echo
echo "=== trials at 256 px, batch $BATCH, 10 timed steps (forced-oom: 112 x 1024 px)"
assert_step "assert trial results" check "${NAMES[@]}"

# The memory-headroom rule on CUDA, from fp32-baseline's own figures (no extra run): its peak is the
# caching allocator's reserved peak, held against the device's total; a required share above what it
# left free names the device memory, one below it passes.
# shellcheck disable=SC2329 # called through assert_step
headroom() {
  "$PY" - "$WORK/trials/fp32-baseline/result.json" "$NOTE" <<'EOF'
import json, sys
from pathlib import Path
import torch
from autotune.core.config import TrialResult
from autotune.search.runner import headroom_short

r = TrialResult.from_dict(json.loads(Path(sys.argv[1]).read_text()))
problems = []
total = torch.cuda.get_device_properties(0).total_memory
if r.memory_total_bytes != total:
    problems.append(f"memory_total_bytes {r.memory_total_bytes} is not the device's {total}")
free = 1 - (r.peak_memory_bytes or 0) / (r.memory_total_bytes or 1)
over = headroom_short(r, min(0.89, free + 0.01))
if not r.peak_memory_bytes or over is None or "device memory" not in over:
    problems.append(f"a headroom above the {free:.1%} left free was not refused: {over!r}")
if headroom_short(r, max(0.0, free - 0.01)) is not None:
    problems.append("a headroom below what was left free was refused")
line = f"peak {(r.peak_memory_bytes or 0) / 2**30:.2f} GiB of {total / 2**30:.1f} GiB, {free:.1%} free" + (
    "" if not problems else ": " + "; ".join(problems))
Path(sys.argv[2]).write_text(line)
sys.exit(1 if problems else 0)
EOF
}
assert_step "assert headroom (fp32-baseline)" headroom

# ---------------------------------------------------------------------------------------------
# 4. torch.compile, before the search (its compile time is the warm-up time in the table)

NAMES=(compile-default)
add compile-default 0 "{\"batch_size\": $BATCH, \"compile\": \"default\"}"
if (($(left) < 90 + 200)); then
  skip "trial compile-default" "time guard: $(left)s left; compile and the search need ~290s"
else
  t0=$SECONDS
  run_trial compile-default 90  # measured 2026-11-30 on an H200: 31 s of compile, 56 s in all
  echo "compile-default: $((SECONDS - t0))s wall; its warm-up (compile) seconds are in the table"
  assert_step "assert compile result" check compile-default
fi

# DDP + inductor + activation checkpointing, two gloo ranks on the one GPU: dynamo's DDP optimizer once
# refused the checkpoint op in its graph (pytorch#104674; the CPU test runs it with aot_eager).
if ((GPUS == 1)); then
  add ddp-gloo-compile-ckpt 0 "{\"batch_size\": $BATCH, \"gpus\": 2, \"compile\": \"default\", \"checkpoint_segments\": 5}"
  if (($(left) < 120 + 200)); then
    skip "trial ddp-gloo-compile-ckpt" "time guard: $(left)s left; it and the search need ~320s"
  else
    run_trial ddp-gloo-compile-ckpt 120 # not measured: compile-default's 56 s, two ranks compiling at once
    assert_step "assert ddp-compile-ckpt result" check ddp-gloo-compile-ckpt
  fi
else
  skip "trial ddp-gloo-compile-ckpt" "$GPUS GPUs visible: the gloo-on-one-GPU rows run on one GPU only" na
fi

# ---------------------------------------------------------------------------------------------
# 5. parity and train --compare-baseline, small (64 px): the machinery, on the GPU

cap() { # cap NOMINAL_S: NOMINAL_S, or what the time guard leaves for it (keeping 200 s for the search)
  local c=$(($(left) - 200))
  echo $((c < $1 ? c : $1))
}
if (($(left) < 200 + 60)); then
  skip parity-bf16 "time guard: $(left)s left, the search needs ~200s"
else
  limit=$(cap 120) # 3 runs of 10 steps at 64 px, each a fresh process: not measured on a GPU
  assert_step "assert parity-bf16" timeout -k 15 "$limit" "$PY" - "$DATA" "$WORK/parity" "$limit" "$NOTE" <<'EOF'
import json, math, shutil, sys
from pathlib import Path
from autotune.pipelines import workload
from autotune.search import parity

data, folder, limit = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
shutil.rmtree(folder, ignore_errors=True)
base = workload("unet", 64, data, str(folder), batch_size=8)
cand = base.replace(precision="bf16")
per_run = max(20.0, (limit - 10) / 3)
ref = parity.noise_reference(base, 10, folder, per_run)
v = parity.check(cand, base, 10, folder, per_run, reference=ref).to_dict()
print("parity-bf16:", json.dumps(v))
try:
    ran = json.loads((folder / "candidate" / "result.json").read_text())
except (OSError, ValueError):
    ran = {}  # the candidate failed: the verdict says why
problems = []
for key in ("deviation", "tolerance"):
    if not isinstance(v.get(key), (int, float)) or not math.isfinite(v[key]):
        problems.append(f"{key} {v.get(key)!r}")
if v.get("verdict") not in ("pass", "fail"):
    problems.append(f"verdict {v.get('verdict')!r}")
if v.get("runs") != 1:
    problems.append(f"{v.get('runs')} candidate runs, the reference reused: 1")
# Parity's runs have no warm-up step, the one the worker watches the first conv in: no observed dtype here.
precision = ((ran.get("applied") or {}).get("precision") or {}).get("in_effect")
if str(ran.get("device", "cpu")).startswith("cpu") or precision != "bf16":
    problems.append(f"candidate ran on {ran.get('device')!r} with precision {precision!r}")
line = (f"deviation {v.get('deviation')} tolerance {v.get('tolerance')} verdict {v.get('verdict')}"
        + ("" if not problems else ": " + "; ".join(problems)))
print("parity-bf16:", line)
Path(sys.argv[4]).write_text(line)
sys.exit(1 if problems else 0)
EOF
fi

if (($(left) < 200 + 60)); then
  skip train-compare-baseline "time guard: $(left)s left, the search needs ~200s"
else
  rm -rf "$WORK/train"
  limit=$(cap 120) # two 1-epoch runs of 115 images at 64 px, each a fresh process: not measured on a GPU
  step train-compare-baseline 0 "$limit" "${AT[@]}" train --config "$WORK/trials/fp32-baseline.json" --epochs 1 \
    --compare-baseline --out "$WORK/train" --data "$DATA" --image-size 64
  assert_step "assert train-compare-baseline" "$PY" - "$WORK/train/train.json" "$NOTE" <<'EOF'
import json, sys
from pathlib import Path

try:
    runs = json.loads(open(sys.argv[1]).read())
except (OSError, ValueError) as e:
    sys.exit(f"train-compare-baseline: MISS, no train.json: {e}")
c = (runs[0].get("comparison") or {}) if runs else {}
problems = []
if len(runs) != 2 or not all((r.get("samples_per_s") or 0) > 0 for r in runs):
    problems.append(f"{len(runs)} runs, samples/s {[r.get('samples_per_s') for r in runs]}")
if not isinstance(c.get("speedup"), (int, float)) or not c["speedup"] > 0:
    problems.append(f"comparison.speedup {c.get('speedup')!r}")
if not isinstance(c.get("time_to_target"), dict):
    problems.append(f"comparison.time_to_target {c.get('time_to_target')!r}")
speedup, ttt = c.get("speedup"), c.get("time_to_target") or {}
sec = lambda x: f"{x:.1f} s" if isinstance(x, (int, float)) else "not reached"
line = (f"speedup x{speedup:.2f}" if isinstance(speedup, (int, float)) else f"speedup {speedup!r}") + (
    f", time to the baseline's final {ttt.get('metric')}: config {sec(ttt.get('config_s'))}, baseline "
    f"{sec(ttt.get('baseline_s'))}" if not problems else ": " + "; ".join(problems))
print("train-compare-baseline:", line)
Path(sys.argv[2]).write_text(line)
sys.exit(1 if problems else 0)
EOF
fi

# ---------------------------------------------------------------------------------------------
# 6. a short real search through the warm fork server, then the study is asserted; then its exported
#    speedup against num_workers + pin_memory alone, both measured in this run

STORE=${OUT:-$WORK}/gpu.db
rm -f "$STORE"
if (($(left) < 200)); then
  skip search "time guard: $(left)s left, the search needs ~200s"
else
  # SIGTERM from timeout acts like Ctrl-C: the running trial is killed and the best so far exported.
  lim=$(($(left) - 70)) # what the side-by-side trials after it need
  ((lim > 220)) && lim=220
  step search 0 "$lim" "${AT[@]}" search --budget "$SEARCH_BUDGET" --study gpu-check --storage "$STORE" \
    --data "$DATA" --image-size 256 --trial-seconds 5 --warmup-steps 3 --trial-timeout 90 --seed 0 \
    --studies-dir "$WORK/studies"
  step show 0 60 "${AT[@]}" show --study gpu-check --storage "$STORE"
  assert_step "assert search on the GPU" "$PY" - "$STORE" "$MIN_TRIALS" <<'EOF'
import sys
import optuna
from autotune.search.records import TrialRecord
from autotune.search.results import feasible
from autotune.search.storage import open_storage

store, need = sys.argv[1], int(sys.argv[2])
study = optuna.load_study(study_name="gpu-check", storage=open_storage(store))
on_gpu = [t for t in study.trials if feasible(t)
          and not str(TrialRecord.from_frozen(t).metrics.get("device", "cpu")).startswith("cpu")]
print(f"search: {len(study.trials)} trials, {len(on_gpu)} complete and feasible on the GPU (need {need})")
sys.exit(0 if len(on_gpu) >= need else 1)
EOF
fi

# The published study's largest single lever, num_workers + pin_memory, and the baseline (the search's:
# default knobs), side by side right after the search on the same machine state: the search's exported,
# confirmed speedup must be at least 0.9 x what that lever alone gives.
NAMES=()
add pin-workers8-after 0 '{"pin_memory": true, "num_workers": 8}'
add baseline-after 0 '{}'
if [[ ! -f $WORK/studies/gpu-check/best.yaml ]]; then
  skip search-vs-pin "no best.yaml from the search"
elif (($(left) < 2 * 25 + 10)); then
  skip search-vs-pin "time guard: $(left)s left, the two side-by-side trials need ~60s"
else
  for name in "${NAMES[@]}"; do
    lim=$((($(left) - 10) / 2)) # 60 s each at most: not measured on a GPU; a plain 256 px trial is ~20 s
    ((lim > 60)) && lim=60
    run_trial "$name" "$lim"
  done
  assert_step "assert side-by-side trials" check "${NAMES[@]}"
  assert_step "assert search-vs-pin" "$PY" - "$WORK" "$NOTE" <<'EOF'
import json, sys
from pathlib import Path
import yaml

work = Path(sys.argv[1])
best = yaml.safe_load((work / "studies" / "gpu-check" / "best.yaml").read_text()) or {}
sps = {}
for name in ("pin-workers8-after", "baseline-after"):
    try:
        sps[name] = json.loads((work / "trials" / name / "result.json").read_text()).get("samples_per_s")
    except (OSError, ValueError):
        sps[name] = None
lever = (sps["pin-workers8-after"] / sps["baseline-after"]
         if sps["pin-workers8-after"] and sps["baseline-after"] else None)
speedup, confirmed = best.get("speedup"), best.get("confirmed")
problems = []
if not confirmed:
    problems.append("best.yaml has no confirmed section: its speedup is not the confirmation rounds' median")
if not isinstance(speedup, (int, float)) or lever is None:
    problems.append(f"speedup {speedup!r}, num_workers+pin_memory x{lever}")
elif speedup < 0.9 * lever:
    problems.append(f"exported x{speedup:.2f} < 0.9 x num_workers+pin_memory's x{lever:.2f}")
ratio = speedup / lever if isinstance(speedup, (int, float)) and lever else None
fmt = lambda x: "-" if not isinstance(x, (int, float)) else f"{x:.2f}"
line = (f"best.yaml x{fmt(speedup)} (confirmed: {bool(confirmed)}) / num_workers 8 + pin_memory x{fmt(lever)} "
        f"side by side = {fmt(ratio)} (need >= 0.90)" + ("" if not problems else ": " + "; ".join(problems)))
print("search-vs-pin:", line)
Path(sys.argv[2]).write_text(line)
sys.exit(1 if problems else 0)
EOF
fi

finish $((FAILED > 0))
