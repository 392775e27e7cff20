#!/usr/bin/env python
"""Replay a trained agent: loads <train_dir>/<experiment>/config.json and a checkpoint (the newest by
default), plays --num_episodes episodes and prints each episode's return and length, then a summary
line; --video records them (rgb frames from the env's renderer; the full-colour screen on Atari)."""
import argparse
import json
import os
import sys
import warnings

import numpy as np


class EnjoyError(RuntimeError):
    """A problem the user can fix: one line, exit code 2."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--experiment", default="default", help="Experiment name (as given to train.py).")
    parser.add_argument("--train_dir", default="train_dir", help="Root directory of all experiments.")
    parser.add_argument("--checkpoint", default="latest",
                        help="'latest' (newest periodic checkpoint), 'best' (best evaluation return, written "
                             "with train.py --eval_every_sec), or a path to a checkpoint file.")
    parser.add_argument("--num_episodes", type=int, default=10, help="Episodes to play.")
    parser.add_argument("--deterministic", action="store_true",
                        help="Take the most likely action (mode, or Gaussian mean) instead of sampling.")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"), help="Device of the policy.")
    parser.add_argument("--video", default=None, help="Record the episodes to this .mp4 or .gif file.")
    parser.add_argument("--video_fps", type=int, default=None, help="Frames per second of the video "
                        "(default: the env's render_fps, or 30).")
    parser.add_argument("--max_frames", type=int, default=10_000, help="At most this many frames in the video.")
    parser.add_argument("--seed", type=int, default=12345, help="Seed of the evaluation env.")
    args = parser.parse_args(argv)
    if args.video and not args.video.lower().endswith((".mp4", ".gif")):
        parser.error(f"--video {args.video}: the file name must end in .mp4 or .gif")
    if args.num_episodes < 1:
        parser.error("--num_episodes must be at least 1")
    if args.max_frames < 1:
        parser.error("--max_frames must be at least 1")
    return args


def resolve_checkpoint(exp_dir: str, experiment: str, choice: str) -> str:
    from sf_engine.checkpoint import BEST_NAME, checkpoint_dir, latest_valid_checkpoint

    if choice == "latest":
        path, skipped = latest_valid_checkpoint(checkpoint_dir(exp_dir), load=True)
        if path is None and skipped:
            raise EnjoyError(f"experiment {experiment} has no usable checkpoint ({skipped[-1][1]})")
        if path is None:
            raise EnjoyError(f"experiment {experiment} has no checkpoint yet: train it first "
                             f"(python train.py --experiment {experiment})")
        for _, reason in skipped:
            print(f"skipping checkpoint: {reason}: using the one before it", flush=True)
        return path
    if choice == "best":
        path = os.path.join(checkpoint_dir(exp_dir), BEST_NAME)
        if not os.path.exists(path):
            raise EnjoyError(f"experiment {experiment} has no best checkpoint: train it with --eval_every_sec "
                             f"or use --checkpoint latest")
        return path
    if not os.path.isfile(choice):
        raise EnjoyError(f"--checkpoint {choice}: no such file")
    return choice


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [exc.__class__.__name__])[0]


def load_policy(cfg, spec, path: str, device):
    """The actor-critic of `cfg` with the weights of checkpoint `path`, or an EnjoyError saying why not."""
    from sf_engine.checkpoint import CheckpointError, load_checkpoint
    from sf_engine.model import ActorCritic
    from sf_engine.model_shape import changed_flags

    try:
        state = load_checkpoint(path, "cpu")
    except CheckpointError as exc:
        raise EnjoyError(f"checkpoint {exc}: pass an older one with --checkpoint PATH") from None
    if not isinstance(state, dict) or "model" not in state:
        raise EnjoyError(f"checkpoint {path} is not an sf_engine checkpoint: pick one from <experiment>/checkpoints")
    saved = state.get("config", {})
    try:
        changed = changed_flags({"env": {"env": cfg.env.env}} | saved, cfg, spec) if isinstance(saved, dict) else []
    except ValueError as exc:
        raise EnjoyError(f"checkpoint {path}: its configuration is {exc}: pick a checkpoint of this experiment") from None
    if changed:
        raise EnjoyError(f"checkpoint {path} was trained on {saved.get('env', {}).get('env')} with other model flags "
                         f"than experiment {cfg.run.experiment} ({cfg.env.env}): pick a checkpoint of this experiment")
    policy = ActorCritic(spec, cfg.model)
    try:
        policy.load_state_dict(state["model"])
    except (KeyError, RuntimeError) as exc:
        raise EnjoyError(f"checkpoint {path} does not fit the model of experiment {cfg.run.experiment}: "
                         f"{_first_line(exc)}") from None
    return policy.to(device).eval()


class VideoEnv:
    """The env the agent plays, plus the full-colour frames of what it plays for the video.
    Atari: a twin EnvPool env at 210x160 RGB, same seed and actions (ALE is deterministic), so the
    video shows the real screen while the policy sees its 84x84 gray stack. Others: Gymnasium's
    rgb_array renderer."""

    def __init__(self, cfg, spec, seed: int, record: bool, max_frames: int):
        from envs import make_batch_env
        from envs.registry import resolve_backend

        self.twin, self.frames, self.max_frames = None, [], max_frames
        self.fps = 60 // spec.frameskip if spec.family == "atari" else None  # the ALE runs at 60 frames/s
        backend = cfg.env.env_backend
        render_mode = None
        if record and spec.family != "atari":
            render_mode = "rgb_array"
            if resolve_backend(cfg.env.env, backend) != "gymnasium":
                backend = "gymnasium"  # the renderer is Gymnasium's
                print(f"video: {cfg.env.env} is played through Gymnasium's implementation, which renders")
            try:
                warnings.simplefilter("ignore", DeprecationWarning)  # Gymnasium's notes on older env versions
                probe = make_batch_env(cfg.env.env, backend, 1, seed=seed, spec=spec, training=False,
                                       render_mode=render_mode)
                probe.reset()
                probe.render()
                probe.close()
            except Exception as exc:  # Gymnasium raises its own error types when a renderer is missing
                raise EnjoyError(f"--video: {cfg.env.env} cannot render here ({exc.__class__.__name__}: "
                                 f"{_first_line(exc)}); replay without --video") from None
        self.env = make_batch_env(cfg.env.env, backend, 1, seed=seed, spec=spec, training=False,
                                  render_mode=render_mode)
        if record and spec.family == "atari":
            import envpool

            self.twin = envpool.make(cfg.env.env, env_type="gymnasium", num_envs=1, num_threads=1, seed=seed,
                                     episodic_life=False, reward_clip=False, img_height=210, img_width=160,
                                     gray_scale=False, stack_num=1)
        self.record = record
        self.num_envs = 1

    def _capture(self, twin_obs=None):
        if not self.record or len(self.frames) >= self.max_frames:
            return
        frame = twin_obs[0, -3:].transpose(1, 2, 0) if self.twin is not None else self.env.render()[0]
        self.frames.append(np.ascontiguousarray(frame))

    def reset(self):
        obs = self.env.reset()
        self._capture(self.twin.reset()[0] if self.twin is not None else None)
        return obs

    def step(self, actions):
        result = self.env.step(actions)
        self._capture(self.twin.step(actions)[0] if self.twin is not None else None)
        return result


def write_video(path: str, frames: list, fps: int) -> None:
    import imageio.v2 as imageio

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    height, width = frames[0].shape[:2]
    frames = [frame[:height // 2 * 2, :width // 2 * 2] for frame in frames]  # H.264 wants even sizes
    if path.lower().endswith(".gif"):
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
    else:
        imageio.mimsave(path, frames, fps=fps, macro_block_size=1)


def run(args) -> int:
    exp_dir = os.path.join(args.train_dir, args.experiment)
    if not os.path.exists(os.path.join(exp_dir, "config.json")):
        raise EnjoyError(f"no experiment at {exp_dir} (config.json missing): check --experiment and --train_dir")
    import dataclasses

    from envs import probe_env_spec
    from sf_engine.config import Config
    from sf_engine.device import resolve_device
    from sf_engine.episodes import play
    from sf_engine.model_shape import resolve_model_config

    try:
        with open(os.path.join(exp_dir, "config.json")) as f:
            cfg = Config.from_dict(json.load(f))
    except (ValueError, TypeError, AttributeError) as exc:
        raise EnjoyError(f"{exp_dir}/config.json is unreadable ({exc.__class__.__name__}): was it written by "
                         f"this version of train.py?") from None
    path = resolve_checkpoint(exp_dir, args.experiment, args.checkpoint)
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        raise EnjoyError(str(exc)) from None
    spec = probe_env_spec(cfg.env.env, cfg.env.env_backend)
    try:  # a config.json of an older version may hold 'auto'
        cfg = dataclasses.replace(cfg, model=resolve_model_config(cfg.model, spec))
    except (ValueError, TypeError) as exc:
        raise EnjoyError(f"{exp_dir}/config.json is unreadable ({exc.__class__.__name__}): was it written by "
                         f"this version of train.py?") from None
    policy = load_policy(cfg, spec, path, device)
    env = VideoEnv(cfg, spec, args.seed, record=bool(args.video), max_frames=args.max_frames)
    results = []
    episodes = play(policy, env, args.num_episodes, args.deterministic, device=device)
    for episode, (_, episode_return, length) in enumerate(episodes):
        print(f"episode {episode}: return {episode_return:.1f}, length {length}", flush=True)
        results.append((episode_return, length))
    returns = np.array([r for r, _ in results])
    print(f"{len(results)} episodes of {cfg.env.env} from {os.path.basename(path)}: return "
          f"{returns.mean():.1f} +- {returns.std():.1f}, length {np.mean([n for _, n in results]):.1f}")
    if args.video:
        fps = args.video_fps or env.fps or int(getattr(env.env._env, "metadata", {}).get("render_fps") or 30)
        frames = env.frames
        write_video(args.video, frames, fps)
        print(f"video: {args.video} ({len(frames)} frames of {frames[0].shape[1]}x{frames[0].shape[0]} at {fps} fps)")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # Gymnasium's renderers draw off screen
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    from envs import EnvError

    try:
        return run(args)
    except (EnjoyError, EnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
