#!/usr/bin/env bash
# The GPU path in one short prepared run, for a machine with a CUDA GPU (none was available
# when the callbacks were written: every published figure so far is from CPUs).
#
#   bash bench/gpu_check.sh            # results under $OUT (or ./gpu-results)
#
# 1. what the machine has (nvidia-smi, torch.cuda, pynvml);
# 2. bench/hook_overhead.py --device cuda, if that benchmark has the option by then
#    (its owner adds it; this script never edits it), in its quick form;
# 3. bench/gpu_check.py: statistics reduced on the device against the CPU, the hook's
#    overhead on a CUDA CNN, the NVML monitor's GPU samples, and the three framework
#    callbacks on the device with a real fault.
# Each step's output goes to its own file; the script's exit code is gpu_check.py's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD/shared${PYTHONPATH:+:$PYTHONPATH}" KERAS_BACKEND=torch HF_HUB_OFFLINE=1

{
  nvidia-smi || echo "nvidia-smi: not found"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'devices', torch.cuda.device_count())"
  "$PY" -c "import pynvml; pynvml.nvmlInit(); print('pynvml: NVML', pynvml.nvmlSystemGetDriverVersion())" \
    || echo "pynvml: not importable (pip install nvidia-ml-py): the monitor records no GPU samples"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

if "$PY" bench/hook_overhead.py --help 2>/dev/null | grep -q -- "--device"; then
  timeout 300 "$PY" bench/hook_overhead.py --device cuda --quick --no-docs > "$OUT/hook_overhead_cuda.txt" 2>&1
  echo "bench/hook_overhead.py --device cuda --quick: exit $? (output in $OUT/hook_overhead_cuda.txt)"
else
  echo "bench/hook_overhead.py has no --device option yet: gpu_check.py's overhead part stands in" \
    | tee "$OUT/hook_overhead_cuda.txt"
fi

timeout 420 "$PY" bench/gpu_check.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/gpu_check.txt"
exit "${PIPESTATUS[0]}"
