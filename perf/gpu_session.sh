#!/usr/bin/env bash
# The GPU machine's measurements, prepared here so that its short time goes to measuring: run on the device
# tool's machine (one H100, 16 cores, Python 3.12 with its own PyTorch) in the repository root, with
# .gpu_site/ carried (perf/gpu_prepare.sh makes it; .gpu_doom/ too for `doom`). Each section writes its
# figures under $OUT: one JSON line per run in figures.jsonl; the output of every run goes to runs.log and
# their train.log files to train_logs.txt (at most 8 files come back from that machine).
#
#   perf/gpu_session.sh                                   # machine build tests smoke cartpole pong_ceiling pong
#   PONG_SEC=520 perf/gpu_session.sh tests pong           # Pong-v5 from scratch for the 10-minute score
#   perf/gpu_session.sh bf16 compile_pong breakout        # the A/B runs on Pong, Breakout's replay
#   perf/gpu_session.sh advice learner                    # the report's advice taken; the GPU learner's step
#   perf/gpu_session.sh doom                              # doom_basic sampling and training (carry .gpu_doom)
# Environment: RUN_SEC (seconds per throughput run, 20), PONG_SEC (Pong from scratch, 270), DEVICE (cuda; cpu
# to try the script without a GPU), PY (python3), SITE (.gpu_site; empty to use this machine's packages),
# BF16_FLAGS (the --bf16 values `bf16` runs, "false true").
set -uo pipefail
: "${OUT:?OUT must name the folder whose files come back}"
cd "$(dirname "$0")/.."
SITE=${SITE-$PWD/.gpu_site}  # SITE= (empty) to try the script here, with this machine's own packages
export PYTHONPATH=${SITE:+$SITE:}$PWD PYTHONUNBUFFERED=1
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
RUN_SEC=${RUN_SEC:-20}
PONG_SEC=${PONG_SEC:-270}
TD=$(mktemp -d)
# installed, envs/ is the package sf_engine.envs; not installed (the GPU machine's copy), a link makes it one
$PY -c "import sf_engine.envs" 2> /dev/null || ln -s ../envs sf_engine/envs

# run NAME SECONDS FLAGS...: train.py for SECONDS, then its summary's figures and last bottleneck report as one
# JSON line
run() {
  local name=$1 seconds=$2
  shift 2
  timeout $((seconds + 90)) $PY train.py --train_dir "$TD" --experiment "$name" --device "$DEVICE" \
    --train_for_seconds "$seconds" --train_for_env_steps 100000000000 "$@" > "$TD/$name.out" 2>&1
  { echo "=== $name: $*"; cat "$TD/$name.out"; } >> "$OUT/runs.log"
  $PY - "$TD/$name" "$name" "$*" >> "$OUT/figures.jsonl" <<'EOF'
import json, os, sys
try:
    s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
except OSError as exc:
    s = {"error": str(exc)}
keys = ("env_steps_per_sec", "frames_per_sec", "episode_return_mean", "eval_return_mean", "policy_lag_mean",
        "policy_lag_max", "num_workers", "num_envs_per_worker", "inference_batch_mean", "learner_version",
        "bottleneck", "bottleneck_report", "replay_ratio", "error")
try:  # the last 10-s window's rate (a --compile run's compiling is not in it)
    rates = [line.split(" env steps/s")[0].split("| ")[-1] for line in open(os.path.join(sys.argv[1], "train.log"))
             if " env steps/s (" in line]
    window = float(rates[-1].replace(",", "")) if rates else None
except (OSError, ValueError):
    window = None
print(json.dumps({"run": sys.argv[2], "flags": sys.argv[3], **{k: s.get(k) for k in keys if k in s},
                  "last_window_env_steps_per_sec": window}))
EOF
  { echo "=== $name"; cat "$TD/$name/train.log"; } >> "$OUT/train_logs.txt" 2> /dev/null
  tail -1 "$OUT/figures.jsonl"
}

machine() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
    $PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"; } \
    > "$OUT/machine.txt" 2>&1
  cat "$OUT/machine.txt"
}

