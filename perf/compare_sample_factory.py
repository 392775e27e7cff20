"""Side by side on this machine, in one run: sf_engine vs Sample Factory 2.1.1 vs a one-file PPO.

  python perf/compare_sample_factory.py                 # CartPole: sampling and training
  python perf/compare_sample_factory.py --skip_single_process

Runs, back to back: our sampler (perf/bench_sampling.py) and Sample Factory's
(../shared/baselines/sample_factory.sh sampling cartpole); our training until solved and for a fixed
time, Sample Factory's training for the same time (its 60-s frames/s), and the single-process PPO
baseline (../shared/baselines/single_process_ppo.py). Prints each result as it comes (stderr) and one
JSON line of ratios last. The baselines directory can be moved with --baselines_dir.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, median_windows, run_baseline, run_train  # noqa: E402


def log(name: str, result: dict) -> None:
    print(f"{name}: {json.dumps(result)}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baselines_dir", default=os.path.join(os.path.dirname(REPO), "shared", "baselines"))
    parser.add_argument("--sampling_seconds", type=float, default=20.0)
    parser.add_argument("--training_seconds", type=float, default=90.0)
    parser.add_argument("--skip_single_process", action="store_true")
    args = parser.parse_args()
    sf = os.path.join(args.baselines_dir, "sample_factory.sh")
    out = {"bench": "compare_sample_factory", "env": "CartPole-v1", "machine_cpus": os.cpu_count()}

    ours_sampling = [run_train(["--sampling_only", "true", "--restart", "true",
                                "--train_for_seconds", str(args.sampling_seconds + 5)], args.sampling_seconds + 120)]
    out["ours_sampling_env_steps_per_sec"] = round(median_windows(ours_sampling))
    log("ours sampling", {"env_steps_per_sec": out["ours_sampling_env_steps_per_sec"]})
    sf_sampling = run_baseline(["bash", sf, "sampling", "cartpole", "--seconds", str(args.sampling_seconds)], 900)
    log("sample factory sampling", sf_sampling)
    out["sf_sampling_env_steps_per_sec"] = round(sf_sampling["env_steps_per_sec"])

    solve = run_train(["--stop_at_return", "475", "--restart", "true", "--train_for_seconds", "60"], 180)
    log("ours training to 475", solve)
    out["ours_solve_sec_from_launch"] = solve["launch_to_exit_sec"]
    out["ours_solve_return"] = solve["episode_return_mean"]
    out["ours_solve_env_steps_per_sec"] = round(solve["env_steps_per_sec"])
    fixed = run_train(["--restart", "true", "--train_for_seconds", str(args.training_seconds),
                       "--train_for_env_steps", str(10**10)], args.training_seconds + 120)
    log("ours training fixed time", fixed)
    out["ours_training_env_steps_per_sec"] = round(fixed["env_steps_per_sec"])
    out["ours_training_return"] = fixed["episode_return_mean"]
    sf_training = run_baseline(["bash", sf, "training", "cartpole", "--seconds", str(args.training_seconds)],
                               args.training_seconds + 900)
    log("sample factory training", sf_training)
    out["sf_training_frames_per_sec_60s"] = sf_training["frames_per_sec_60s"]
    out["sf_training_return"] = sf_training["episode_return_mean"]

    out["ratio_sampling_vs_sf"] = round(out["ours_sampling_env_steps_per_sec"] / out["sf_sampling_env_steps_per_sec"], 1)
    if sf_training["frames_per_sec_60s"]:
        out["ratio_training_vs_sf"] = round(out["ours_training_env_steps_per_sec"] / sf_training["frames_per_sec_60s"], 1)
    if not args.skip_single_process:
        single = run_baseline([sys.executable, os.path.join(args.baselines_dir, "single_process_ppo.py"),
                               "--seconds", "60"], 300)
        log("single-process PPO", single)
        out["single_process_env_steps_per_sec"] = single["env_steps_per_sec"]
        out["single_process_solved_at_sec"] = single["solved_at_sec"]  # counted from after its set-up
        out["single_process_launch_to_exit_sec"] = single["launch_to_exit_sec"]
        out["ratio_training_vs_single_process"] = round(
            out["ours_training_env_steps_per_sec"] / single["env_steps_per_sec"], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
