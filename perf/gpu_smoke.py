"""GPU check of every CUDA path, end to end. Skips, printing why, without CUDA (`--device cpu` tries it here).

  python perf/gpu_smoke.py [--device cuda] [--parallel 4]
Runs, each with --device cuda for 15 s (30 s with --compile), `--parallel` at a time: every built-in algorithm
(PPO with --compile and an evaluator, with a GRU core, with a user's encoder from a file of the user's directory;
DQN, QR-DQN, PQN and R2D2 on CartPole-v1; SAC, TD3 and CrossQ (compiled, its default) on Pendulum-v1, SAC also
with --compile). Checks that the policy worker acted on the GPU, the learner shared its weights there (CUDA IPC), a
version was published, and no rollout worker held a CUDA context (nvidia-smi lists the processes holding one).
Then enjoy.py --device cuda on the first run, and sf_engine.load_policy(..., device="cuda") on every run's
checkpoint, acting on a batch of the env's observations. Prints one JSON line: each check and `ok` (and each run's
result to stderr as it ends).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # load_policy's sf_engine: this checkout's
RUNS = {  # name -> (env, flags); each run 15 s, the compiling ones 30 s (they compile for the first 10-15 s)
    "cartpole_compile": ("CartPole-v1", ["--compile", "true", "--eval_every_sec", "5", "--train_for_seconds", "30"]),
    "cartpole_gru": ("CartPole-v1", ["--rnn", "gru", "--rnn_size", "64"]),
    "cartpole_user_encoder": ("CartPole-v1", ["--encoder", "my_encoder:make"]),
    "cartpole_dqn": ("CartPole-v1", ["--algo", "dqn"]),
    "cartpole_qrdqn": ("CartPole-v1", ["--algo", "qrdqn"]),
    "cartpole_pqn": ("CartPole-v1", ["--algo", "pqn"]),
    "cartpole_r2d2": ("CartPole-v1", ["--algo", "r2d2"]),
    "pendulum_sac": ("Pendulum-v1", ["--algo", "sac"]),
    "pendulum_td3": ("Pendulum-v1", ["--algo", "td3"]),
    "pendulum_sac_compile": ("Pendulum-v1", ["--algo", "sac", "--compile", "true", "--train_for_seconds", "30"]),
    "pendulum_crossq": ("Pendulum-v1", ["--algo", "crossq", "--train_for_seconds", "30"]),
}
RUN_LIMIT_SEC = 90  # a run (15 or 30 s, start-up and compiling included) still going then is killed and fails
ENCODER = """import torch


def make(observation_space):
    size = int(observation_space.shape[0])
    return torch.nn.Sequential(torch.nn.Linear(size, 64), torch.nn.ELU(), torch.nn.Linear(64, 64), torch.nn.ELU())
