#!/usr/bin/env bash
# Makes the Megatron-LM checkpoint fixtures of tests/interop/test_megatron_fixtures.py with real
# Megatron-LM (pretrain_gpt.py, --transformer-impl local, --mock-data) on a GPU machine with
# PyTorch, and dumps every tensor of each alongside as Megatron itself merges it.
#
#   here:    bash testdata/megatron/prepare_megatron.sh GIT_DIR   # .cache/megatron-lm
#   device:  bash testdata/megatron/make_fixtures.sh [--gpus 1|2] [--only NAME[,NAME...]] [--list]
#            (scripts/device_check.sh megatron-fixtures [--gpus 2] does the same after unpacking)
#
# --gpus 1 (default) makes the fixtures of one rank, --gpus 2 those of two (TP2, PP2, DP2: Megatron
# needs one GPU per rank). Each fixture is a tiny GPT-2-style model (LayerNorm, tanh GELU, learned
# positions, biases, tied embeddings; 4 layers, hidden 16) or Llama-style one (RMSNorm, SwiGLU,
# RoPE, grouped-query attention, no biases, untied; 2 layers, hidden 32), bf16 with fp32 main
# weights, trained 3 iterations on mock data (NullTokenizer, vocabulary 128) and saved at
# iteration 3 in --ckpt-format torch or torch_dist, with or without --use-distributed-optimizer.
#
# For each fixture NAME, testdata/megatron/NAME/ gets:
#   ckpt/             the checkpoint as Megatron saved it (tracker file, iter_0000003/...)
#   dump.safetensors  every tensor, merged over TP/PP/DP by Megatron itself: the checkpoint is
#                     loaded again by pretrain_gpt.py (--ckpt-convert-format torch_dist
#                     --dist-ckpt-optim-fully-reshardable: Megatron's own loader and converter) and
#                     PyTorch's dcp_to_torch_save merges the chunks (dump_fixture.py); names are
#                     param/<name> (bf16 weights), main_param/<name>, exp_avg/<name>,
#                     exp_avg_sq/<name> (fp32), Megatron-Core names with global layer indices
#   meta.json         iteration, Adam step, the fixture's layout and model
#   command.txt       the pretrain_gpt.py arguments that trained it
#   VERSIONS          Megatron-LM commit, torch, Python, CUDA, GPU
#
# Output: with $OUT set (the device tool's output folder), a tarball
# $OUT/megatron_fixtures_<N>gpu.tar.gz holding testdata/megatron/<NAME>/... (extract it at the
# repository root) and the log $OUT/make_fixtures_<N>gpu.log; without $OUT, straight into
# testdata/megatron/.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/testdata/megatron"
MEGATRON="${MEGATRON_LM:-$ROOT/.cache/megatron-lm}"
GPUS=1
ONLY=""
LIST=0
while (($#)); do
  case "$1" in
    --gpus) GPUS="$2"; shift 2 ;;
    --only) ONLY=",$2,"; shift 2 ;;
    --list) LIST=1; shift ;;
    *) echo "make_fixtures: unknown argument $1" >&2; exit 2 ;;
  esac
done

# name model format tp pp dp distopt gpus
FIXTURES=(
  "gpt_torch_tp1           gpt   torch      1 1 1 0 1"
  "gpt_torch_tp1_distopt   gpt   torch      1 1 1 1 1"
  "llama_torch_tp1_distopt llama torch      1 1 1 1 1"
  "gpt_dist_tp1            gpt   torch_dist 1 1 1 0 1"
  "llama_dist_tp1_distopt  llama torch_dist 1 1 1 1 1"
  "gpt_torch_tp2           gpt   torch      2 1 1 0 2"
  "gpt_torch_tp2_distopt   gpt   torch      2 1 1 1 2"
  "gpt_torch_pp2           gpt   torch      1 2 1 0 2"
  "gpt_torch_pp2_distopt   gpt   torch      1 2 1 1 2"
  "gpt_torch_dp2_distopt   gpt   torch      1 1 2 1 2"
  "llama_torch_tp2         llama torch      2 1 1 0 2"
  "llama_dist_tp2_distopt  llama torch_dist 2 1 1 1 2"
)
if ((LIST)); then printf '%s\n' "${FIXTURES[@]}"; exit 0; fi

