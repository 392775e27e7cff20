#!/usr/bin/env bash
# The GPU machine's measurements, prepared here so that its short time goes to measuring: run on the device
# tool's machine (one H100 or H200, 16 cores, Python 3.12 with its own PyTorch) in the repository root, with
# .gpu_site/ carried (perf/gpu_prepare.sh makes it; .gpu_doom/ too for `doom`). Each section writes its
# figures under $OUT: one JSON line per run in figures.jsonl; the output of every run goes to runs.log and
# their train.log files to train_logs.txt (at most 8 files come back from that machine).
#
#   BUDGET_SEC=585 perf/gpu_session.sh      # machine build tests smoke device_envs: the CUDA tests, every CUDA
#                                           # path end to end, the torch CartPole on the GPU (PPO, PQN)
#   BUDGET_SEC=585 PONG_SEC=540 perf/gpu_session.sh tests_beside pong    # Pong-v5 from scratch until its score
#                                           # reaches 15, the CUDA tests beside it
#   BUDGET_SEC=585 perf/gpu_session.sh device_pendulum    # SAC and TD3 on the torch Pendulum against Gymnasium's
#   BUDGET_SEC=585 perf/gpu_session.sh brax               # Brax's ant: our PPO against Brax's trainer (.gpu_brax)
#   BUDGET_SEC=585 perf/gpu_session.sh bf16 compile_pong breakout learner advice doom   # the A/B runs (bf16,
#                                           # --compile), Breakout's replay, the GPU learner's step, the report's
#                                           # advice taken, doom_basic sampling and training (carry .gpu_doom)
#   BUDGET_SEC=585 perf/gpu_session.sh offpolicy_updates  # SAC's and TD3's updates/s, GPU against CPU, --compile
#                                           # (carry .gpu_brax, for MuJoCo)
#   BUDGET_SEC=585 perf/gpu_session.sh ranks  # two learner ranks on the one GPU (gloo): the same weights and return
#                                           # as one learner; the one-GPU costs of the scaling model
#   perf/gpu_session.sh cartpole pong_ceiling     # CPU envs on 16 cores (measured on an H100, 2026-11-27)
# Environment: RUN_SEC (seconds per throughput run, 20), PONG_SEC (Pong from scratch, at most; 270),
# PONG_TARGET (the score that ends it, 15), PENDULUM_SEC (`device_pendulum`'s runs, 120), BRAX_SEC and BRAX_STEPS
# (`brax`: each run's limit, 150 s, and env steps, 10,000,000), BUDGET_SEC (the seconds this call has, at most the
# device time left less a minute: a section or run that no longer fits is skipped and named in figures.jsonl),
# DEVICE (cuda; cpu to try the script without a GPU), PY (python3), SITE (.gpu_site; empty to use this machine's
# packages), BF16_FLAGS (the --bf16 values `bf16` runs, "false true").
set -uo pipefail
: "${OUT:?OUT must name the folder whose files come back}"
cd "$(dirname "$0")/.."
SITE=${SITE-$PWD/.gpu_site}  # SITE= (empty) to try the script here, with this machine's own packages
export PYTHONPATH=${SITE:+$SITE:}$PWD PYTHONUNBUFFERED=1
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
RUN_SEC=${RUN_SEC:-20}
PONG_SEC=${PONG_SEC:-270}
PENDULUM_SEC=${PENDULUM_SEC:-120}  # each of `device_pendulum`'s four runs
BRAX_SEC=${BRAX_SEC:-150}  # each of the two runs of perf/brax_ppo.py in `brax`, at most
TD=$(mktemp -d)
# installed, envs/ is the package sf_engine.envs; not installed (the GPU machine's copy), a link makes it one
$PY -c "import sf_engine.envs" 2> /dev/null || ln -s ../envs sf_engine/envs

