"""Learners on several machines, shown on one over the loopback: two node groups (train.py --dist_init
tcp://127.0.0.1:PORT --dist_rank g --dist_world 2, each with its own rollout workers, policy worker, learner ranks and
experiment directory) train one policy to an env-step budget of both together; then, unless --no_baseline, one
machine's run of the same budget and flags. One JSON line: per node group its env steps, env steps/s, mean return of
the last 100 episodes, learner restarts, the env steps its Ray sampler actors placed and why it stopped; the two node
groups' last checkpoints (their version, whether their weights are the same bit for bit); the one-machine run's env
steps/s and return.

  python perf/node_groups.py                              # PPO on CartPole-v1, 1 learner each, 600,000 env steps
  python perf/node_groups.py --learners 2 -- --mode sync  # flags after -- go to every run
  python perf/node_groups.py --ray_samplers 2             # node group 0 with two Ray sampler actors ([ray] extra)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, run_train  # noqa: E402

STOPPED = "stopped: "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_checkpoint(exp_dir: str):
    """(version, flat weights) of a node group's last checkpoint."""
    import torch

    from sf_engine.runtime.checkpoint import latest_checkpoint, load_checkpoint

    state = load_checkpoint(latest_checkpoint(os.path.join(exp_dir, "checkpoints")))
    return int(state["version"]), torch.cat([t.flatten().float() for t in state["model"].values()])


def node_groups(flags: list, env_steps: int, learners: int, ray_samplers: int, timeout_sec: float) -> dict:
    port, out = free_port(), {}
    with tempfile.TemporaryDirectory(prefix="sf_engine_perf_") as train_dir:
        procs = []
        for node in range(2):
            own = (
                ["--ray_address", "local", "--num_remote_samplers", str(ray_samplers)]
                if node == 0 and ray_samplers
                else []
            )
            cmd = [sys.executable, os.path.join(REPO, "train.py"), "--train_dir", train_dir, "--experiment", f"n{node}"]
            cmd += ["--dist_init", f"tcp://127.0.0.1:{port}", "--dist_rank", str(node), "--dist_world", "2"]
            cmd += ["--num_learners", str(learners), "--train_for_env_steps", str(env_steps), "--status_every_sec", "5"]
            procs.append(
                subprocess.Popen(
                    cmd + own + flags, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
            )
        started = time.monotonic()
        logs = [proc.communicate(timeout=timeout_sec)[0] for proc in procs]
        out["wall_sec"] = round(time.monotonic() - started, 1)
        for node, (proc, log) in enumerate(zip(procs, logs)):
            if proc.returncode != 0:
                sys.stderr.write(log[-4000:])
                raise SystemExit(f"node group {node} exited with {proc.returncode}")
            with open(os.path.join(train_dir, f"n{node}", "summary.json")) as f:
                summary = json.load(f)
            stop = [line.split(STOPPED, 1)[1] for line in log.splitlines() if STOPPED in line]
            out[f"node{node}"] = {
                "env_steps": summary["env_steps"],
                "env_steps_per_sec": summary["env_steps_per_sec"],
                "episode_return_mean": summary["episode_return_mean"],
                "learner_version": summary["learner_version"],
                "learner_restarts": summary["learner_restarts"],
                "ray_samplers_placed": sum(r["placed"] for r in summary.get("remote_samplers") or []),
                "stopped": stop[-1] if stop else None,
            }
        (version, weights), (other_version, other_weights) = (
            last_checkpoint(os.path.join(train_dir, f"n{node}")) for node in range(2)
        )
    out["env_steps"] = out["node0"]["env_steps"] + out["node1"]["env_steps"]
    out["checkpoint_versions"] = [version, other_version]
    out["same_weights"] = bool(version == other_version and (weights == other_weights).all())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env_steps", type=int, default=600_000, help="the budget of both node groups together")
    parser.add_argument("--learners", type=int, default=1, help="--num_learners of each node group")
    parser.add_argument("--ray_samplers", type=int, default=0, help="Ray sampler actors of node group 0 (0: none)")
    parser.add_argument("--no_baseline", action="store_true", help="no one-machine run after the node groups")
    parser.add_argument("--timeout_sec", type=float, default=1800)
    parser.add_argument("flags", nargs="*", help="train.py flags of every run (after --)")
    args = parser.parse_args()
    flags = ["--env", "CartPole-v1", "--seed", "1", "--num_workers", "1"] + args.flags
    out = {
        "bench": "node_groups",
        "flags": " ".join(flags),
        "learners": args.learners,
        "ray_samplers": args.ray_samplers,
    }
    out |= node_groups(flags, args.env_steps, args.learners, args.ray_samplers, args.timeout_sec)
    if not args.no_baseline:
        one = run_train(
            flags + ["--num_learners", str(args.learners), "--train_for_env_steps", str(args.env_steps)],
            args.timeout_sec,
        )
        out["one_machine"] = {
            key: one[key] for key in ("env_steps", "env_steps_per_sec", "episode_return_mean", "learner_version")
        }
        out["one_machine"]["wall_sec"] = one["launch_to_exit_sec"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