[[ -f "$MEGATRON/pretrain_gpt.py" ]] || {
  echo "make_fixtures: no Megatron-LM at $MEGATRON (run testdata/megatron/prepare_megatron.sh here)" >&2
  exit 1
}
have=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if ((have < GPUS)); then
  echo "make_fixtures: --gpus $GPUS needs $GPUS GPUs, found $have" >&2
  exit 1
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
if [[ -n "${OUT:-}" ]]; then
  DEST="$WORK/out/testdata/megatron"
  LOG="$OUT/make_fixtures_${GPUS}gpu.log"
else
  DEST="$HERE"
  LOG="$WORK/make_fixtures.log"
fi
mkdir -p "$DEST"
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }

versions() {
  echo "megatron-lm $(cat "$MEGATRON/COMMIT" 2>/dev/null || echo unknown)"
  python3 -c 'import sys, torch, numpy; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda); print("numpy", numpy.__version__); print("gpu", torch.cuda.get_device_name(0))'
  echo "made $(date -u +%Y-%m-%dT%H:%MZ) by testdata/megatron/make_fixtures.sh --gpus $GPUS"
}

# Megatron's flags for the two model shapes (no TransformerEngine, Apex or fused kernels there).
COMMON=(--transformer-impl local --bf16 --mock-data --tokenizer-type NullTokenizer --vocab-size 128
  --no-gradient-accumulation-fusion --no-masked-softmax-fusion --no-bias-gelu-fusion
  --no-bias-swiglu-fusion --no-bias-dropout-fusion --no-persist-layer-norm --no-rope-fusion
  --hidden-dropout 0 --attention-dropout 0 --micro-batch-size 2 --global-batch-size 4
  --train-iters 3 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 1
  --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --seed 1234 --log-interval 1
  --eval-iters 0 --eval-interval 1000 --save-interval 3)
GPT=(--num-layers 4 --hidden-size 16 --num-attention-heads 2 --ffn-hidden-size 64 --seq-length 32
  --max-position-embeddings 32 --openai-gelu)
LLAMA=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --group-query-attention
  --num-query-groups 2 --kv-channels 8 --ffn-hidden-size 48 --seq-length 32
  --max-position-embeddings 32 --normalization RMSNorm --swiglu --position-embedding-type rope
  --disable-bias-linear --untie-embeddings-and-output-weights)

megatron() {  # NPROC ARGS...: pretrain_gpt.py under torchrun, Megatron's prebuilt helpers
  local nproc="$1"
  shift
  PATH="$MEGATRON/bin:$PATH" PYTHONPATH="$MEGATRON${PYTHONPATH:+:$PYTHONPATH}" \
    CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONUNBUFFERED=1 \
    python3 -m torch.distributed.run --standalone --nproc_per_node "$nproc" \
    "$MEGATRON/pretrain_gpt.py" "$@"
}

same_run() {  # LOG_A LOG_B: the same loss, grad norm and skips at every iteration, digit for digit
  local a b
  a=$(grep -oE "iteration +[0-9]+/.*" "$1" | sed -E 's/elapsed time per iteration \(ms\): [0-9.]+ \|//')
  b=$(grep -oE "iteration +[0-9]+/.*" "$2" | sed -E 's/elapsed time per iteration \(ms\): [0-9.]+ \|//')
  [[ -n "$a" && "$a" == "$b" ]] || { diff <(echo "$a") <(echo "$b") | tee -a "$LOG"; return 1; }
}

