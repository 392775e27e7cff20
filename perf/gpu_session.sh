#!/usr/bin/env bash
# The GPU machine's measurements, prepared here so that its short time goes to measuring: run on the device
# tool's machine (one H100, 16 cores, Python 3.12 with its own PyTorch) in the repository root, with
# .gpu_site/ carried (perf/gpu_prepare.sh makes it; .gpu_doom/ too for `doom`). Each section writes its
# figures under $OUT: one JSON line per run in figures.jsonl, and the logs.
#
#   perf/gpu_session.sh                       # setup smoke cartpole bf16 breakout tests (about 7 minutes)
#   perf/gpu_session.sh setup pong            # Pong-v5 from scratch for 9 minutes
#   perf/gpu_session.sh setup doom            # doom_basic sampling and training (carry .gpu_doom alone)
# Environment: RUN_SEC (seconds per throughput run, 30), DEVICE (cuda; cpu to try the script without a GPU),
# PY (python3), SITE (.gpu_site; empty to use this machine's packages).
set -uo pipefail
: "${OUT:?OUT must name the folder whose files come back}"
cd "$(dirname "$0")/.."
SITE=${SITE-$PWD/.gpu_site}  # SITE= (empty) to try the script here, with this machine's own packages
export PYTHONPATH=${SITE:+$SITE:}$PWD PYTHONUNBUFFERED=1
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
RUN_SEC=${RUN_SEC:-30}
TD=$(mktemp -d)
# installed, envs/ is the package sf_engine.envs; not installed (the GPU machine's copy), a link makes it one
$PY -c "import sf_engine.envs" 2> /dev/null || ln -s ../envs sf_engine/envs

# run NAME SECONDS FLAGS...: train.py for SECONDS, then its summary's figures as one JSON line
run() {
  local name=$1 seconds=$2
  shift 2
  timeout $((seconds + 90)) $PY train.py --train_dir "$TD" --experiment "$name" --device "$DEVICE" \
    --train_for_seconds "$seconds" --train_for_env_steps 100000000000 "$@" > "$OUT/$name.log" 2>&1
  $PY - "$TD/$name/summary.json" "$name" "$*" >> "$OUT/figures.jsonl" <<'EOF'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except OSError as exc:
    s = {"error": str(exc)}
keys = ("env_steps_per_sec", "frames_per_sec", "episode_return_mean", "eval_return_mean", "policy_lag_mean",
        "policy_lag_max", "num_workers", "num_envs_per_worker", "bottleneck", "replay_ratio", "error")
print(json.dumps({"run": sys.argv[2], "flags": sys.argv[3], **{k: s.get(k) for k in keys if k in s}}))
EOF
  tail -1 "$OUT/figures.jsonl"
}

setup() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
    $PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"; } \
    > "$OUT/machine.txt" 2>&1
  timeout 180 $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1
  $PY -c "from sf_engine.model.kernels import KERNELS; print('compiled kernels:', KERNELS is not None)" \
    | tee -a "$OUT/machine.txt"
}

smoke() { timeout 150 $PY perf/gpu_smoke.py > "$OUT/gpu_smoke.json" 2> "$OUT/gpu_smoke.err"; cat "$OUT/gpu_smoke.json"; }

cartpole() {  # ours sized for 16 cores and the GPU, against the one-file PPO at two sizes, in the same call
  run cartpole_w14 "$RUN_SEC" --num_workers 14 --num_envs_per_worker 1024 --batch_size 65536 \
    --num_batches_per_epoch 1
  for envs in 64 4096; do
    timeout $((RUN_SEC + 60)) $PY "${BASELINE:-.gpu_site/baselines/single_process_ppo.py}" --device "$DEVICE" \
      --seconds "$RUN_SEC" --num_envs "$envs" > "$OUT/single_ppo_$envs.log" 2>&1
    echo "{\"run\": \"single_process_ppo\", \"num_envs\": $envs, \"out\": $(tail -1 "$OUT/single_ppo_$envs.log" | $PY -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))')}" \
      | tee -a "$OUT/figures.jsonl"
  done
}

bf16() {  # the learner's and the policy worker's encoders in bfloat16, against float32, on Pong's CNN
  for flag in false true; do
    run "pong_bf16_$flag" "$RUN_SEC" --env Pong-v5 --num_workers 14 --bf16 "$flag"
  done
}

breakout() {
  for algo in dqn pqn; do
    run "breakout_$algo" 60 --env Breakout-v5 --algo "$algo" --num_workers 14
  done
}

tests() {  # the suite's CUDA-facing tests where a GPU is present
  timeout 240 $PY -m pytest -q -x tests/test_ops.py tests/test_recurrent.py tests/test_shared_buffers.py \
    > "$OUT/tests.txt" 2>&1
  tail -3 "$OUT/tests.txt"
}

pong() { run pong_9min 540 --env Pong-v5 --num_workers 14; }

doom() {
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/doom .gpu_doom/*.whl || return 1
  PYTHONPATH=/tmp/doom:$PYTHONPATH run doom_sampling "$RUN_SEC" --env doom_basic --num_workers 16 --sampling_only true
  PYTHONPATH=/tmp/doom:$PYTHONPATH run doom_training 60 --env doom_basic --num_workers 16
}

sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(setup smoke cartpole bf16 breakout tests)
for section in "${sections[@]}"; do
  echo "== $section ($(date +%T))"
  "$section"
done
rm -rf "$TD"
ls -la "$OUT"
