"""Side by side on this machine, in one run: sf_engine vs Sample Factory 2.1.1 (vs a one-file PPO).

  python perf/compare_sample_factory.py                 # CartPole: sampling and training
  python perf/compare_sample_factory.py --env pong      # Pong: sampling with the CNN, and training
  python perf/compare_sample_factory.py --env doom_basic --num_workers 2 --num_envs_per_worker 8
                                                        # Doom (the doom extra): the same counts for both

Runs back to back: our sampler (train.py --sampling_only, median of 2-s windows after warm-up) and
Sample Factory's (../shared/baselines/sample_factory.sh sampling ENV); for CartPole our training until
solved; our training for a fixed time and Sample Factory's for the same time (its 60-s frames/s); for
CartPole also the single-process PPO baseline (../shared/baselines/single_process_ppo.py). Prints each
result as it comes (stderr) and one JSON line of ratios last. Throughput ratios compare frames/s
(env steps x frameskip: 4 on Atari and Doom, 1 on CartPole). --num_workers / --num_envs_per_worker
go to both engines (unset: ours sizes itself, Sample Factory runs its script's 2 x 8).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, median_windows, run_baseline, run_train  # noqa: E402

ENVS = {
    "cartpole": ("CartPole-v1", 1),
    "pong": ("Pong-v5", 4),
    "doom_basic": ("doom_basic", 4),
    "doom_health_gathering_supreme": ("doom_health_gathering_supreme", 4),
}


def log(name: str, result: dict) -> None:
    print(f"{name}: {json.dumps(result)}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", choices=sorted(ENVS), default="cartpole")
    parser.add_argument("--baselines_dir", default=os.path.join(os.path.dirname(REPO), "shared", "baselines"))
    parser.add_argument("--sampling_seconds", type=float, default=30.0)
    parser.add_argument("--training_seconds", type=float, default=120.0)
    parser.add_argument("--skip_single_process", action="store_true")
    parser.add_argument("--num_workers", type=int, help="rollout workers of both engines")
    parser.add_argument("--num_envs_per_worker", type=int, help="envs per worker of both engines")
    parser.add_argument("--only", choices=("sampling", "training"), help="run only this half of the comparison")
    parser.add_argument("--ours_flags", default="", help="more train.py flags for our runs, e.g. '--bf16 true'")
    args = parser.parse_args()
    env_id, frameskip = ENVS[args.env]
    sf = os.path.join(args.baselines_dir, "sample_factory.sh")
    ours = ["--env", env_id, "--restart", "true"]
    counts = [
        f"--{name}={getattr(args, name)}"
        for name in ("num_workers", "num_envs_per_worker")
        if getattr(args, name) is not None
    ]
    ours += [x for flag in counts for x in flag.split("=")]
    ours += args.ours_flags.split()
    out = {"bench": "compare_sample_factory", "env": env_id, "machine_cpus": os.cpu_count()}

    if args.only != "training":
        sampling_half(args, ours, sf, counts, frameskip, out)
    if args.only != "sampling":
        training_half(args, ours, sf, counts, out)
    print(json.dumps(out))


def sampling_half(args, ours: list, sf: str, counts: list, frameskip: int, out: dict) -> None:
    sampling = run_train(
        ours + ["--sampling_only", "true", "--train_for_seconds", str(args.sampling_seconds + 10)],
        args.sampling_seconds + 180,
    )
    out["ours_sampling_frames_per_sec"] = round(median_windows([sampling]) * frameskip)
    log("ours sampling", {"frames_per_sec": out["ours_sampling_frames_per_sec"]})
    sf_sampling = run_baseline(
        ["bash", sf, "sampling", args.env, "--seconds", str(args.sampling_seconds)] + counts, 900
    )
    log("sample factory sampling", sf_sampling)
    out["sf_sampling_frames_per_sec"] = round(sf_sampling["frames_per_sec"])
    out["ratio_sampling_vs_sf"] = round(out["ours_sampling_frames_per_sec"] / out["sf_sampling_frames_per_sec"], 2)


def training_half(args, ours: list, sf: str, counts: list, out: dict) -> None:
    if args.env == "cartpole":
        solve = run_train(ours + ["--stop_at_return", "475", "--train_for_seconds", "60"], 180)
        log("ours training to 475", solve)
        out["ours_solve_sec_from_launch"] = solve["launch_to_exit_sec"]
        out["ours_solve_return"] = solve["episode_return_mean"]
        out["ours_solve_env_steps_per_sec"] = round(solve["env_steps_per_sec"])
    fixed = run_train(
        ours + ["--train_for_seconds", str(args.training_seconds), "--train_for_env_steps", str(10**10)],
        args.training_seconds + 180,
    )
    log("ours training fixed time", fixed)
    out["ours_training_frames_per_sec"] = round(fixed["frames_per_sec"])
    out["ours_training_return"] = fixed["episode_return_mean"]
    sf_training = run_baseline(
        ["bash", sf, "training", args.env, "--seconds", str(args.training_seconds)] + counts,
        args.training_seconds + 900,
    )
    log("sample factory training", sf_training)
    out["sf_training_frames_per_sec_60s"] = sf_training["frames_per_sec_60s"]
    out["sf_training_return"] = sf_training["episode_return_mean"]
    if sf_training["frames_per_sec_60s"]:
        out["ratio_training_vs_sf"] = round(out["ours_training_frames_per_sec"] / sf_training["frames_per_sec_60s"], 2)

    if args.env == "cartpole" and not args.skip_single_process:
        single = run_baseline(
            [sys.executable, os.path.join(args.baselines_dir, "single_process_ppo.py"), "--seconds", "60"], 300
        )
        log("single-process PPO", single)
        out["single_process_env_steps_per_sec"] = single["env_steps_per_sec"]
        out["single_process_solved_at_sec"] = single["solved_at_sec"]  # counted from after its set-up
        out["single_process_launch_to_exit_sec"] = single["launch_to_exit_sec"]
        out["ratio_training_vs_single_process"] = round(
            out["ours_training_frames_per_sec"] / single["env_steps_per_sec"], 2
        )


if __name__ == "__main__":
    main()
