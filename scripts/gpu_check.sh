#!/usr/bin/env bash
# gpu_check.sh: one prepared end-to-end check of autotune on a machine with NVIDIA GPUs.
#
# What it runs, each step under `timeout`, carrying on past failures (the plan: --dry-run prints it):
#   1. environment set-up (below), versions and nvidia-smi into the log
#   2. autotune make-data (128 synthetic images)
#   3. autotune trial at 256 px, 10 timed steps each, on: fp32 baseline; fp16 + GradScaler; bf16;
#      pin_memory + num_workers 8; cudnn_benchmark + channels_last; fused AdamW; checkpoint_segments 5;
#      nccl DDP gpus=2 (skipped by name, with the reason, on one GPU); gloo DDP gpus=2 sharing the one
#      GPU (AUTOTUNE_DDP_BACKEND=gloo; only on one GPU); a forced CUDA OOM (must be OOM)
#   4. compile=default, before the search: the model is compiled and its compile time is in warm-up
#   5. autotune search through the warm fork server, then the study is loaded and must hold at
#      least GPU_CHECK_MIN_TRIALS complete feasible trials measured on the GPU
#   6. one table: every check, PASS or MISS; exit 1 on any miss
# Each trial's result JSON is asserted, not just its exit code: the device is the GPU; gpu_util is not
# null; the loss stayed finite; NVML's UUID of the sampled GPU is torch's UUID of the trial's device.
# Where the worker can see a knob's effect it is asserted from `applied.observed`, what the running
# model did, not from what the config asked (autotune/trial/observe.py): the first conv's output dtype
# (autocast), its input and output memory format (channels_last), cudnn.benchmark as the worker saw
# it, dynamo's graph count; the rest from `applied`'s in_effect (pin_memory, workers, fused AdamW,
# checkpointed segments, world size). A step skipped for lack of time is a MISS, not a pass.
# The whole run is meant to take at most 8 minutes on one H200.
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
  4. compile-default      observed: compiled, dynamo made >= 1 graph; warm-up >= 5 s longer than fp32-baseline's
  5. search               --budget $SEARCH_BUDGET through the warm fork server; the study must hold
                          >= $MIN_TRIALS complete feasible trials on the GPU; then show
  6. one table of every check; exit 1 on any MISS (a step skipped for time is a MISS)
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
  SUMMARY+=("$(printf '%-26s rc %-4s expect %-4s %5ss  %s' "$name" "$rc" "$want" "$((SECONDS - t0))" "$verdict")")
  return "$rc"
}

skip() { # skip NAME WHY [na]: "na" = not applicable here (e.g. DDP on one GPU); otherwise a MISS
  echo
  echo "=== [t+$((SECONDS - START))s] $1: skipped ($2)"
  if [[ ${3:-} == na ]]; then
    SUMMARY+=("$(printf '%-26s %s' "$1" "skipped, not applicable: $2")")
  else
    SUMMARY+=("$(printf '%-26s %s' "$1" "MISS, skipped: $2")")
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
  SUMMARY+=("$(printf '%-26s %s' env-setup "FAILED: needs $NEEDED")")
  FAILED=$((FAILED + 1))
  finish 1
fi
SUMMARY+=("$(printf '%-26s rc %-4s expect %-4s %5ss  %s' env-setup 0 0 "$((SECONDS - START))" ok)")
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

run_trial() { # run_trial NAME [LIMIT]
  local name=$1 limit=${2:-180} size=256 pre=()
  [[ $name == forced-oom ]] && size=1024
  [[ $name == ddp-gloo-2 ]] && pre=(env AUTOTUNE_DDP_BACKEND=gloo)
  step "trial $name" "${EXPECT[$name]}" "$limit" ${pre[@]+"${pre[@]}"} "${AT[@]}" trial --config "$WORK/trials/$name.json" \
    --out "$WORK/trials/$name/result.json" --data "$DATA" --image-size "$size" --steps 10 --timeout "$((limit - 20))"
  echo "$?" >"$WORK/trials/$name/rc"
}

for name in "${NAMES[@]}"; do
  if (($(left) < 60)); then
    skip "trial $name" "time guard: $(left)s left"
    continue
  fi
  run_trial "$name"
done

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
}
APPLIED = {
    "fp16-gradscaler": {"grad_scaler": lambda v: v is True},
    "pin-workers8": {"pin_memory": lambda v: v is True, "num_workers": lambda v: v == 8},
    "fused-adamw": {"optimizer_fusion": lambda v: "fused=True" in str(v) or "apex" in str(v)},
    "checkpoint-5": {"checkpoint_segments": lambda v: isinstance(v, list) and len(v) == 5},
    "ddp-gloo-2": {"gpus": lambda v: v == 2},
    "ddp-nccl-2": {"gpus": lambda v: v == 2},
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
    if name == "ddp-gloo-2" and "over gloo" not in str((applied.get("gpus") or {}).get("why")):
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
    else:
        problems = problems_of(name, r)
    sps = r.get("samples_per_s")
    base = sps if name == "fp32-baseline" and sps else base
    misses += bool(problems)
    rows.append({"config": name, "rc": rc, "status": r.get("status"), "samples_per_s": sps,
                 "x_base": sps / base if sps and base else None, "warmup_s": r.get("warmup_s"),
                 "peak_mib": r["peak_memory_bytes"] / 2**20 if r.get("peak_memory_bytes") else None,
                 "gpu_util": r.get("gpu_util"), "device": r.get("device"),
                 "verdict": "MISS" if problems else "PASS", "problems": problems})
fmt = lambda x, spec: format(x, spec) if x is not None else "-"
print(f"{'config':20s} {'verdict':7s} {'rc':>3s} {'samples/s':>9s} {'x base':>6s} {'warmup s':>8s} "
      f"{'peak MiB':>8s} {'gpu%':>5s}  problems")
for w in rows:
    print(f"{w['config']:20s} {w['verdict']:7s} {w['rc']:>3s} {fmt(w['samples_per_s'], '9.1f'):>9s} "
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

assert_step() { # assert_step NAME CMD...: a check of its own, PASS or MISS in the summary
  local name=$1
  shift
  if "$@"; then
    SUMMARY+=("$(printf '%-26s %s' "$name" "PASS")")
  else
    SUMMARY+=("$(printf '%-26s %s' "$name" "MISS")")
    FAILED=$((FAILED + 1))
  fi
}

echo
echo "=== trials at 256 px, batch $BATCH, 10 timed steps (forced-oom: 112 x 1024 px)"
assert_step "assert trial results" check "${NAMES[@]}"

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

# ---------------------------------------------------------------------------------------------
# 5. a short real search through the warm fork server, then the study is asserted

STORE=${OUT:-$WORK}/gpu.db
rm -f "$STORE"
if (($(left) < 200)); then
  skip search "time guard: $(left)s left, the search needs ~200s"
else
  # SIGTERM from timeout acts like Ctrl-C: the running trial is killed and the best so far exported.
  step search 0 220 "${AT[@]}" search --budget "$SEARCH_BUDGET" --study gpu-check --storage "$STORE" \
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

finish $((FAILED > 0))
