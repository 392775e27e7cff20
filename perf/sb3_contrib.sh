#!/usr/bin/env bash
# Measures Stable-Baselines3-contrib 2.9.2 (QR-DQN, CrossQ) on top of Stable-Baselines3 2.9.2 on this machine with
# RL Baselines3 Zoo's tuned hyperparameters, so that our --algo qrdqn and --algo crossq can be compared with it side
# by side in one run. Makes its own venv once, outside the repo ($SB3_CONTRIB_BASELINE_VENV, default
# $HOME/.cache/sb3-contrib-baseline-venv), then runs perf/sb3_contrib_run.py in it. Examples:
#   perf/sb3_contrib.sh --algo qrdqn --env CartPole-v1 --seconds 300 --eval_every_sec 30
#   perf/sb3_contrib.sh --algo qrdqn --env BreakoutNoFrameskip-v4 --seconds 1800 --buffer_size 100000
#   perf/sb3_contrib.sh --algo crossq --env HalfCheetah-v5 --seconds 900 --eval_every_sec 60
# Prints one JSON line last (see sb3_contrib_run.py): env_steps, wall_sec, env_steps_per_sec,
# episode_return_mean, evals, gradient_steps, replay_ratio, settings, a coarse curve.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${SB3_CONTRIB_BASELINE_VENV:-$HOME/.cache/sb3-contrib-baseline-venv}

# need WHAT PIP-ARGS...: install, or one line saying what could not be had and a non-zero exit
need() {
  local what=$1
  shift
  if ! "$venv/bin/pip" install -q "$@" >&2; then
    echo "sb3_contrib.sh: could not install $what ($*); no baseline" >&2
    exit 1
  fi
}

# what the venv holds, written to its .ready once installed: a venv made for another list is made anew
wants="torch 2.13.0, stable-baselines3 2.9.2, sb3-contrib 2.9.2, gymnasium[classic-control,mujoco], ale-py, opencv"
if [[ ! -x $venv/bin/python || "$(cat "$venv/.ready" 2>/dev/null)" != "$wants" ]]; then
  rm -rf "$venv"
  echo "setting up Stable-Baselines3 2.9.2 and sb3-contrib 2.9.2 in $venv (once)..." >&2
  python3 -m venv "$venv"
  need pip --upgrade pip
  need "PyTorch 2.13.0" "torch==2.13.0"
  need Stable-Baselines3 "stable-baselines3==2.9.2" "sb3-contrib==2.9.2"
  need Gymnasium "gymnasium[classic-control,mujoco]>=1.1"
  need "the Arcade Learning Environment and OpenCV (Atari)" "ale-py>=0.10" opencv-python-headless
  echo "$wants" >"$venv/.ready"
fi
exec "$venv/bin/python" "$here/sb3_contrib_run.py" "$@"