status=0
made=()
for row in "${FIXTURES[@]}"; do
  read -r name model format tp pp dp distopt gpus <<<"$row"
  [[ "$gpus" == "$GPUS" ]] || continue
  [[ -z "$ONLY" || "$ONLY" == *",$name,"* ]] || continue
  say "== $name: $model, --ckpt-format $format, TP$tp PP$pp DP$dp, distributed optimizer $distopt"
  out="$WORK/$name"
  mkdir -p "$out"
  shape=("${GPT[@]}")
  [[ "$model" == llama ]] && shape=("${LLAMA[@]}")
  run=("${shape[@]}" "${COMMON[@]}" --tensor-model-parallel-size "$tp"
    --pipeline-model-parallel-size "$pp")
  ((distopt)) && run+=(--use-distributed-optimizer)
  if ! megatron "$gpus" "${run[@]}" --ckpt-format "$format" --save "$out/ckpt" \
      >"$out/train.log" 2>&1; then
    say "$name: pretrain_gpt.py failed"; tail -n 40 "$out/train.log" | tee -a "$LOG"; status=1; continue
  fi
  grep -E "iteration +[0-9]+/" "$out/train.log" | tee -a "$LOG"
  it_dir="$out/ckpt/iter_0000003"
  [[ -d "$it_dir" ]] || { say "$name: no iter_0000003 saved"; status=1; continue; }
  # What Megatron itself makes of the checkpoint, merged over TP/PP/DP: a torch_dist copy with the
  # optimizer state in model space. Without the distributed optimizer Megatron converts the saved
  # checkpoint (--ckpt-convert-format), unless the run already saved one (torch_dist). With it,
  # Megatron without TransformerEngine or Apex cannot load its own distributed-optimizer files
  # (torch.optim.Adam keeps a 'step' tensor per parameter that the files do not hold: KeyError
  # 'step' in _set_main_param_and_optimizer_states), so a twin run with the same flags and seed
  # saves --ckpt-format torch_dist --dist-ckpt-optim-fully-reshardable instead, and must log the
  # same loss and grad norm at every iteration (same_run checks).
  dcp="$it_dir"
  if ((distopt)); then
    if ! megatron "$gpus" "${run[@]}" --ckpt-format torch_dist --dist-ckpt-optim-fully-reshardable \
        --save "$out/twin" >"$out/twin.log" 2>&1; then
      say "$name: twin run failed"; tail -n 40 "$out/twin.log" | tee -a "$LOG"; status=1; continue
    fi
    if ! same_run "$out/train.log" "$out/twin.log"; then
      say "$name: the twin run logged other figures"; status=1; continue
    fi
    dcp="$out/twin/iter_0000003"
  elif [[ "$format" == torch ]]; then
    if ! megatron "$gpus" "${run[@]}" --ckpt-format "$format" --load "$out/ckpt" \
        --ckpt-convert-format torch_dist --ckpt-convert-save "$out/convert" \
        --dist-ckpt-optim-fully-reshardable >"$out/convert.log" 2>&1; then
      say "$name: conversion by pretrain_gpt.py failed"; tail -n 40 "$out/convert.log" | tee -a "$LOG"
      status=1; continue
    fi
    dcp="$out/convert/torch_dist/iter_0000003"
  fi
  dest="$DEST/$name"
  rm -rf "$dest"
  mkdir -p "$dest"
  cp -r "$out/ckpt" "$dest/ckpt"
  if ! PYTHONPATH="$MEGATRON" python3 "$HERE/dump_fixture.py" dump --dcp "$dcp" --out "$dest/dump.safetensors" \
      --meta "$dest/meta.json" --set "name=$name" --set "model=$model" --set "format=$format" \
      --set "tp=$tp" --set "pp=$pp" --set "dp=$dp" --set "distributed_optimizer=$distopt" \
      2>&1 | tee -a "$LOG"; then
    say "$name: dump failed"; status=1; continue
  fi
  printf '%q ' pretrain_gpt.py "${run[@]}" --ckpt-format "$format" --save ckpt >"$dest/command.txt"
  echo >>"$dest/command.txt"
  versions >"$dest/VERSIONS"
  made+=("$name")
  say "$name: $(du -sh "$dest" | cut -f1)"
done
((${#made[@]})) || { say "make_fixtures: no fixture made"; exit 1; }
if [[ -n "${OUT:-}" ]]; then
  tar -czf "$OUT/megatron_fixtures_${GPUS}gpu.tar.gz" -C "$WORK/out" testdata
  say "$OUT/megatron_fixtures_${GPUS}gpu.tar.gz: ${made[*]} ($(du -h "$OUT/megatron_fixtures_${GPUS}gpu.tar.gz" | cut -f1)); extract at the repository root"
fi
exit $status