"""


def _cuda_pids() -> set:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout
    return {int(pid) for pid in out.split()}


def _started(exp: str, proc, deadline: float) -> dict:
    """pid -> role of a run once its learner and policy worker are ready (or at the deadline, or its end)."""
    while True:
        try:
            with open(os.path.join(exp, "train.log")) as f:
                log = f.read()
            with open(os.path.join(exp, "processes.json")) as f:
                roles = {row["pid"]: row["role"] for row in json.load(f)["processes"]}
            if "learner[0] INFO ready" in log and "policy_worker[0] INFO ready" in log:
                return roles
        except (OSError, ValueError, KeyError):
            roles = {}
        if time.time() > deadline or proc.poll() is not None:
            return roles
        time.sleep(0.5)


def _train(device: str, user_dir: str, train_dir: str, name: str) -> dict:
    """One run: its exit code, each role's device from the log, the roles that held a CUDA context (nvidia-smi
    read every 2 s from the moment it is ready to its end)."""
    env, flags = RUNS[name]
    cmd = [sys.executable, os.path.join(REPO, "train.py"), "--device", device, "--train_dir", train_dir]
    exp, start = os.path.join(train_dir, name), time.time()
    with open(os.path.join(train_dir, f"{name}.out"), "w+") as out:
        proc = subprocess.Popen(
            cmd + ["--experiment", name, "--env", env, "--train_for_seconds", "15"] + flags,
            cwd=user_dir,
            text=True,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its processes, killed together where it overruns
        )
        try:
            roles = _started(exp, proc, time.time() + 60)
            holders: set | None = None if device == "cpu" else set()
            while proc.poll() is None and time.time() < start + RUN_LIMIT_SEC:
                if holders is not None:
                    holders |= _cuda_pids()
                time.sleep(2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        output = out.read()
    with open(os.path.join(exp, "train.log")) as f:
        log = f.read()
    with open(os.path.join(exp, "summary.json")) as f:
        summary = json.load(f)
    policy = re.search(r"policy_worker\[0\] INFO ready: .*built on (\S+)", log)
    shared = re.search(r"learner\[0\] INFO ready: .* weights shared on (\S+)", log)
    on_cuda = None if holders is None else sorted({role for pid, role in roles.items() if pid in holders})
    result = {
        "exit_code": proc.returncode,
        "policy_worker_device": policy and policy.group(1),
        "shared_weights_device": shared and shared.group(1),
        "roles_on_cuda": on_cuda,
        "env_steps_per_sec": summary["env_steps_per_sec"],
        "learner_version": summary["learner_version"],
        "eval_return_mean": summary.get("eval_return_mean"),
    }
    result["ok"] = bool(
        proc.returncode == 0
        and str(result["policy_worker_device"]).startswith(device)
        and str(result["shared_weights_device"]).startswith(device)
        and (summary["learner_version"] or 0) > 0
        # the listing sees this run's processes (the learner's), so that it means something that no worker is there
        and (on_cuda is None or ("learner" in on_cuda and not any(r.startswith("rollout_worker") for r in on_cuda)))
    )
    if not result["ok"]:
        result["tail"] = output[-1500:]
    return result


def _load_policy(device: str, train_dir: str, name: str) -> dict:
    """sf_engine.load_policy(..., device) on the run's checkpoint: where its weights are, and its actions for a
    batch of 8 of the env's observations."""
    import gymnasium as gym
    import numpy as np

    import sf_engine

    try:
        policy = sf_engine.load_policy(os.path.join(train_dir, name), device=device)
        env = gym.make_vec(RUNS[name][0], num_envs=8)
        obs, _ = env.reset(seed=0)
        actions = np.asarray(policy.act(obs))
        _, rewards, _, _, _ = env.step(actions)
        env.close()
        weights = str(next(policy.model.parameters()).device)
        ok = weights.startswith(device) and len(actions) == 8 and len(rewards) == 8
        return {"ok": ok, "weights_on": weights, "actions": actions.tolist()}
    except Exception as exc:  # noqa: BLE001 - one JSON line whatever failed
        return {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}


def _enjoy(device: str, train_dir: str) -> dict:
    cmd = [sys.executable, os.path.join(REPO, "enjoy.py"), "--train_dir", train_dir, "--experiment"]
    enjoy = subprocess.run(
        cmd + ["cartpole_compile", "--device", device, "--num_episodes", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return {"ok": enjoy.returncode == 0, "exit_code": enjoy.returncode, "out": enjoy.stdout.strip().splitlines()[-2:]}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: try the script here")
    parser.add_argument("--parallel", type=int, default=4, help="runs at a time (the GPU machine has 16 cores)")
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"bench": "gpu_smoke", "skipped": True, "reason": "no CUDA device"}))
        return 0
    result: dict = {"bench": "gpu_smoke", "skipped": False, "device": args.device}
    with tempfile.TemporaryDirectory(prefix="sf_engine_gpu_") as train_dir:
        user_dir = os.path.join(train_dir, "user")
        os.makedirs(user_dir)
        with open(os.path.join(user_dir, "my_encoder.py"), "w") as f:
            f.write(ENCODER)
        sys.path.insert(0, user_dir)  # load_policy finds the user's encoder as the run did

        def one(name: str) -> dict:
            try:
                result = _train(args.device, user_dir, train_dir, name)
            except Exception as exc:  # noqa: BLE001 - still one JSON line
                result = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
            print(json.dumps({name: result}), file=sys.stderr, flush=True)  # as it ends: kept if the script is cut
            return result

        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            result.update(zip(RUNS, pool.map(one, RUNS)))
        try:
            result["enjoy"] = _enjoy(args.device, train_dir)
        except subprocess.TimeoutExpired:
            result["enjoy"] = {"ok": False, "error": "past 60 s"}
        result["load_policy"] = {name: _load_policy(args.device, train_dir, name) for name in RUNS}
    result["ok"] = (
        all(result[name]["ok"] for name in RUNS)
        and result["enjoy"]["ok"]
        and all(check["ok"] for check in result["load_policy"].values())
    )
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
