#!/usr/bin/env bash
# Learned weights on one GPU (docs/trained-models.md): train the `base`
# recipe, then the fp8 weights x fp8 KV x max_num_seqs study and the speculation study on it (n-gram,
# and the `tiny` recipe as a draft model, trained here on CPU),
# then train the recipe once more and compare the weights' bytes (determinism on this GPU).
#   bash benchmarks/trained_gpu.sh RESULTS [STEPS]
# STEPS: any of train,quant,spec,again (default: all, in that order). train and again need only torch and
# transformers (benchmarks/trained_gpu.py train): `train,again` runs before vLLM and Ray are installed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out=$1 steps=${2:-train,quant,spec,again}
mkdir -p "$out"
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) gpu=H200 ;; *H100*) gpu=H100 ;; *) gpu=H200 ;;
esac
rc=0
step() { [[ ",$steps," == *",$1,"* ]]; }
if step train; then
  python3 benchmarks/trained_gpu.py train "$out/model" --recipe base 2>&1 | tail -5 || rc=$?
fi
for name in quant spec; do
  step $name || continue
  draft=()
  if [ $name = spec ]; then
    python3 -m orchestrator make-model tiny-llama "$out/draft" --weights trained 2>&1 | tail -2 || rc=$?
    draft=(--draft "$out/draft")
  fi
  python3 benchmarks/trained_gpu.py study search_spaces/trained-base-$name.yaml "$out/model" $gpu "${draft[@]}" \
    > "$out/trained-base-$name.yaml"
  python3 -m orchestrator run "$out/trained-base-$name.yaml" --output "$out/results" || rc=$?
done
if step again; then
  python3 benchmarks/trained_gpu.py train "$out/model-again" --recipe base 2>&1 | tail -3
  sha256sum "$out/model/model.safetensors" "$out/model-again/model.safetensors" | tee "$out/determinism.txt"
  # what torch reported as non-deterministic in each training (training.json, determinism_warnings)
  for m in model model-again; do
    python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print(sys.argv[1], r['seconds'], 's',
      r['heldout_perplexity'], r.get('determinism_warnings'))" "$out/$m/training.json" | tee -a "$out/determinism.txt"
  done
fi
exit $rc
