#!/usr/bin/env bash
# The GPU checks, prepared ahead and time-boxed, in order of value (benchmarks/README.md, "On a GPU"): for a GPU
# machine that is held for a limited time and reached one command at a time.
#
#   bash benchmarks/gpu_study.sh start SECONDS   # setup, CUDA tests, the default study started on the GPU
#   bash benchmarks/gpu_study.sh wait SECONDS    # a later command on the same machine: the study's end
#   bash benchmarks/gpu_study.sh methods SECONDS # bench_gpu.py --parts methods profile
#
# SECONDS is the command's time limit: "start" and "wait" return about 35 s before it, their logs copied.
#
# "start": wheels carried in .whl/ installed beside the machine image's torch (skipped with SKIP_WHEELS=1), the
# datasets generated, the CUDA-only tests (skipped with TESTS=0), then `dmlstudy study run` over plans/default.yaml
# with `workers: $WORKERS` (default 12, as plans/gpu.yaml; the only change) in its own process group, so it
# outlives the command. "start" polls it until it ends or the deadline and returns with it still running; "wait"
# polls it again until it ends or the deadline, then stops it (SIGTERM: finished runs are kept). Every 10 s a line
# of progress.tsv records the study's seconds, its finished run folders, its finished entries, the GPU's
# utilisation and memory (nvidia-smi) and the load average, so a study stopped by the time box still says how far
# it got and whether the GPU or the host was the bottleneck. A study that ends with more than 100 s left in
# "start" or "wait" is followed by `bench_gpu.py --parts methods` in what remains. Logs go to $OUT, else
# ./gpu_out.
set -u
OUT=${OUT:-gpu_out}
WORK=/tmp/gpu_study
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
STUDY_PLAN=$WORK/gpu_default.yaml
WORKERS=${WORKERS:-12}

collect() {
  cp "$WORK"/*.log "$WORK"/*.tsv "$OUT"/ 2>/dev/null
  [ results/claims.md -nt "$WORK/study.start" ] && cp results/claims.md "$OUT/gpu_claims.md"
  python3 - "$OUT/entries.json" <<'EOF' 2>/dev/null
import json, pathlib, sys
records = {p.parent.name: json.loads(p.read_text()) for p in sorted(pathlib.Path("runs/default").glob("*/study_entry.json"))}
pathlib.Path(sys.argv[1]).write_text(json.dumps({k: {"status": v["status"], "seconds": v["seconds"], "error": v["error"]} for k, v in records.items()}, indent=1))
EOF
  tail -n 25 "$WORK/setup.log"; tail -n 4 "$WORK/progress.tsv"; cat "$OUT/entries.json"
}

progress() {
  local finished entries
  finished=$(python3 -c 'import pathlib; from dmlstudy.run.identity import is_complete; print(sum(map(is_complete, pathlib.Path("runs/default").glob("*/"))))' 2>/dev/null)
  entries=$(grep -l '"complete"' runs/default/*/study_entry.json 2>/dev/null | wc -l)
  gpu=$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits 2>/dev/null | tr -d ' ' | tr ',' '\t')
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$finished" "$entries" "$gpu" "$(cut -d' ' -f1 /proc/loadavg)" >>"$WORK/progress.tsv"
}

poll() {  # until the study ends or $1 seconds since this script began (minus a margin for stopping and copying)
  while kill -0 "$(cat "$WORK/study.pid")" 2>/dev/null && ((SECONDS + 10 < $1 - 25)); do
    sleep 10
    progress $(($(date +%s) - $(cat "$WORK/study.start")))
  done
}

methods_if_time() {  # bench_gpu.py --parts methods when the study has ended with over 100 s left
  local left=$(($1 - 35 - SECONDS))
  kill -0 "$(cat "$WORK/study.pid")" 2>/dev/null && return
  ((left > 100)) || return
  timeout $((left - 10)) python3 benchmarks/bench_gpu.py --parts methods >"$WORK/methods.log" 2>&1
  echo "exit $?" >>"$WORK/methods.log"
}

case "${1:-start}" in
start)
  box=${2:-480}
  {
    date -u; nvidia-smi -L 2>&1; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
    nproc
    t=$SECONDS
    [ -n "${SKIP_WHEELS:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    echo "wheels installed in $((SECONDS - t)) s"
    t=$SECONDS
    python3 -m dmlstudy data generate
    echo "data generate: $((SECONDS - t)) s"
    t=$SECONDS
    [ "${TESTS:-1}" = 0 ] || timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_tensor_pipeline.py tests/test_diml.py -k "cuda or resident or autocast or masked"
    echo "CUDA tests: $((SECONDS - t)) s"
  } >"$WORK/setup.log" 2>&1
  sed "s/^  workers: 2\$/  workers: $WORKERS/" plans/default.yaml >"$STUDY_PLAN"
  grep -q "^  workers: $WORKERS\$" "$STUDY_PLAN" || echo "plan copy has no workers: $WORKERS" >>"$WORK/setup.log"
  printf 'seconds\tfinished_runs\tfinished_entries\tgpu_util_pct\tgpu_mem_mib\tload1\n' >"$WORK/progress.tsv"
  setsid nohup bash -c "start=\$(date +%s); python3 -m dmlstudy study run $STUDY_PLAN; echo \"study exit \$? after \$(( \$(date +%s) - start )) s\"" \
    >"$WORK/study.log" 2>&1 </dev/null &
  echo $! >"$WORK/study.pid"
  date +%s >"$WORK/study.start"
  poll "$box"
  methods_if_time "$box"
  collect
  ;;
wait)
  poll "${2:-150}"
  collect >/dev/null
  if kill -0 "$(cat "$WORK/study.pid")" 2>/dev/null; then
    echo "study stopped by the time box" >>"$WORK/study.log"
    pkill -TERM -f "dmlstudy study run"
    sleep 10
  fi
  progress stopped
  methods_if_time "${2:-150}"
  collect
  ;;
methods)
  timeout $((${2:-150} - 20)) python3 benchmarks/bench_gpu.py --parts methods profile >"$WORK/methods.log" 2>&1
  echo "exit $?" >>"$WORK/methods.log"
  collect
  ;;
esac