build() {  # the compiled CPU kernels built there (Python 3.12), and taken; in the background, beside `tests` and
  # `smoke` (which time nothing), and waited for before `cartpole`
  # built apart, then each library renamed into place: a process that starts meanwhile never opens half a file
  { timeout 180 $PY setup.py build_ext --build-lib "$TD/lib" --build-temp "$TD/tmp" > "$OUT/build.log" 2>&1
    echo "build exit $?" >> "$OUT/machine.txt"
    for lib in "$TD"/lib/sf_engine/model/*.so; do
      name=$(basename "$lib")
      cp "$lib" "sf_engine/model/.$name" && mv "sf_engine/model/.$name" "sf_engine/model/$name"
    done
    $PY -c "from sf_engine.model.kernels import KERNELS; print('compiled kernels:', KERNELS is not None)" \
      >> "$OUT/machine.txt" 2>&1; } &
  BUILD=$!
}

tests() {  # the CUDA tests: graphs, pinned gathers, weights through CUDA IPC, the recurrent cores on CUDA
  timeout 240 $PY -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py > "$OUT/tests.txt" 2>&1
  tail -3 "$OUT/tests.txt"
}

smoke() {
  timeout 200 $PY perf/gpu_smoke.py > "$OUT/gpu_smoke.json" 2> "$TD/smoke.err"
  { echo "=== gpu_smoke stderr"; cat "$TD/smoke.err"; } >> "$OUT/runs.log"
  cat "$OUT/gpu_smoke.json"
}

cartpole() {  # ours sized for 16 cores and the GPU, eager and --compile, against the one-file PPO at two sizes
  [ -z "${BUILD:-}" ] || wait "$BUILD"
  BUILD=
  local sized=(--num_workers 14 --num_envs_per_worker 1024 --batch_size 65536 --num_batches_per_epoch 1)
  run cartpole_w14 "$RUN_SEC" "${sized[@]}"
  run cartpole_w14_compile $((RUN_SEC + 20)) "${sized[@]}" --compile true
  for envs in 1024 8192; do
    timeout $((RUN_SEC + 60)) $PY "${BASELINE:-.gpu_site/baselines/single_process_ppo.py}" --device "$DEVICE" \
      --seconds "$RUN_SEC" --num_envs "$envs" --target 1e9 > "$TD/single_ppo.out" 2>&1  # throughput: never stops early
    { echo "=== single_process_ppo --num_envs $envs"; cat "$TD/single_ppo.out"; } >> "$OUT/runs.log"
    $PY -c 'import json, sys; print(json.dumps({"run": "single_process_ppo", "num_envs": int(sys.argv[1]),
      "out": open(sys.argv[2]).read().strip().splitlines()[-1:]}))' "$envs" "$TD/single_ppo.out" \
      | tee -a "$OUT/figures.jsonl"
  done
}

pong_ceiling() {  # Pong's envs alone on every core: the frames/s that training is held against
  timeout 90 $PY perf/ceiling.py --env Pong-v5 --env_only --processes "$(nproc)" --seconds 10 \
    | tee -a "$OUT/figures.jsonl"
}

pong() { run pong_scratch "$PONG_SEC" --env Pong-v5 --num_workers 14; }

bf16() {  # the learner's and the policy worker's encoders in bfloat16, against float32, on Pong's CNN
  for flag in ${BF16_FLAGS:-false true}; do  # BF16_FLAGS=true: the bf16 run alone
    run "pong_bf16_$flag" "$RUN_SEC" --env Pong-v5 --num_workers 14 --bf16 "$flag"
  done
}

compile_pong() { run pong_compile $((RUN_SEC + 20)) --env Pong-v5 --num_workers 14 --compile true; }

breakout() {
  for algo in dqn pqn; do
    run "breakout_$algo" 30 --env Breakout-v5 --algo "$algo" --num_workers 14
  done
}

learner() {  # the GPU learner's step alone at CartPole's GPU sizes, and where its time goes (host or GPU)
  timeout 240 $PY perf/learner_step.py --steps 20 --profile 5 -- --device "$DEVICE" --num_workers 14 \
    --num_envs_per_worker 1024 --batch_size 65536 --num_batches_per_epoch 1 2>> "$OUT/runs.log" \
    | tee -a "$OUT/figures.jsonl"
}

advice() {  # the bottleneck report put to the test: each run's advice taken, the figure should move its way
  run pong_w10 "$RUN_SEC" --env Pong-v5 --num_workers 10  # sampling-bound: "add --num_workers (up to the cores)"
  run pong_w14 "$RUN_SEC" --env Pong-v5 --num_workers 14
  local sized=(--num_workers 14 --num_envs_per_worker 1024 --num_batches_per_epoch 1)
  run cartpole_b32k "$RUN_SEC" "${sized[@]}" --batch_size 32768  # learner-bound: "raise --batch_size"
  run cartpole_b64k "$RUN_SEC" "${sized[@]}" --batch_size 65536
}

doom() {
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/doom .gpu_doom/*.whl || return 1
  PYTHONPATH=/tmp/doom:$PYTHONPATH run doom_sampling "$RUN_SEC" --env doom_basic --num_workers 16 --sampling_only true
  PYTHONPATH=/tmp/doom:$PYTHONPATH run doom_training 60 --env doom_basic --num_workers 16
}

sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(machine build tests smoke cartpole pong_ceiling pong)
for section in "${sections[@]}"; do
  echo "== $section ($(date +%T))"
  "$section"
done
[ -z "${BUILD:-}" ] || wait "$BUILD"
tail -2 "$OUT/machine.txt" 2> /dev/null
rm -rf "$TD"
ls -la "$OUT"
