#!/usr/bin/env bash
# gpu_check.sh: one prepared end-to-end check of autotune on a machine with NVIDIA GPUs, in at most
# 8 minutes on one GPU.
#
# The plan (STEPS and ROWS below; --dry-run prints it) gives every step a time limit and says what it
# asserts. The limits add up to less than the 520 s time guard, and a CI test (tests/test_gpu_check.py)
# adds them up again. Each step must end by the sum of the limits up to and including its own, so a step
# that overran takes its time from the next ones, never from after the guard; a step left under 3 s is
# skipped and counted as a MISS. Every limit is an estimate for one H200 (see each row), most measured
# from a cold trial (10-15 s of start-up, 56 s with torch.compile) less the imports a warm fork skips.
#
#   1. environment set-up (below), versions and nvidia-smi into the log
#   2. autotune make-data (128 synthetic images)
#   3. trials: one python process starts the warm fork server (torch, smp and the pipeline imported
#      once) and runs each row through autotune's launcher, each trial a fork of it (torchrun, cold, for
#      the 2-rank rows), batch 8, 2 measured seconds: the Unet at 256 px: fp32-baseline and pin-workers8
#      side by side (the lever search-vs-pin compares with); fp16 + GradScaler + channels_last +
#      cudnn_benchmark; bf16 + fused AdamW; a forced CUDA OOM. Then the user's paths: a plain script
#      (tests/gpu_check/train_script.py) at bf16 through at.autocast(), a pinned loader with 2 workers and
#      fused AdamW, all through the seams; the same script under torchrun on 2 ranks with its own DDP; a
#      script with no autotune line and no process group (tests/gpu_check/unedited_script.py) on 2 ranks at
#      bf16 with channels_last and 2 checkpointed blocks, all through the no-edit seams (autocast around its
#      model's forward, torch's replicate, a DistributedSampler for its DataLoader); a
#      Lightning and a transformers job (tests/pipelines/*_jobs.py) at bf16 (each skipped, not a MISS, where
#      its library is not installed); FSDP2 on 2 ranks (the example language model, bf16 parameters,
#      accumulating). The 2-rank rows are two gloo ranks sharing the one GPU, or nccl over two.
#      Then every row's result JSON is asserted, and the headroom rule on fp32-baseline's figures.
#   4. autotune search through the warm fork server (a space without compile, DDP or batch size: their
#      rows and CPU tests cover them, and the 90 s budget's 45 s of trials could not hold a compile), then
#      the study must hold GPU_CHECK_MIN_TRIALS complete feasible trials measured on the GPU, and
#      best.yaml's confirmed speedup must be >= 0.9 x num_workers 8 + pin_memory's alone (pin-workers8
#      over fp32-baseline: a ratio of two trials measured side by side, as best.yaml's is)
#   5. one table: every check, PASS or MISS; exit 1 on any miss
# Each trial's result JSON is asserted, not its exit code alone, and every knob from what the worker saw
# the running trial do (`applied.observed`, autotune/trial/measurement/observe.py, for every kind of job;
# for FSDP2 its first-step probe, `applied.fsdp`), never from the config echoed back: the device is the
# GPU; gpu_util is recorded (n/a under MIG: NVML keeps no utilisation counter for a MIG slice); the loss
# stayed finite; NVML lists the trial's own pid among the processes computing on the device it sampled
# (NVML's pids are the host's: the trial's host pid, n/a and said where a container's own pid namespace
# hides it); then each row's effect (the plan lists them). cudnn.benchmark is set, not observable: cuDNN
# keeps its benchmark cache to itself, and the row says so instead of asserting the flag the worker set.
#
# Rows a CPU test covers, left out for time (8 minutes hold the rows above and no more):
#   - compile-default (60 s, a quarter of the trial rows): tests/trial/loop/test_knobs.py::test_compile_wraps_a_tiny_model
#     (inductor, on the CPU) and tests/trial/processes/test_launcher.py::test_ddp_compile_and_checkpointing_train_together
#     (aot_eager runs dynamo's DDP optimizer over the checkpoint op, pytorch#104674). Inductor's CUDA code
#     generation is what no row checks now; its cost was the row's 56 s, 31 of them compiling.
#   - ddp-accum, autotune's DDP with accumulation: tests/trial/processes/test_launcher.py::
#     test_ddp_over_gloo_reports_global_samples_per_s (DDP over gloo) and tests/trial/loop/test_harness.py::
#     test_accumulated_micro_batches_make_the_full_batch_step; on the GPU, 2 ranks run in script-ddp2 (the
#     script's own DDP) and fsdp2 (accumulating, its gradient sync off on the first micro-step)
#   - parity-bf16: tests/search/checks/test_parity.py::test_bf16_on_the_unet_passes (bf16 parity through
#     the same parity.check, on the CPU); bf16 autocast on CUDA is bf16-fused-adamw's and script-bf16's
#   - DDP + compile + checkpointing: tests/trial/processes/test_launcher.py::test_ddp_compile_and_checkpointing_train_together
#   - an OOM on DDP rank 1 only: tests/trial/processes/test_launcher.py::test_oom_on_one_ddp_rank_is_trial_oom (a real
#     CUDA allocation failure is forced-oom's row)
#   - train --compare-baseline: tests/apply/test_train.py::test_compare_baseline_one_epoch
#   - checkpoint_segments: tests/trial/loop/test_knobs.py::test_saved_activations_fall_as_checkpoint_segments_grow
#     and ::test_checkpointed_unet_computes_the_same_output_and_gradients (on the GPU, script-unedited2
#     checkpoints 2 blocks of a script's model)
#   - single-process --global-batch accumulation: tests/trial/measurement/test_observe.py::
#     test_micro_batches_per_step_are_counted_at_the_first_conv (fsdp2 accumulates on the GPU)
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
#     gets torch==2.14.1 torchvision==0.29.1 and then `pip install -e .`, each briefly time-boxed
#     (that install does not fit env-setup's limit: the steps after it then run short, or are skipped).
#   If a needed package is still missing after all this, the checks stop and the summary says why.
#
# Output: everything goes to the terminal and to $OUT/gpu_check.log ($WORK/gpu_check.log when OUT
# is unset). With $OUT set, these come back too: gpu.db (the search's journal), best.yaml,
# gpu_results.json (the trial table as data) and trial_logs.tar.gz (every trial's log).
#
# Knobs (environment): GPU_CHECK_BUDGET_S (default 520: the whole run's time guard), GPU_CHECK_WORK
# (default /tmp/gpu_check), GPU_CHECK_WHEELS (default .whl), GPU_CHECK_SEARCH_BUDGET (default 90s: the
# search's --budget, in seconds; its step's limit is that plus 45 s), GPU_CHECK_MIN_TRIALS (default 3).
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
BUDGET_S=${GPU_CHECK_BUDGET_S:-520}
SEARCH_BUDGET=${GPU_CHECK_SEARCH_BUDGET:-90s}
MIN_TRIALS=${GPU_CHECK_MIN_TRIALS:-3}
SEARCH_S=${SEARCH_BUDGET%s}
for pair in "GPU_CHECK_BUDGET_S=$BUDGET_S" "GPU_CHECK_SEARCH_BUDGET=$SEARCH_S" "GPU_CHECK_MIN_TRIALS=$MIN_TRIALS"; do
  if [[ ! ${pair#*=} =~ ^[0-9]+$ ]]; then
    echo "gpu_check: ${pair%%=*} must be a whole number of seconds (or trials), got '${pair#*=}'" >&2
    exit 2
  fi
done
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

# --- the plan ----------------------------------------------------------------------------------------
# STEPS: name|limit_s|what it asserts. "trials" gets the sum of ROWS' limits. Each limit is the step's
# timeout; its deadline is the sum of the limits up to it (see `plan_limit`).
STEPS=(
  "env-setup|30|python with torch, smp, optuna (\$GPU_CHECK_PYTHON, .venv, or python3 + the wheels in .whl); versions logged"
  "make-data|20|128 synthetic 640x480 photos and masks (16 without a GPU)"
  "trials|0|one python process: the warm fork server, then each row below in turn, by its own deadline"
  "assert-trials|5|every row's result JSON, as listed under trials (a row that did not run is a MISS; one whose framework is not installed is skipped, not a MISS)"
  "headroom|10|from fp32-baseline's figures: memory_total is the device's; a required share above the one its measured peak left free (1 - peak/2) is refused naming device memory, one below it (free/2) passes"
  "search|$((SEARCH_S + 45))|autotune search --budget ${SEARCH_S}s (it ends within the budget + 30 s; 15 s start-up before its clock) through the warm fork server, a space of workers, pinning, precision fp32/bf16, fused AdamW, channels_last, cudnn.benchmark; confirmation: top 1 and the baseline, 2 rounds"
  "show|10|autotune show of the study"
  "assert-search|10|the study holds >= $MIN_TRIALS complete feasible trials measured on the GPU"
  "search-vs-pin|5|best.yaml is confirmed and its speedup >= 0.9 x pin-workers8's samples/s over fp32-baseline's"
)
# ROWS: name|limit_s|exit code|config (over batch 8 at 256 px, 2 measured seconds)|what it asserts.
# observed: what the worker saw the running trial do; measured: a figure of the run. Every GPU trial row
# also asserts COMMON (below). Limits: a warm fork starts in 3-5 s (CUDA, the model, the loader's
# workers), then 5 warm-up steps and 2 measured seconds; the trial's timeout is all of its row's time.
# The user's-path rows' limits are estimates, not yet measured on a GPU: a fork that imports its framework
# (lightning ~3 s, transformers ~6 s), a cold torchrun of 2 ranks (~11 s to the first step on 2 CPU cores).
# forced-oom: every single tensor of 112 x 1024 px stays under 2^31 elements (the largest, 112 x 16 x
# 1024 x 1024, is 1.9e9), so it fails as a plain allocation failure, not on an indexing limit.
# A row whose framework is not installed (lightning, transformers) is skipped at once, not a MISS.
SCRIPT='script:tests/gpu_check/train_script.py'
UNEDITED='script:tests/gpu_check/unedited_script.py'
LM='autotune.pipelines.examples.language_model:make'
ROWS=(
  'server-start|25|-|-|the warm fork server imports torch, torchvision, smp and the pipeline once (the driver imports torch first)'
  'fp32-baseline|20|0|{}|observed: conv output float32, the GradScaler scaled no loss (grad_scaler_scaled false: it never made a scale; a disabled scaler'"'"'s get_scale() of 1 is a constant); the first fork also starts CUDA on the device'
  'pin-workers8|15|0|{"pin_memory": true, "num_workers": 8}|observed: a batch drawn from the loader is_pinned(), 8 live loader worker processes (psutil children)'
  'fp16-channels-last|15|0|{"precision": "fp16", "channels_last": true, "cudnn_benchmark": true, "tf32": true}|observed: conv output float16 (autocast), conv input and output channels_last, the GradScaler scaled the loss (scale > 1), torch.backends.cuda.matmul.allow_tf32 on as the run saw it after its steps; cudnn.benchmark: set, not observable'
  'bf16-fused-adamw|15|0|{"precision": "bf16", "optimizer_fusion": "fused"}|observed: conv output bfloat16 (autocast), AdamW'"'"'s state["step"] on the GPU (the fused kernel keeps it on the parameters'"'"' device; the for-loop and foreach ones keep a CPU tensor)'
  'forced-oom|20|3|{"batch_size": 112, "image_size": 1024}|exit 3, status oom: 112 x 1024 px needs ~213 GiB (64 x 1024 px peaked at 121.5 GiB of 139.8 on an H200)'
  'script-bf16|15|0|{"pipeline": "'"$SCRIPT"'", "precision": "bf16", "pin_memory": true, "num_workers": 2, "optimizer_fusion": "fused"}|a plain script through the seams: observed: the model handed to at.model() returned bfloat16 (its forward hook), its parameters on the GPU, a batch its DataLoader handed over is_pinned(), AdamW'"'"'s state["step"] on the GPU (fused)'
  'script-ddp2|25|0|{"pipeline": "'"$SCRIPT"'", "gpus": 2}|torchrun, cold: the script'"'"'s own DDP: observed: its process group of 2 (over gloo on one GPU, nccl over two), a global batch of 16 (2 ranks x its own 8) delivered per optimizer step, its parameters on the GPU'
  'script-unedited2|25|0|{"pipeline": "'"$UNEDITED"'", "gpus": 2, "precision": "bf16", "channels_last": true, "checkpoint_segments": 2}|torchrun, cold: a script with no autotune line and no process group, through the no-edit seams: observed: its model returned bf16 (autocast around its forward), its weights channels_last, 2 of its blocks checkpointed, the model replicated (torch'"'"'s composable replicate) and its DataLoader sharded (a DistributedSampler) in the process group of 2 the trial set up (gloo on one GPU, nccl over two), a global batch of 16 (2 ranks x its own 8), its parameters on the GPU'
  'lightning-bf16|20|0|{"pipeline": "lightning:tests.pipelines.lightning_jobs:make", "precision": "bf16"}|Trainer.fit: observed: the first Linear returned bfloat16 (the Trainer'"'"'s bf16-mixed autocast), the LightningModule'"'"'s parameters on the GPU; skipped, not a MISS, without lightning'
  'hf-bf16-fused|25|0|{"pipeline": "hf:tests.pipelines.hf_jobs:make", "precision": "bf16", "optimizer_fusion": "fused"}|Trainer.train: observed: the first Linear (lm_head) returned bfloat16 (accelerate'"'"'s autocast), the model'"'"'s parameters on the GPU, AdamW'"'"'s state["step"] on the GPU (optim adamw_torch_fused); skipped, not a MISS, without transformers'
  'lm-cudagraphs|40|0|{"pipeline": "'"$LM"'", "image_size": 64, "compile": "reduce-overhead"}|compile reduce-overhead (CUDA graphs) on the language model: observed: the model compiled, dynamo compiled a graph or more, and inductor skipped CUDA graphs 0 times (its counter)'
  'fsdp2|30|0|{"pipeline": "'"$LM"'", "image_size": 128, "gpus": 2, "parallel": "fsdp", "fsdp_param_dtype": "bf16", "global_batch": 32}|torchrun, cold: FSDP2 on the language model'"'"'s 2 blocks: observed on its first step: every parameter a DTensor, each rank holding a part of them, the shards on the GPU, a block computing in bfloat16 (the bf16 parameters), gradient sync off on the first micro-step of each (accumulation 2); a process group of 2 (gloo ranks sharing one GPU, nccl over two)'
)
COMMON="status ok; device is the GPU; gpu_util recorded (n/a under MIG, never required there); loss finite; NVML lists the trial's pid among the compute processes of the device it sampled (its host pid; n/a, said, in a container whose pid namespace hides it)"

field() { # field N RECORD: the Nth |-separated field (1-based)
  local IFS='|'
  local -a f
  read -r -a f <<<"$2"
  echo "${f[$(($1 - 1))]}"
}
TRIALS_S=0
for r in "${ROWS[@]}"; do TRIALS_S=$((TRIALS_S + $(field 2 "$r"))); done
declare -A LIMIT=()
PLAN_S=0
for s in "${STEPS[@]}"; do
  n=$(field 1 "$s")
  l=$(field 2 "$s")
  [[ $n == trials ]] && l=$TRIALS_S
  LIMIT[$n]=$l
  PLAN_S=$((PLAN_S + l))
done

if ((DRY)); then
  echo "gpu_check plan: each step's time limit and what it asserts (time guard ${BUDGET_S}s, work dir $WORK;"
  echo "nothing is run with --dry-run). Each step ends by the sum of the limits up to it."
  for s in "${STEPS[@]}"; do
    n=$(field 1 "$s")
    printf '  %-22s %4ss  %s\n' "$n" "${LIMIT[$n]}" "$(field 3 "$s")"
    if [[ $n == trials ]]; then
      for r in "${ROWS[@]}"; do
        want=$(field 3 "$r")
        printf '    %-20s %4ss  %s%s\n' "$(field 1 "$r")" "$(field 2 "$r")" \
          "$([[ $want =~ ^[0-9]+$ ]] && echo "config $(field 4 "$r"): ")" "$(field 5 "$r")"
      done
      echo "    every GPU trial row: $COMMON"
    fi
  done
  printf '  %-22s %4ss  of the %ss time guard; then one table of every check, exit 1 on any MISS (a step\n' total "$PLAN_S" "$BUDGET_S"
  echo "                                skipped for time is a MISS)"
  echo "Left to CPU tests for time: compile-default, ddp-accum, parity-bf16, DDP + compile + checkpointing, a"
  echo "rank-1 OOM, train --compare-baseline, checkpoint_segments, single-process accumulation (the script's header"
  echo "names each test)."
  echo "Without a GPU: env-setup, make-data and one 64 px CPU smoke trial only."
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

skip() { # skip NAME WHY: a MISS
  echo
  echo "=== [t+$((SECONDS - START))s] $1: skipped ($2)"
  SUMMARY+=("$(printf '%-30s %s' "$1" "MISS, skipped: $2")")
  FAILED=$((FAILED + 1))
}

# The plan's clock: DUE is when the steps so far must have ended (seconds after START), the sum of
# their limits. A step's timeout runs to its own DUE, so one that overran shortens the next ones and
# the run still ends within the guard; one that finished early leaves its time to the next.
DUE=0
LIM=0
plan_limit() { # plan_limit NAME: set LIM, the seconds NAME may run from now
  DUE=$((DUE + LIMIT[$1]))
  local end=$((DUE < BUDGET_S ? DUE : BUDGET_S))
  LIM=$((end - (SECONDS - START)))
}

planned() { # planned NAME EXPECTED_RC CMD...: NAME's step by the plan's clock, or a MISS without time left
  local name=$1
  plan_limit "$name"
  if ((LIM < 3)); then
    skip "$name" "time guard: the steps before it overran (${LIM}s left of its ${LIMIT[$name]}s)"
    return 1
  fi
  STEP_LIMIT_S=$LIM step "$name" "$2" "$LIM" "${@:3}"
}

summary() {
  echo
  echo "=== summary (t+$((SECONDS - START))s of the ${BUDGET_S}s guard, log $LOG)"
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
      f"smp {v('segmentation-models-pytorch')}  optuna {v('optuna')}  timm {v('timm')}  "
      f"lightning {v('lightning')}  transformers {v('transformers')}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name} {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
EOF
}

echo "gpu_check: $(date -u +%FT%TZ) on $(uname -n), $(nproc) CPUs, work dir $WORK, time guard ${BUDGET_S}s (plan ${PLAN_S}s)"
echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed file(s)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,utilization.gpu --format=csv
fi
((PLAN_S > BUDGET_S)) && echo "gpu_check: the plan's ${PLAN_S}s exceed the ${BUDGET_S}s guard: the last steps will be skipped (MISS)"
PY=python3
echo
echo "=== [t+0s] env-setup (limit ${LIMIT[env-setup]}s)"
if ! setup_env; then
  SUMMARY+=("$(printf '%-30s %s' env-setup "FAILED: needs $NEEDED")")
  FAILED=$((FAILED + 1))
  finish 1
fi
AT=("$PY" -m autotune) # the checkout's autotune, with whichever python set-up chose

GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
echo "GPUs visible to torch: $GPUS"
plan_limit env-setup # set-up runs untimed (it chooses the python); what it overran comes out of the next steps
SUMMARY+=("$(printf '%-30s rc %-4s expect %-4s %5ss  %s' env-setup 0 0 "$((SECONDS - START))" \
  "ok$( ((LIM < 0)) && echo ", ${LIM#-}s over its ${LIMIT[env-setup]}s")")")

# ---------------------------------------------------------------------------------------------
# 2. data

DATA=$WORK/data
rm -rf "$DATA" "$WORK/trials" "$WORK/studies" "$WORK/gpu_results.json"
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
planned make-data 0 "${AT[@]}" make-data "$DATA" --n 128

# ---------------------------------------------------------------------------------------------
# 3. the trial rows, in one process: a warm fork server, then each row by its own deadline

NAMES=()
for r in "${ROWS[@]}"; do
  [[ $(field 1 "$r") == server-start ]] || NAMES+=("$(field 1 "$r")")
done
# On one GPU the 2-rank rows are two gloo ranks sharing it (NCCL refuses two ranks on one device).
export GPU_CHECK_GPUS=$GPUS
planned trials 0 "$PY" - "$WORK" "$DATA" "$GPUS" "${ROWS[@]}" <<'EOF'
import importlib.util, json, os, signal, sys, time
from pathlib import Path

started = time.monotonic()
# `timeout` ends this step with SIGTERM: exit through the finally blocks, which stop the trial and the server.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
work, data, gpus = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rows = [r.split("|")[:4] for r in sys.argv[4:]]
end = started + float(os.environ["STEP_LIMIT_S"]) - 5  # 5 s to write the last row and stop the server

import torch  # noqa: F401  imported here, the launcher tells every warm fork to fail rather than run on the CPU
from autotune.core import errors
from autotune.pipelines import base_config, kind_of, preload_modules
from autotune.trial.processes import launcher
from autotune.trial.processes.warm_client import DEFAULT_PRELOAD, WarmServer, WarmServerError

# A framework job needs its library, which a GPU machine's own python may lack (no wheel is carried for it).
LIBRARY = {"lightning": "lightning", "hf": "transformers"}


def absent(pipeline):
    """The library a row's job needs and this python lacks, or None."""
    library = LIBRARY.get(kind_of(pipeline).name)
    return library if library and importlib.util.find_spec(library) is None else None


server, due = None, started
try:
    for name, limit, want, config in rows:
        due = min(due + float(limit), end)  # each row ends by the sum of the limits up to it
        left = due - time.monotonic()
        if name == "server-start":
            try:
                server = WarmServer.start(preload=(*DEFAULT_PRELOAD, *preload_modules("unet")), timeout_s=max(left, 1.0))
                print(f"=== server-start: the warm fork server is up, {time.monotonic() - started:.1f} s", flush=True)
            except WarmServerError as e:
                print(f"=== server-start: {e}\nthe rows start cold: they may not fit their limits", flush=True)
            continue
        d = work / "trials" / name
        d.mkdir(parents=True, exist_ok=True)
        changes = json.loads(config)
        size = changes.pop("image_size", 256)
        pipeline = changes.pop("pipeline", "unet")
        library = absent(pipeline)
        if library:  # not this machine's: said, and its time left to the rows after it
            (d / "failure").write_text(f"not installed: {library} (this python has no {library}: skipped, not a MISS)")
            (d / "rc").write_text("absent")
            print(f"=== {name}: skipped, {library} is not installed here", flush=True)
            continue
        if left < 3:
            why = f"skipped: time guard, the rows before it overran ({left:.0f} s left of its {limit} s)"
            (d / "failure").write_text(why)
            (d / "rc").write_text("skipped")
            print(f"=== {name}: {why}", flush=True)
            continue
        print(f"=== [t+{time.monotonic() - started:.0f}s of the step] {name}: {config}, {left:.0f} s", flush=True)
        t0 = time.monotonic()
        # 2 measured seconds, not a step count: NVML samples utilisation every 0.1 s.
        cfg = base_config(pipeline, size, data, str(work / "studies"), seconds=2.0, **changes)
        kept = os.environ.get("AUTOTUNE_DDP_BACKEND")
        if cfg.gpus > 1 and gpus == 1:
            os.environ["AUTOTUNE_DDP_BACKEND"] = "gloo"
        try:
            launcher.run_trial(cfg, d, left, server=server)
            rc = 0
        except errors.TrialFailure as e:
            rc = int(errors.exit_code_for(e.reason))
            (d / "failure").write_text(f"{e.reason}: {e}")
        finally:
            os.environ.pop("AUTOTUNE_DDP_BACKEND", None)
            if kept is not None:
                os.environ["AUTOTUNE_DDP_BACKEND"] = kept
        (d / "rc").write_text(str(rc))
        print(f"=== {name}: exit {rc} (expect {want}) after {time.monotonic() - t0:.1f} s", flush=True)
finally:
    if server is not None:
        server.close()
EOF

# shellcheck disable=SC2329 # called through assert_step
check() { # check NAME...: assert each row's result JSON; one table row each; a MISS fails the run
  timeout -k 5 "$LIM" "$PY" - "$WORK" "$@" <<'EOF'
import json, os, sys
from pathlib import Path

work, names = Path(sys.argv[1]), sys.argv[2:]
gpus = int(os.environ.get("GPU_CHECK_GPUS", "1"))


# Each row's effects, as the trial observed them in its running process (applied.observed, written by
# autotune/trial/measurement/observe.py for every kind; FSDP2's first-step probe, applied.fsdp, read here as
# "fsdp.<key>"): never a value of the config read back.
def equals(want):
    return lambda v: type(v) is type(want) and v == want


def above(low):
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > low


def on_gpu(v):  # a torch device string: "cuda:0"
    return isinstance(v, str) and v.startswith("cuda")


# Two ranks on one GPU share it over gloo (NCCL refuses two ranks on one device); nccl over two.
BACKEND = equals("gloo" if gpus == 1 else "nccl")
OBSERVED = {
    # A disabled GradScaler's get_scale() is the constant 1.0 whatever ran: that it never scaled a loss tells.
    "fp32-baseline": {"conv_output_dtype": equals("float32"), "grad_scaler_scaled": equals(False)},
    "pin-workers8": {"batch_pinned": equals(True), "child_processes": equals(8)},
    "fp16-channels-last": {"conv_output_dtype": equals("float16"), "conv_input_channels_last": equals(True),
                           "conv_output_channels_last": equals(True), "grad_scaler_scaled": equals(True),
                           "grad_scale": above(1.0), "tf32": equals(True)},
    # CUDA graphs replay what inductor compiled; a skip (a mutated input, a CPU tensor) would run it without.
    "lm-cudagraphs": {"compiled": equals(True), "compiled_graphs": above(0), "cudagraph_skips": equals(0)},
    # Fused AdamW keeps state["step"] on the parameters' device; the for-loop and foreach ones a CPU tensor.
    "bf16-fused-adamw": {"conv_output_dtype": equals("bfloat16"), "optimizer_step_device": on_gpu},
    "script-bf16": {"output_dtype": equals("bfloat16"), "param_device": on_gpu, "batch_pinned": equals(True),
                    "optimizer_step_device": on_gpu},
    "script-ddp2": {"process_group_size": equals(2), "process_group_backend": BACKEND, "param_device": on_gpu,
                    "global_batch": equals(16)},  # the script keeps its own 8 a rank
    # No autotune line, no process group: every effect is one of the seams' (the trial sets up the group).
    "script-unedited2": {"model_output_precision": equals("bf16"), "model_weights_channels_last": equals(True),
                         "model_checkpointed_blocks": equals(2), "model_replicated": equals(True),
                         "sharded_loaders": equals(1), "process_group_size": equals(2),
                         "process_group_backend": BACKEND, "global_batch": equals(16), "param_device": on_gpu},
    "lightning-bf16": {"output_dtype": equals("bfloat16"), "param_device": on_gpu},
    "hf-bf16-fused": {"output_dtype": equals("bfloat16"), "param_device": on_gpu, "optimizer_step_device": on_gpu},
    "fsdp2": {"fsdp.dtensor_params": above(0), "fsdp.shard_device": equals("cuda"),
              "fsdp.block_output_dtype": equals("bfloat16"), "fsdp.sync_off_micro_steps": above(0),
              "process_group_size": equals(2), "process_group_backend": BACKEND},
}


def whole(v):
    return isinstance(v, int) and not isinstance(v, bool)


# Effects that relate two observations: (what it asserts, the test over the row's observations).
RELATIONS = {
    "fsdp2": [
        ("every parameter a DTensor", lambda s: s.get("fsdp.dtensor_params") == s.get("fsdp.params")),
        ("each rank holds a part of them", lambda s: whole(s.get("fsdp.local_numel")) and whole(s.get("fsdp.numel"))
         and 0 < s["fsdp.local_numel"] < s["fsdp.numel"]),
    ],
    "script-unedited2": [
        ("checkpointing freed activation memory", lambda s: isinstance(s.get("model_activation_bytes"), dict)
         and above(0)(s["model_activation_bytes"].get("freed"))),
    ],
}
# What the worker sets but cannot see take effect: said in the row, never asserted.
NOT_OBSERVABLE = {"fp16-channels-last": "cudnn.benchmark: set, not observable (cuDNN keeps its benchmark cache to itself)"}
MIG = "n/a under MIG"


def load(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def common(r):
    """What every GPU trial must show."""
    seen, out = (r.get("applied") or {}).get("observed") or {}, []
    if r.get("status") != "ok":
        out.append(f"status {r.get('status')}: {str(r.get('message', ''))[:80]}")
    if str(r.get("device", "cpu")).startswith("cpu"):
        out.append(f"device {r.get('device')!r} is not the GPU")
    if r.get("gpu_util") is None and not str(r.get("gpu_util_error") or "").startswith(MIG):
        out.append(f"gpu_util is null ({r.get('gpu_util_error')})")
    if not r.get("loss_finite", False):
        out.append("loss not finite")
    # NVML lists the host's pids: the trial's own as NVML knows it (nvml_pid), its os.getpid() outside a
    # container's own pid namespace; unknown inside one whose /proc shows only its own (pid_namespace says so).
    pids, pid = seen.get("nvml_pids"), seen.get("nvml_pid", seen.get("pid"))
    if not isinstance(pids, list):
        out.append(f"NVML listed no compute processes on the sampled device: {seen.get('nvml_pids_error')}")
    elif pid is None and seen.get("pid_namespace"):
        pass  # said in the row's notes (pid_note), not a miss
    elif pid is None or pid not in pids:
        out.append(f"NVML lists pids {pids} on the device it sampled, not the trial's pid {pid}")
    return out


def pid_note(r):
    """Why the trial's pid could not be looked for among NVML's, or None."""
    seen = (r.get("applied") or {}).get("observed") or {}
    if seen.get("nvml_pid", seen.get("pid")) is None and seen.get("pid_namespace"):
        return f"NVML pid n/a: {str(seen['pid_namespace'])[:120]}"
    return None


def seen_of(r):
    """What the trial observed: applied.observed, and FSDP2's first-step probe as "fsdp.<key>"."""
    applied = r.get("applied") or {}
    fsdp = applied.get("fsdp") if isinstance(applied.get("fsdp"), dict) else {}
    return {**(applied.get("observed") or {}), **{f"fsdp.{k}": v for k, v in fsdp.items()}}


def problems_of(name, r):
    out = common(r)
    seen = seen_of(r)
    for key, ok in OBSERVED.get(name, {}).items():
        if not ok(seen.get(key)):
            out.append(f"observed {key}: {seen.get(key)!r}")
    for what, ok in RELATIONS.get(name, []):
        if not ok(seen):
            out.append(f"observed, not {what}: {({k: v for k, v in seen.items() if k.startswith('fsdp.')})}"[:200])
    return out


rows, misses, base = [], 0, None
job = lambda name: load(work / "trials" / name / "config.json").get("pipeline")  # x base: the same job's only
for name in names:
    d = work / "trials" / name
    rc = (d / "rc").read_text().strip() if (d / "rc").exists() else "-"
    r = load(d / "result.json")
    notes = []
    failure = (d / "failure").read_text().strip().splitlines()[:1] if (d / "failure").exists() else []
    if rc == "absent":  # its framework is not installed on this machine: said, not a MISS
        problems, notes = [], [failure[0][:160] if failure else "not installed"]
    elif rc in ("-", "skipped"):  # the driver never got to it, or had no time left for it
        problems = [failure[0][:160] if failure else "did not run"]
    elif name == "forced-oom":
        problems = [] if rc == "3" and r.get("status") == "oom" else [
            f"expected exit 3 / status oom, got {rc} / {r.get('status')}"]
    else:
        problems = problems_of(name, r)
        if NOT_OBSERVABLE.get(name):
            notes.append(NOT_OBSERVABLE[name])
        if str(r.get("gpu_util_error") or "").startswith(MIG):
            notes.append(r["gpu_util_error"])
        if pid_note(r):
            notes.append(pid_note(r))
    if problems and failure and rc not in ("-", "skipped"):  # the launcher's account of the failure first
        problems.insert(0, failure[0][:160])
    if problems and r.get("status") != "ok" and (d / "trial.log").exists():  # why it failed, in the log
        print(f"--- {name}: the last lines of {d / 'trial.log'}")
        print("\n".join((d / "trial.log").read_text(errors="replace").splitlines()[-25:]))
    sps = r.get("samples_per_s")
    base = sps if name == "fp32-baseline" and sps else base
    same = job(name) == job("fp32-baseline")
    misses += bool(problems)
    util = r.get("gpu_util")
    rows.append({"config": name, "rc": rc, "status": r.get("status"), "samples_per_s": sps,
                 "x_base": sps / base if sps and base and same else None, "warmup_s": r.get("warmup_s"),
                 "peak_mib": r["peak_memory_bytes"] / 2**20 if r.get("peak_memory_bytes") else None,
                 "gpu_util": util, "device": r.get("device"),
                 "verdict": "MISS" if problems else "SKIP" if rc == "absent" else "PASS",
                 "problems": problems, "notes": notes})
fmt = lambda x, spec: format(x, spec) if isinstance(x, (int, float)) else "-"
print(f"{'config':22s} {'verdict':7s} {'rc':>7s} {'samples/s':>9s} {'x base':>6s} {'warmup s':>8s} "
      f"{'peak MiB':>8s} {'gpu%':>5s}  problems; notes")
for w in rows:
    gpu = "n/a" if any(n.startswith(MIG) for n in w["notes"]) else fmt(w["gpu_util"], "5.0f")
    print(f"{w['config']:22s} {w['verdict']:7s} {w['rc']:>7s} {fmt(w['samples_per_s'], '9.1f'):>9s} "
          f"{fmt(w['x_base'], '6.2f'):>6s} {fmt(w['warmup_s'], '8.1f'):>8s} {fmt(w['peak_mib'], '8.0f'):>8s} "
          f"{gpu:>5s}  {'; '.join(w['problems'] + w['notes'])}")
if rows and rows[0].get("device"):
    print(f"device: {rows[0]['device']}")
out = work / "gpu_results.json"
old = json.loads(out.read_text()) if out.exists() else []
out.write_text(json.dumps([o for o in old if o["config"] not in names] + rows, indent=2))
missed = [w["config"] for w in rows if w["verdict"] == "MISS"]
absent = [w["config"] for w in rows if w["verdict"] == "SKIP"]
(work / "assert_note").write_text(f"{len(rows) - len(missed) - len(absent)} of {len(rows)} rows PASS"
                                  + (f"; not installed, skipped: {', '.join(absent)}" if absent else "")
                                  + (f"; MISS: {', '.join(missed)}" if missed else ""))
sys.exit(1 if misses else 0)
EOF
}

NOTE=$WORK/assert_note # a check may write one line here: its figures, shown in its summary row
assert_step() { # assert_step NAME CMD...: a check of its own by the plan's clock, PASS or MISS in the summary
  local name=$1 note=""
  shift
  plan_limit "$name"
  if ((LIM < 3)); then
    skip "$name" "time guard: the steps before it overran (${LIM}s left of its ${LIMIT[$name]}s)"
    return
  fi
  rm -f "$NOTE"
  echo
  echo "=== [t+$((SECONDS - START))s] $name (limit ${LIM}s)"
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

assert_step assert-trials check "${NAMES[@]}"

# The memory-headroom rule on CUDA, from fp32-baseline's own figures (no extra run): its peak is the
# caching allocator's reserved peak, held against the device's total. The required shares come from that
# peak: 1 - peak/2 is more than it left free, free/2 less, however small the peak is on a large device.
# shellcheck disable=SC2329 # called through assert_step
headroom() {
  timeout -k 5 "$LIM" "$PY" - "$WORK/trials/fp32-baseline/result.json" "$NOTE" <<'EOF'
import json, sys
from pathlib import Path
import torch
from autotune.core.result import TrialResult
from autotune.search.loop.runner import headroom_short

try:
    r = TrialResult.from_dict(json.loads(Path(sys.argv[1]).read_text()))
except (OSError, ValueError, TypeError) as e:
    Path(sys.argv[2]).write_text(f"no fp32-baseline result: {e}")
    sys.exit(1)
problems = []
total = torch.cuda.get_device_properties(0).total_memory
if r.memory_total_bytes != total:
    problems.append(f"memory_total_bytes {r.memory_total_bytes} is not the device's {total}")
share = (r.peak_memory_bytes or 0) / (r.memory_total_bytes or 1)
free = 1 - share
over = headroom_short(r, 1 - share / 2)
if not r.peak_memory_bytes or over is None or "device memory" not in over:
    problems.append(f"a headroom of {1 - share / 2:.2%}, above the {free:.2%} left free, was not refused: {over!r}")
under = headroom_short(r, free / 2)
if under is not None:
    problems.append(f"a headroom of {free / 2:.2%}, below the {free:.2%} left free, was refused: {under}")
line = f"peak {(r.peak_memory_bytes or 0) / 2**30:.2f} GiB of {total / 2**30:.1f} GiB, {free:.2%} free" + (
    "" if not problems else ": " + "; ".join(problems))
print("headroom:", line)
Path(sys.argv[2]).write_text(line)
sys.exit(1 if problems else 0)
EOF
}
assert_step headroom headroom

# ---------------------------------------------------------------------------------------------
# 4. a short real search through the warm fork server, then the study is asserted; then its exported
#    speedup against num_workers + pin_memory alone

STORE=${OUT:-$WORK}/gpu.db
rm -f "$STORE"
# Batch size stays 8 (the baseline's: a change of the global batch asks for a time-to-target check the
# budget cannot hold), compile and DDP stay off (their rows cover them; one compile would eat the trial
# loop), fp16 out (its row covers it; one more class for the parity gate). So the memory estimate is moot:
# AUTOTUNE_MEMORY_PROBE=0 saves its cold process before the budget's clock starts.
cat >"$WORK/space.yaml" <<'EOF'
knobs:
  num_workers: {low: 0, high: 8}
  pin_memory: [false, true]
  precision: [fp32, bf16]
  optimizer_fusion: [none, fused]
  channels_last: [false, true]
  cudnn_benchmark: [false, true]
EOF
# SIGTERM from timeout acts like Ctrl-C: the running trial is killed and the best so far exported.
planned search 0 env AUTOTUNE_MEMORY_PROBE=0 "${AT[@]}" search --budget "${SEARCH_S}s" --study gpu-check \
  --storage "$STORE" --space "$WORK/space.yaml" --data "$DATA" --image-size 256 --trial-seconds 5 \
  --warmup-steps 3 --trial-timeout 40 --confirm-top 1 --confirm-rounds 2 --parity-steps 10 --seed 0 \
  --studies-dir "$WORK/studies"
planned show 0 "${AT[@]}" show --study gpu-check --storage "$STORE"
# shellcheck disable=SC2329 # called through assert_step
on_gpu() {
  timeout -k 5 "$LIM" "$PY" - "$STORE" "$MIN_TRIALS" "$NOTE" <<'EOF'
import sys
from pathlib import Path
import optuna
from autotune.search.store.records import TrialRecord
from autotune.search.store.results import feasible
from autotune.search.store.storage import open_storage

store, need = sys.argv[1], int(sys.argv[2])
try:
    study = optuna.load_study(study_name="gpu-check", storage=open_storage(store))
except Exception as e:  # no study: the search did not start
    Path(sys.argv[3]).write_text(f"no study in {store}: {type(e).__name__}: {e}"[:160])
    sys.exit(1)
on_gpu = [t for t in study.trials if feasible(t)
          and not str(TrialRecord.from_frozen(t).metrics.get("device", "cpu")).startswith("cpu")]
line = f"{len(study.trials)} trials, {len(on_gpu)} complete and feasible on the GPU (need {need})"
print("search:", line)
Path(sys.argv[3]).write_text(line)
sys.exit(0 if len(on_gpu) >= need else 1)
EOF
}
assert_step assert-search on_gpu

# The published study's largest single lever, num_workers + pin_memory, against the baseline (the
# search's: default knobs), pin-workers8 over fp32-baseline, measured one after the other in the trials
# step: the search's exported, confirmed speedup (a ratio to a baseline measured beside it, too) must be
# at least 0.9 x what that lever alone gives.
# shellcheck disable=SC2329 # called through assert_step
search_vs_pin() {
  timeout -k 5 "$LIM" "$PY" - "$WORK" "$NOTE" <<'EOF'
import json, sys
from pathlib import Path
import yaml

work = Path(sys.argv[1])
try:
    best = yaml.safe_load((work / "studies" / "gpu-check" / "best.yaml").read_text()) or {}
except OSError:
    Path(sys.argv[2]).write_text("no best.yaml from the search")
    sys.exit(1)
sps = {}
for name in ("pin-workers8", "fp32-baseline"):
    try:
        sps[name] = json.loads((work / "trials" / name / "result.json").read_text()).get("samples_per_s")
    except (OSError, ValueError):
        sps[name] = None
lever = sps["pin-workers8"] / sps["fp32-baseline"] if sps["pin-workers8"] and sps["fp32-baseline"] else None
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
        f"= {fmt(ratio)} (need >= 0.90)" + ("" if not problems else ": " + "; ".join(problems)))
print("search-vs-pin:", line)
Path(sys.argv[2]).write_text(line)
sys.exit(1 if problems else 0)
EOF
}
assert_step search-vs-pin search_vs_pin

finish $((FAILED > 0))