# run NAME SECONDS FLAGS...: train.py for SECONDS, then its summary's figures and last bottleneck report as one
# JSON line (skipped, and named in figures.jsonl, where BUDGET_SEC no longer leaves SECONDS and 30 s for it)
run() {
  local name=$1 seconds=$2
  shift 2
  if [ -n "${BUDGET_SEC:-}" ] && [ $((BUDGET_SEC - SECONDS)) -lt $((seconds + 30)) ]; then
    echo "{\"run\": \"$name\", \"skipped\": \"$((BUDGET_SEC - SECONDS)) s left of BUDGET_SEC\"}" \
      | tee -a "$OUT/figures.jsonl"
    return
  fi
  echo "=== $name: $*" >> "$OUT/runs.log"  # its output straight there: a call cut short keeps what it printed
  timeout -k 20 $((seconds + 90)) $PY train.py --train_dir "$TD" --experiment "$name" --device "$DEVICE" \
    --train_for_seconds "$seconds" --train_for_env_steps 100000000000 "$@" >> "$OUT/runs.log" 2>&1
  $PY - "$TD/$name" "$name" "$*" >> "$OUT/figures.jsonl" <<'EOF'
import json, os, sys
try:
    s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
except OSError as exc:
    s = {"error": str(exc)}
keys = ("env_steps_per_sec", "frames_per_sec", "episode_return_mean", "eval_return_mean", "policy_lag_mean",
        "policy_lag_max", "learner_samples", "num_workers", "num_envs_per_worker", "inference_batch_mean",
        "learner_version",
        "bottleneck", "bottleneck_report", "replay_ratio", "wall_sec", "env_steps", "episodes", "error")
number = lambda text: float(text.replace(",", ""))
window, returns, stopped = None, [], None
try:  # each status line: [seconds] env steps N | R env steps/s (..., 10 s) | return X (last 100 of E) | ...
    lines = open(os.path.join(sys.argv[1], "train.log")).readlines()
except OSError:
    lines = []
for line in lines:
    try:
        if " env steps/s (" in line:  # the last 10-s window's rate (a --compile run's compiling is not in it)
            window = number(line.split(" env steps/s")[0].split("| ")[-1])
            if "| return - " not in line:  # the return over time: [seconds, env steps, mean of the last 100]
                seconds = number(line.split("[")[1].split("s]")[0])
                steps = number(line.split("env steps ")[1].split(" |")[0])
                returns.append([seconds, int(steps), number(line.split("| return ")[1].split(" ")[0])])
        if " stopped: " in line:
            stopped = line.split(" stopped: ")[1].strip()
    except (ValueError, IndexError):
        continue
print(json.dumps({"run": sys.argv[2], "flags": sys.argv[3], **{k: s.get(k) for k in keys if k in s},
                  "last_window_env_steps_per_sec": window, "stopped": stopped, "returns": returns}))
EOF
  { echo "=== $name"; cat "$TD/$name/train.log"; } >> "$OUT/train_logs.txt" 2> /dev/null
  tail -1 "$OUT/figures.jsonl" | cut -c1-700  # the whole line (with the return over time) comes back in the file
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
  { timeout -k 20 180 $PY setup.py build_ext --build-lib "$TD/lib" --build-temp "$TD/tmp" > "$OUT/build.log" 2>&1
    echo "build exit $?" >> "$OUT/machine.txt"
    for lib in "$TD"/lib/sf_engine/model/*.so; do
      name=$(basename "$lib")
      cp "$lib" "sf_engine/model/.$name" && mv "sf_engine/model/.$name" "sf_engine/model/$name"
    done
    $PY -c "from sf_engine.model.kernels import KERNELS; print('compiled kernels:', KERNELS is not None)" \
      >> "$OUT/machine.txt" 2>&1; } &
  BUILD=$!
}

tests() {  # the CUDA tests: graphs, pinned gathers, weights through CUDA IPC, the recurrent cores on CUDA, and
  # device mode's observations in the GPU's memory (PPO and DQN learning from them, in runs of their own processes)
  local kept=tests/test_device_mode.py::test_algorithms_learn_from_observations_kept_apart_from_the_shared_memory
  local shared=tests/test_ranks.py::test_two_ranks_step_with_the_mean_gradient_and_hold_the_same_weights_bit_for_bit
  timeout -k 20 240 $PY -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py "$kept[async-cuda-ppo]" \
    "$kept[async-cuda-dqn]" "$shared[cuda:0]" > "$OUT/tests.txt" 2>&1
  tail -3 "$OUT/tests.txt"
}

tests_beside() {  # the same in the background, beside a run that is timed for its score, not its rate (pong)
  tests > /dev/null &
  TESTS=$!
}

smoke() {
  echo "=== gpu_smoke (each run's result as it ends)" >> "$OUT/runs.log"
  timeout -k 20 240 $PY perf/gpu_smoke.py --device "$DEVICE" > "$OUT/gpu_smoke.json" 2>> "$OUT/runs.log"
  cat "$OUT/gpu_smoke.json"
}

cartpole() {  # ours sized for 16 cores and the GPU, eager and --compile, against the one-file PPO at two sizes
  [ -z "${BUILD:-}" ] || wait "$BUILD"
  BUILD=
  local sized=(--num_workers 14 --num_envs_per_worker 1024 --batch_size 65536 --num_batches_per_epoch 1)
  run cartpole_w14 "$RUN_SEC" "${sized[@]}"
  run cartpole_w14_compile $((RUN_SEC + 20)) "${sized[@]}" --compile true
  for envs in 1024 8192; do
    timeout -k 20 $((RUN_SEC + 60)) $PY "${BASELINE:-.gpu_site/baselines/single_process_ppo.py}" --device "$DEVICE" \
      --seconds "$RUN_SEC" --num_envs "$envs" --target 1e9 > "$TD/single_ppo.out" 2>&1  # throughput: never stops early
    { echo "=== single_process_ppo --num_envs $envs"; cat "$TD/single_ppo.out"; } >> "$OUT/runs.log"
    $PY -c 'import json, sys; print(json.dumps({"run": "single_process_ppo", "num_envs": int(sys.argv[1]),
      "out": open(sys.argv[2]).read().strip().splitlines()[-1:]}))' "$envs" "$TD/single_ppo.out" \
      | tee -a "$OUT/figures.jsonl"
  done
}

pong_ceiling() {  # Pong's envs alone on every core: the frames/s that training is held against
  timeout -k 20 90 $PY perf/ceiling.py --env Pong-v5 --env_only --processes "$(nproc)" --seconds 10 \
    | tee -a "$OUT/figures.jsonl"
}

pong() {  # from scratch until the mean score of the last 100 games reaches PONG_TARGET, at most PONG_SEC (and
  # what BUDGET_SEC leaves, less the stop's minute)
  local seconds=$PONG_SEC
  [ -z "${BUDGET_SEC:-}" ] || seconds=$((BUDGET_SEC - SECONDS - 60 < PONG_SEC ? BUDGET_SEC - SECONDS - 60 : PONG_SEC))
  run pong_scratch "$seconds" --env Pong-v5 --num_workers 14 --stop_at_return "${PONG_TARGET:-15}"
}

bf16() {  # bfloat16 encoders against float32: CartPole's whole run (learner-bound on the GPU, so the learner's
  # dtype can move its rate; and does it still learn), then Pong's CNN learner step alone (Pong's runs are bound by
  # its envs)
  local sized=(--num_workers 14 --num_envs_per_worker 1024 --batch_size 65536 --num_batches_per_epoch 1)
  for flag in ${BF16_FLAGS:-false true}; do  # BF16_FLAGS=true: the bf16 runs alone
    run "cartpole_bf16_$flag" "$RUN_SEC" "${sized[@]}" --bf16 "$flag"
  done
  for flag in ${BF16_FLAGS:-false true}; do
    pong_step --bf16 "$flag"
  done
}

# pong_step FLAGS...: Pong's learner step alone (perf/learner_step.py) with these train.py flags, once a call
declare -A PONG_STEPS=()
pong_step() {
  [ -z "${PONG_STEPS[$*]:-}" ] || return 0
  PONG_STEPS[$*]=1
  timeout -k 20 120 $PY perf/learner_step.py --steps 30 -- --device "$DEVICE" --env Pong-v5 --num_workers 14 \
    --num_envs_per_worker 32 "$@" 2>> "$OUT/runs.log" | tee -a "$OUT/figures.jsonl"
}

compile_pong() { run pong_compile $((RUN_SEC + 20)) --env Pong-v5 --num_workers 14 --compile true; }

breakout() {
  for algo in dqn pqn; do
    run "breakout_$algo" 30 --env Breakout-v5 --algo "$algo" --num_workers 14
  done
}

learner() {  # the GPU learner's step alone at CartPole's GPU sizes, and where its time goes (host or GPU); then
  # Pong's at minibatches of 1,024 (the Atari default before 2026-11-27) and 256 (its default, as in Sample
  # Factory and CleanRL; float32, as `bf16` measures it): the samples/s a GPU learner takes at each, against the
  # 16,000 env steps/s that Pong's envs make on these cores
  timeout -k 20 240 $PY perf/learner_step.py --steps 20 --profile 5 -- --device "$DEVICE" --num_workers 14 \
    --num_envs_per_worker 1024 --batch_size 65536 --num_batches_per_epoch 1 2>> "$OUT/runs.log" \
    | tee -a "$OUT/figures.jsonl"
  pong_step --batch_size 1024 --num_batches_per_epoch 4
  pong_step --bf16 false
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

device_envs() {  # envs on the GPU (device mode): the torch CartPole with PPO at GPU sizes (one sampler, two, then one
  # of 4x the envs, whose learner step takes 4x the samples) and with PQN
  local sized=(--num_envs_per_worker 8192 --worker_num_splits 2 --batch_size 65536 --num_batches_per_epoch 2)
  run device_cartpole_ppo "$RUN_SEC" --env TorchCartPole-v1 "${sized[@]}"
  run device_cartpole_ppo_w2 "$RUN_SEC" --env TorchCartPole-v1 --num_workers 2 "${sized[@]}"
  run device_cartpole_ppo_big "$RUN_SEC" --env TorchCartPole-v1 --num_envs_per_worker 32768 --worker_num_splits 2 \
    --rollout 16 --batch_size 262144 --num_batches_per_epoch 1
  run device_cartpole_pqn "$RUN_SEC" --env TorchCartPole-v1 --algo pqn --num_envs_per_worker 8192 \
    --worker_num_splits 2 --batch_size 32768 --num_batches_per_epoch 4
}

device_pendulum() {  # SAC and TD3 on the torch Pendulum (device mode) against Gymnasium's Pendulum through rollout
  # workers: updates/s and the return after PENDULUM_SEC each
  for algo in sac td3; do
    run "device_pendulum_$algo" "$PENDULUM_SEC" --env TorchPendulum-v1 --algo "$algo" --eval_every_sec 20
    run "cpu_pendulum_$algo" "$PENDULUM_SEC" --env Pendulum-v1 --algo "$algo" --eval_every_sec 20
  done
}

brax_site() {  # Brax's, MuJoCo's and Playground's wheels (carry .gpu_brax) installed once, in /tmp/brax
  [ -d /tmp/brax ] || $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/brax .gpu_brax/*.whl
}

brax() {  # Brax's ant through the JAX bridge against Brax's own PPO trainer, the same env steps, then Playground's
  # CartpoleBalance at GPU sizes (carry .gpu_brax)
  brax_site || return 1
  PYTHONPATH=/tmp/brax:$PYTHONPATH timeout -k 20 $((2 * BRAX_SEC + 60)) $PY perf/brax_ppo.py --env ant \
    --device "$DEVICE" --env_steps "${BRAX_STEPS:-10000000}" --timeout_sec "$BRAX_SEC" 2>> "$OUT/runs.log" \
    | tee -a "$OUT/figures.jsonl"
  PYTHONPATH=/tmp/brax:$PYTHONPATH run playground_cartpole 60 --env playground/CartpoleBalance \
    --num_envs_per_worker 4096 --rollout 16 --batch_size 16384  # one slot of 16 steps x 4,096 envs a batch
}

offpolicy_updates() {  # SAC's and TD3's learner alone at batch 256 on HalfCheetah-v5's shapes: updates/s on the GPU
  # against the CPU (4 threads, a learner's share of these cores beside its samplers), eager and --compile (MuJoCo
  # from .gpu_brax)
  brax_site || return 1
  for algo in sac td3; do
    PYTHONPATH=/tmp/brax:$PYTHONPATH timeout -k 20 200 $PY perf/sac_updates.py --algo "$algo" --device cpu "$DEVICE" \
      --compile both --threads 4 --updates 500 --no_baseline 2>> "$OUT/runs.log" | tee -a "$OUT/figures.jsonl"
  done
}

ranks() {  # two learner ranks sharing the one GPU over gloo (--learner_devices cuda:0,cuda:0): CartPole PPO in sync
  # mode, two seeds of one learner then two ranks, their weights compared every round; then the one-GPU costs that
  # the scaling model (docs/performance.md, "Learner ranks on GPUs, on paper") takes: the learner step at CartPole's
  # GPU sizes with one rank and with two on the GPU (their gradients through the host), and CartPole's envs alone
  # on every core
  timeout -k 20 240 $PY perf/learner_ranks.py --seeds 2 --env_steps 1000000 --shared_device "${DEVICE/#cuda/cuda:0}" \
    -- --device "$DEVICE" 2>> "$OUT/runs.log" | tee -a "$OUT/figures.jsonl"
  timeout -k 20 200 $PY perf/allreduce_cost.py --steps 20 -- --device "$DEVICE" --num_workers 14 \
    --num_envs_per_worker 1024 --batch_size 65536 --num_batches_per_epoch 1 2>> "$OUT/runs.log" \
    | tee -a "$OUT/figures.jsonl"
  timeout -k 20 90 $PY perf/ceiling.py --env CartPole-v1 --env_only --num_envs 1024 --processes "$(nproc)" \
    --seconds 10 | tee -a "$OUT/figures.jsonl"
}

# each section's longest expected seconds, so that a call given BUDGET_SEC skips (and names) what no longer fits
declare -A NEEDS=([machine]=10 [build]=0 [tests]=180 [tests_beside]=0 [smoke]=240 [cartpole]=$((4 * RUN_SEC + 160))
  [pong_ceiling]=40 [pong]=120 [bf16]=$((2 * RUN_SEC + 160)) [compile_pong]=$((RUN_SEC + 80)) [breakout]=130
  [learner]=150 [advice]=$((4 * RUN_SEC + 120)) [doom]=$((RUN_SEC + 150)) [device_envs]=$((4 * RUN_SEC + 120))
  [device_pendulum]=$((4 * PENDULUM_SEC + 80)) [offpolicy_updates]=400 [ranks]=360
  [brax]=$((2 * BRAX_SEC + 240)))
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(machine build tests smoke device_envs)
for section in "${sections[@]}"; do
  if [ -n "${BUDGET_SEC:-}" ] && [ $((BUDGET_SEC - SECONDS)) -lt "${NEEDS[$section]:-0}" ]; then
    echo "{\"run\": \"$section\", \"skipped\": \"$((BUDGET_SEC - SECONDS)) s left of BUDGET_SEC\"}" \
      | tee -a "$OUT/figures.jsonl"
    continue
  fi
  echo "== $section ($(date +%T), ${SECONDS} s)"
  "$section"
done
[ -z "${BUILD:-}" ] || wait "$BUILD"
[ -z "${TESTS:-}" ] || wait "$TESTS"
tail -2 "$OUT/machine.txt" 2> /dev/null
rm -rf "$TD"
ls -la "$OUT"
