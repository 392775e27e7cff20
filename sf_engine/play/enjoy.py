"""Replay a trained agent (enjoy.py, or the sf-enjoy command): loads <train_dir>/<experiment>/config.json
and a checkpoint (the newest by default), plays --num_episodes episodes and prints each episode's return
and length, then a summary line; --video records them (rgb frames from the env's renderer; the
full-colour screen on Atari), --render shows them on screen."""

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

from sf_engine.config.cli import FlagParser
from sf_engine.config.groups import ConfigError
from sf_engine.play.loading import LoadError, first_line, load_experiment, load_policy, resolve_checkpoint
from sf_engine.play.video import VideoEnv, VideoWriter


def experiment_parser(description: str) -> argparse.ArgumentParser:
    """The flags that pick a trained experiment and its checkpoint (enjoy.py, export); matched exactly, a
    bad one is a ConfigError of one line (FlagParser)."""
    parser = FlagParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--experiment", default="default", help="Experiment name (as given to train.py).")
    parser.add_argument("--train_dir", default="train_dir", help="Root directory of all experiments.")
    parser.add_argument(
        "--policy", type=int, default=0, help="Which policy of a run of several (train.py --num_policies) to load."
    )
    parser.add_argument(
        "--checkpoint",
        default="latest",
        help="'latest' (newest periodic checkpoint), 'best' (best evaluation return, written "
        "with train.py --eval_every_sec), or a path to a checkpoint file.",
    )
    return parser


def parse_args(argv=None):
    parser = experiment_parser(__doc__)
    parser.add_argument("--num_episodes", type=int, default=10, help="Episodes to play.")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="Take the most likely action (mode, or Gaussian mean) instead of sampling.",
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"), help="Device of the policy.")
    parser.add_argument("--video", default=None, help="Record the episodes to this .mp4 or .gif file.")
    parser.add_argument(
        "--video_fps",
        type=int,
        default=None,
        help="Frames per second of the video (default: the env's own rate: 15 on Atari, the env's render_fps, or 30).",
    )
    parser.add_argument(
        "--max_frames",
        type=int,
        default=10_000,
        help="At most this many frames in the video "
        "(frames are written as they are played: memory does not grow with the video).",
    )
    parser.add_argument(
        "--max_episode_steps",
        type=int,
        default=27_000,
        help="Cut an episode after this many steps (an agent that never ends one).",
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="Show the agent on screen while it plays (needs a display; Gymnasium's renderer).",
    )
    parser.add_argument("--seed", type=int, default=12345, help="Seed of the evaluation env (any integer).")
    parser.add_argument(
        "--opponent",
        default=None,
        help="Two-player games (PettingZoo envs): play --num_episodes games against this opponent, "
        "the seats swapping game by game, and report win, draw and loss rates. 'random' (a "
        "random legal action), MODULE:FUNCTION (FUNCTION(observation) -> action, given the "
        "env's own observation of its seat, e.g. sf_engine.envs.opponents:connect_four_heuristic), or "
        "a checkpoint file of a policy trained on the same env (greedy with --deterministic, sampling otherwise, "
        "as the policy plays). Prints the match's ratings too (openskill, both players from new).",
    )
    return parser.parse_args(argv)


def check_args(args) -> None:
    """Bad values: one line naming the flag, before anything is loaded or written."""
    if args.video and not args.video.lower().endswith((".mp4", ".gif")):
        raise LoadError(f"--video {args.video}: the file name must end in .mp4 or .gif")
    if args.video and not os.access(os.path.dirname(os.path.abspath(args.video)), os.W_OK):
        raise LoadError(f"--video {args.video}: its directory does not exist or is not writable")
    for flag, value in (
        ("--num_episodes", args.num_episodes),
        ("--max_frames", args.max_frames),
        ("--max_episode_steps", args.max_episode_steps),
    ):
        if value < 1:
            raise LoadError(f"{flag} must be at least 1 (got {value})")
    if args.video_fps is not None and not 1 <= args.video_fps <= 1000:
        raise LoadError(f"--video_fps must be within 1..1000 (got {args.video_fps})")
    if args.render and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise LoadError("--render: no display here (DISPLAY is not set); record a video with --video instead")


def run(args) -> int:
    """Replay the experiment's policy: episodes (printed one per line), a summary line, the JSON line."""
    from sf_engine.runtime.device import resolve_device

    cfg, spec, exp_dir = load_experiment(args.train_dir, args.experiment)
    path = resolve_checkpoint(exp_dir, args.experiment, args.checkpoint)
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        raise LoadError(str(exc)) from None
    policy = load_policy(cfg, spec, path, device, args.policy)
    if args.opponent:
        return _run_matches(args, cfg, spec, path, policy, device)
    env = VideoEnv(cfg, spec, args.seed, "video" if args.video else ("human" if args.render else None), args.max_frames)
    if args.video:
        _start_video(args, env)
    try:
        results = _play_episodes(args, env, policy, spec, device)
    finally:
        env.close()  # the video too: a replay stopped early still leaves a playable one
    _report(args, cfg, path, results, env.writer)
    return 0


