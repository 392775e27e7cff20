"""GPU smoke check: a short CartPole run with --device cuda must put the policy worker and the learner
on the GPU and share the weights through GPU memory (CUDA IPC). Skips, printing why, without CUDA.

  python perf/gpu_smoke.py
Prints one JSON line: skipped, or what the run's log says of each role's device, and its throughput.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"bench": "gpu_smoke", "skipped": True, "reason": "no CUDA device"}))
        return 0
    with tempfile.TemporaryDirectory(prefix="sf_engine_gpu_") as train_dir:
        proc = subprocess.run(
            [
                sys.executable,
                os.path.join(REPO, "train.py"),
                "--device",
                "cuda",
                "--train_dir",
                train_dir,
                "--experiment",
                "gpu",
                "--train_for_seconds",
                "20",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        with open(os.path.join(train_dir, "gpu", "train.log")) as f:
            log = f.read()
        with open(os.path.join(train_dir, "gpu", "summary.json")) as f:
            summary = json.load(f)
    policy_device = re.search(r"policy_worker\[0\] INFO ready: .*built on (\S+)", log)
    shared_device = re.search(r"learner\[0\] INFO ready: .* weights shared on (\S+)", log)
    result = {
        "bench": "gpu_smoke",
        "skipped": False,
        "exit_code": proc.returncode,
        "policy_worker_device": policy_device and policy_device.group(1),
        "shared_weights_device": shared_device and shared_device.group(1),
        "env_steps_per_sec": summary["env_steps_per_sec"],
        "learner_version": summary["learner_version"],
    }
    result["ok"] = (
        proc.returncode == 0
        and str(result["policy_worker_device"]).startswith("cuda")
        and str(result["shared_weights_device"]).startswith("cuda")
        and summary["learner_version"] > 0
    )
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
