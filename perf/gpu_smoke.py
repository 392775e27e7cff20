"""GPU check of every CUDA path, end to end. Skips, printing why, without CUDA.

  python perf/gpu_smoke.py
Runs, each with --device cuda: CartPole with --compile and an evaluator (the policy worker and the learner on
the GPU, the weights shared through CUDA IPC, CUDA graphs; no rollout worker with a CUDA context, as
nvidia-smi lists the processes holding one), CartPole with a GRU core (its torch path), CartPole --algo dqn
(the replay's minibatches to the GPU), then enjoy.py --device cuda on the first run. Prints one JSON line:
each check and `ok`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = {  # name -> flags; each run 15 s
    "cartpole_compile": ["--compile", "true", "--eval_every_sec", "5"],
    "cartpole_gru": ["--rnn", "gru", "--rnn_size", "64"],
    "cartpole_dqn": ["--algo", "dqn"],
}


def _cuda_pids() -> set:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout
    return {int(pid) for pid in out.split()}


def _train(train_dir: str, name: str, flags: list) -> dict:
    """One 15-s run: its exit code, each role's device from the log, the roles that held a CUDA context."""
    cmd = [sys.executable, os.path.join(REPO, "train.py"), "--device", "cuda", "--train_dir", train_dir]
    proc = subprocess.Popen(
        cmd + ["--experiment", name, "--train_for_seconds", "15"] + flags,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    exp = os.path.join(train_dir, name)
    time.sleep(10)  # running by now: which processes hold a CUDA context
    holders = _cuda_pids()
    try:
        with open(os.path.join(exp, "processes.json")) as f:
            roles = {row["pid"]: row["role"] for row in json.load(f)["processes"]}
    except OSError:
        roles = {}
    out, _ = proc.communicate(timeout=300)
    with open(os.path.join(exp, "train.log")) as f:
        log = f.read()
    with open(os.path.join(exp, "summary.json")) as f:
        summary = json.load(f)
    policy = re.search(r"policy_worker\[0\] INFO ready: .*built on (\S+)", log)
    shared = re.search(r"learner\[0\] INFO ready: .* weights shared on (\S+)", log)
    on_cuda = sorted({role for pid, role in roles.items() if pid in holders})
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
        and str(result["policy_worker_device"]).startswith("cuda")
        and str(result["shared_weights_device"]).startswith("cuda")
        and summary["learner_version"] > 0
        and "learner" in on_cuda  # the listing sees this run's processes: the check below means something
        and not any(role.startswith("rollout_worker") for role in on_cuda)
    )
    if not result["ok"]:
        result["tail"] = out[-1500:]
    return result


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"bench": "gpu_smoke", "skipped": True, "reason": "no CUDA device"}))
        return 0
    result: dict = {"bench": "gpu_smoke", "skipped": False}
    with tempfile.TemporaryDirectory(prefix="sf_engine_gpu_") as train_dir:
        for name, flags in RUNS.items():
            try:
                result[name] = _train(train_dir, name, flags)
            except (OSError, KeyError, ValueError, subprocess.TimeoutExpired) as exc:  # still one JSON line
                result[name] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
        enjoy = subprocess.run(
            [
                sys.executable,
                os.path.join(REPO, "enjoy.py"),
                "--train_dir",
                train_dir,
                "--experiment",
                "cartpole_compile",
                "--device",
                "cuda",
                "--num_episodes",
                "3",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        result["enjoy"] = {"exit_code": enjoy.returncode, "out": enjoy.stdout.strip().splitlines()[-2:]}
    result["ok"] = all(result[name]["ok"] for name in RUNS) and enjoy.returncode == 0
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