def _start_video(args, env) -> None:
    fps = args.video_fps or env.fps or int(env.env.render_fps or 30)
    try:
        env.writer = VideoWriter(args.video, fps)
    except Exception as exc:  # imageio/ffmpeg raise their own types: one line, not a traceback
        env.close()
        raise LoadError(
            f"--video {args.video}: cannot write it ({exc.__class__.__name__}: {first_line(exc)})"
        ) from None


def _play_episodes(args, env, policy, spec, device) -> list:
    """[(return, length)] of --num_episodes episodes, each printed as it ends."""
    from sf_engine.play.episodes import play

    results = []
    per_row = -(-args.num_episodes // spec.num_agents)  # a multi-agent env: each agent's episodes count
    episodes = play(policy, env, per_row, args.deterministic, device=device, max_episode_steps=args.max_episode_steps)
    for episode, (_, episode_return, length) in enumerate(episodes):
        if episode >= args.num_episodes:
            break
        cut = " (cut at --max_episode_steps)" if length >= args.max_episode_steps else ""
        print(f"episode {episode}: return {episode_return:.1f}, length {length}{cut}", flush=True)
        results.append((episode_return, length))
    return results


def _report(args, cfg, path: str, results: list, writer) -> None:
    """The summary line, the video's line, and the JSON line last (for scripts)."""
    returns, lengths = np.array([r for r, _ in results]), np.array([n for _, n in results])
    print(
        f"{len(results)} episodes of {cfg.env.env} from {os.path.basename(path)}: return "
        f"{returns.mean():.1f} +- {returns.std():.1f}, length {lengths.mean():.1f}"
    )
    figures = {
        "enjoy": cfg.env.env,
        "checkpoint": os.path.basename(path),
        "episodes": len(results),
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "length_mean": float(lengths.mean()),
        "deterministic": bool(args.deterministic),
    }
    if writer is not None:
        (width, height), frames = writer.size or (0, 0), writer.frames
        print(f"video: {args.video} ({frames} frames of {width}x{height} at {writer.fps} fps)")
        figures["video"] = {"path": args.video, "frames": frames, "width": width, "height": height, "fps": writer.fps}
    print(json.dumps(figures), flush=True)


def _run_matches(args, cfg, spec, path: str, policy, device) -> int:
    """enjoy.py --opponent: games against the opponent; one line per game, a summary, the JSON line."""
    from sf_engine.envs import make_batch_env
    from sf_engine.play.matches import OpponentError, make_opponent, play_matches

    if len(spec.agents) != 2 or args.video or args.render:
        why = (
            "--video and --render show single games: drop them"
            if spec.agents and len(spec.agents) == 2
            else f"{cfg.env.env} is not a two-player PettingZoo env ({len(spec.agents) or 1} agent(s))"
        )
        raise LoadError(f"--opponent: {why}")
    try:
        opponent = make_opponent(
            args.opponent,
            spec,
            lambda path: load_policy(cfg, spec, path, device),
            device,
            seed=args.seed,
            deterministic=args.deterministic,
        )
    except OpponentError as exc:
        raise LoadError(str(exc)) from None
    env = make_batch_env(
        cfg.env.env, cfg.env.env_backend, 2 * min(args.num_episodes, 32), seed=args.seed, spec=spec, training=False
    )
    try:
        figures = play_matches(policy, env, opponent, args.num_episodes, args.deterministic, device=device)
    finally:
        env.close()
    print(
        f"{figures.games} games of {cfg.env.env} from {os.path.basename(path)} against {opponent.name}: "
        f"won {figures.win_rate:.1%}, drew {figures.draw_rate:.1%}, lost {figures.loss_rate:.1%} "
        f"(games per seat {figures.games_per_seat}, mean length {figures.length_mean:.1f})"
    )
    if figures.rating_mu is not None:
        print(
            f"ratings over these games (openskill, both from new): {figures.rating_mu:.1f}±{figures.rating_sigma:.1f}"
            f" against {figures.opponent_rating_mu:.1f}±{figures.opponent_rating_sigma:.1f}"
        )
    print(
        json.dumps(
            {
                "enjoy": cfg.env.env,
                "checkpoint": os.path.basename(path),
                "opponent": opponent.name,
                "episodes": figures.games,
                "deterministic": bool(args.deterministic),
                **dataclasses.asdict(figures),
            }
        ),
        flush=True,
    )
    return 0


def main(argv=None) -> int:
    from sf_engine.envs import EnvError

    try:
        args = parse_args(argv)
        if not args.render:
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # Gymnasium's renderers draw off screen
            os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        check_args(args)
        return run(args)
    except KeyboardInterrupt:  # Ctrl-C: the video so far is closed and playable
        print("interrupted", file=sys.stderr)
        return 130
    except (ConfigError, LoadError, EnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
