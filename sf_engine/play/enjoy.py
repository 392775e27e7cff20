"""Replay a trained agent (enjoy.py, or the sf-enjoy command): loads <train_dir>/<experiment>/config.json
and a checkpoint (the newest by default), plays --num_episodes episodes and prints each episode's return
and length, then a summary line; --video records them (rgb frames from the env's renderer; the
full-colour screen on Atari), --render shows them on screen."""

import argparse
import json
import os
import sys
import warnings

import numpy as np


class EnjoyError(RuntimeError):
    """A problem the user can fix: one line, exit code 2."""


def experiment_parser(description: str) -> argparse.ArgumentParser:
    """The flags that pick a trained experiment and its checkpoint (enjoy.py, export)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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
        "env's own observation of its seat, e.g. envs.opponents:connect_four_heuristic), or "
        "a checkpoint file of a policy trained on the same env.",
    )
    return parser.parse_args(argv)


def check_args(args) -> None:
    """Bad values: one line naming the flag, before anything is loaded or written."""
    if args.video and not args.video.lower().endswith((".mp4", ".gif")):
        raise EnjoyError(f"--video {args.video}: the file name must end in .mp4 or .gif")
    if args.video and not os.access(os.path.dirname(os.path.abspath(args.video)), os.W_OK):
        raise EnjoyError(f"--video {args.video}: its directory does not exist or is not writable")
    for flag, value in (
        ("--num_episodes", args.num_episodes),
        ("--max_frames", args.max_frames),
        ("--max_episode_steps", args.max_episode_steps),
    ):
        if value < 1:
            raise EnjoyError(f"{flag} must be at least 1 (got {value})")
    if args.video_fps is not None and not 1 <= args.video_fps <= 1000:
        raise EnjoyError(f"--video_fps must be within 1..1000 (got {args.video_fps})")
    if args.render and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise EnjoyError("--render: no display here (DISPLAY is not set); record a video with --video instead")


def resolve_checkpoint(exp_dir: str, experiment: str, choice: str) -> str:
    from sf_engine.runtime.checkpoint import BEST_NAME, checkpoint_dir, latest_valid_checkpoint

    if choice == "latest":
        path, skipped = latest_valid_checkpoint(checkpoint_dir(exp_dir), load=True)
        if path is None and skipped:
            raise EnjoyError(f"experiment {experiment} has no usable checkpoint ({skipped[-1][1]})")
        if path is None:
            raise EnjoyError(
                f"experiment {experiment} has no checkpoint yet: train it first "
                f"(python train.py --experiment {experiment})"
            )
        for _, reason in skipped:
            print(f"skipping checkpoint: {reason}: using the one before it", flush=True)
        return path
    if choice == "best":
        path = os.path.join(checkpoint_dir(exp_dir), BEST_NAME)
        if not os.path.exists(path):
            raise EnjoyError(
                f"experiment {experiment} has no best checkpoint: train it with --eval_every_sec "
                f"or use --checkpoint latest"
            )
        return path
    if not os.path.isfile(choice):
        raise EnjoyError(f"--checkpoint {choice}: no such file")
    return choice


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [exc.__class__.__name__])[0]


def load_policy(cfg, spec, path: str, device, policy: int = 0):
    """The actor-critic of `cfg` with the weights of checkpoint `path` (of its policy `policy` where it
    holds several), or an EnjoyError saying why not."""
    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.model.shape import changed_flags
    from sf_engine.runtime.checkpoint import CheckpointError, load_checkpoint

    try:
        state = load_checkpoint(path, "cpu")
    except CheckpointError as exc:
        raise EnjoyError(f"checkpoint {exc}: pass an older one with --checkpoint PATH") from None
    if not isinstance(state, dict) or ("model" not in state and not state.get("policies")):
        raise EnjoyError(f"checkpoint {path} is not an sf_engine checkpoint: pick one from <experiment>/checkpoints")
    saved = state.get("config", {})
    try:
        changed = changed_flags({"env": {"env": cfg.env.env}} | saved, cfg, spec) if isinstance(saved, dict) else []
        changed = [flag for flag in changed if flag != "--num_policies"]  # one policy of it is loaded
    except ValueError as exc:
        raise EnjoyError(
            f"checkpoint {path}: its configuration is {exc}: pick a checkpoint of this experiment"
        ) from None
    if changed:
        raise EnjoyError(
            f"checkpoint {path} was trained on {saved.get('env', {}).get('env')} with other model flags "
            f"than experiment {cfg.run.experiment} ({cfg.env.env}): pick a checkpoint of this experiment"
        )
    states = state.get("policies") or [state]
    if not 0 <= policy < len(states):
        raise EnjoyError(f"--policy {policy}: checkpoint {path} holds policies 0..{len(states) - 1}")
    model = ActorCritic(spec, cfg.model)
    try:
        model.load_state_dict(states[policy]["model"])
    except (KeyError, RuntimeError) as exc:
        raise EnjoyError(
            f"checkpoint {path} does not fit the model of experiment {cfg.run.experiment}: {_first_line(exc)}"
        ) from None
    return model.to(device).eval()


class VideoWriter:
    """Frames piped to ffmpeg as they come, so memory stays flat however long the video: an .mp4 in
    H.264 (x264's veryfast preset: as small a file as its default here, in about half the time), a
    .gif with a fixed 256-colour palette. Even sizes, as H.264 wants them."""

    def __init__(self, path: str, fps: int):
        import imageio_ffmpeg  # a missing package fails here, before anything is played

        self.path, self.fps, self.frames, self.size, self._writer = path, fps, 0, None, None
        self._ffmpeg = imageio_ffmpeg

    def _open(self, width: int, height: int) -> None:
        if self.path.lower().endswith(".gif"):
            options = {"codec": "gif", "pix_fmt_out": "rgb8", "quality": None}
        else:
            options = {"codec": "libx264", "pix_fmt_out": "yuv420p", "output_params": ["-preset", "veryfast"]}
        try:
            self._writer = self._ffmpeg.write_frames(
                self.path, (width, height), fps=self.fps, macro_block_size=1, **options
            )
            self._writer.send(None)  # starts ffmpeg
        except Exception as exc:  # ffmpeg's own failures: one line, not a traceback
            self._writer = None
            raise EnjoyError(
                f"--video {self.path}: cannot write it ({exc.__class__.__name__}: {_first_line(exc)})"
            ) from None
        self.size = (width, height)

    def append(self, frame: np.ndarray) -> None:
        height, width = frame.shape[:2]
        if self._writer is None:
            self._open(width // 2 * 2, height // 2 * 2)
        self._writer.send(np.ascontiguousarray(frame[: self.size[1], : self.size[0]]))
        self.frames += 1

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class VideoEnv:
    """The env the agent plays, and what it plays for the video or the screen (`render`: 'video',
    'human' or None). Atari video: a twin EnvPool env at 210x160 RGB, same seed and actions (ALE is
    deterministic), so the video shows the real screen while the policy sees its 84x84 gray stack.
    Others: Gymnasium's renderer. Frames go to `writer` (a VideoWriter, set by the caller) as played."""

    def __init__(self, cfg, spec, seed: int, render, max_frames: int):
        from sf_engine.envs import make_batch_env
        from sf_engine.envs.registry import resolve_backend

        # one game: a multi-agent env's agents are its rows, all played by the policy (self-play)
        self.twin, self.writer, self.max_frames, self.num_envs = None, None, max_frames, spec.num_agents
        self.fps = 60 // spec.frameskip if spec.family == "atari" else None  # the ALE runs at 60 frames/s
        backend, render_mode = cfg.env.env_backend, None
        if render == "human" and spec.family == "atari":
            raise EnjoyError(f"--render: {cfg.env.env} is an EnvPool Atari env, which has no screen; use --video")
        if render and spec.family != "atari":
            render_mode = "rgb_array" if render == "video" else "human"
            if resolve_backend(cfg.env.env, backend) != "gymnasium":
                backend = "gymnasium"  # the renderer is Gymnasium's
                print(f"{cfg.env.env} is played through Gymnasium's implementation, which renders")
            _check_renders(cfg, backend, seed, spec, render_mode)
        self.env = make_batch_env(
            cfg.env.env, backend, spec.num_agents, seed=seed, spec=spec, training=False, render_mode=render_mode
        )
        if render == "video" and spec.family == "atari":
            import envpool

            self.twin = envpool.make(
                cfg.env.env,
                env_type="gymnasium",
                num_envs=1,
                num_threads=1,
                seed=seed,
                episodic_life=False,
                reward_clip=False,
                img_height=210,
                img_width=160,
                gray_scale=False,
                stack_num=1,
            )

    def _capture(self, twin_obs=None):
        if self.writer is None or self.writer.frames >= self.max_frames:
            return
        self.writer.append(twin_obs[0, -3:].transpose(1, 2, 0) if self.twin is not None else self.env.render()[0])

    def close(self) -> None:
        try:
            if self.writer is not None:
                self.writer.close()
        finally:
            self.env.close()
            if self.twin is not None:
                self.twin.close()

    def reset(self):
        obs = self.env.reset()
        self._capture(self.twin.reset()[0] if self.twin is not None else None)
        return obs

    def step(self, actions):
        result = self.env.step(actions)
        self._capture(self.twin.step(actions)[0] if self.twin is not None else None)
        return result


def _check_renders(cfg, backend: str, seed: int, spec, render_mode: str) -> None:
    """A throwaway env renders once, or EnjoyError: a missing renderer is one line, not a traceback."""
    from sf_engine.envs import make_batch_env

    try:
        warnings.simplefilter("ignore", DeprecationWarning)  # Gymnasium's notes on older env versions
        probe = make_batch_env(
            cfg.env.env, backend, spec.num_agents, seed=seed, spec=spec, training=False, render_mode=render_mode
        )
        probe.reset()
        probe.render()
        probe.close()
    except Exception as exc:  # Gymnasium raises its own error types when a renderer is missing
        flag = "--video" if render_mode == "rgb_array" else "--render"
        raise EnjoyError(
            f"{flag}: {cfg.env.env} cannot render here ({exc.__class__.__name__}: "
            f"{_first_line(exc)}); replay without {flag}"
        ) from None


def load_experiment(train_dir: str, experiment: str) -> tuple:
    """(config, env spec, experiment directory) of a trained experiment, its config resolved; or an
    EnjoyError saying what is wrong."""
    import dataclasses

    from sf_engine.config.groups import Config
    from sf_engine.envs import probe_env_spec
    from sf_engine.model.shape import resolve_model_config

    exp_dir = os.path.join(train_dir, experiment)
    if not os.path.exists(os.path.join(exp_dir, "config.json")):
        raise EnjoyError(f"no experiment at {exp_dir} (config.json missing): check --experiment and --train_dir")
    unreadable = exp_dir + "/config.json is unreadable ({}): was it written by this version of train.py?"
    try:
        with open(os.path.join(exp_dir, "config.json")) as f:
            cfg = Config.from_dict(json.load(f))
    except (ValueError, TypeError, AttributeError) as exc:
        raise EnjoyError(unreadable.format(exc.__class__.__name__)) from None
    spec = probe_env_spec(cfg.env.env, cfg.env.env_backend)
    try:  # a config.json of an older version may hold 'auto'
        return dataclasses.replace(cfg, model=resolve_model_config(cfg.model, spec)), spec, exp_dir
    except (ValueError, TypeError) as exc:
        raise EnjoyError(unreadable.format(exc.__class__.__name__)) from None


def run(args) -> int:
    from sf_engine.play.episodes import play
    from sf_engine.runtime.device import resolve_device

    cfg, spec, exp_dir = load_experiment(args.train_dir, args.experiment)
    path = resolve_checkpoint(exp_dir, args.experiment, args.checkpoint)
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        raise EnjoyError(str(exc)) from None
    policy = load_policy(cfg, spec, path, device, args.policy)
    if args.opponent:
        return _run_matches(args, cfg, spec, path, policy, device)
    env = VideoEnv(cfg, spec, args.seed, "video" if args.video else ("human" if args.render else None), args.max_frames)
    if args.video:
        fps = args.video_fps or env.fps or int(env.env.render_fps or 30)
        try:
            env.writer = VideoWriter(args.video, fps)
        except Exception as exc:  # imageio/ffmpeg raise their own types: one line, not a traceback
            env.close()
            raise EnjoyError(
                f"--video {args.video}: cannot write it ({exc.__class__.__name__}: {_first_line(exc)})"
            ) from None
    results = []
    try:
        per_row = -(-args.num_episodes // spec.num_agents)  # a multi-agent env: each agent's episodes count
        episodes = play(
            policy, env, per_row, args.deterministic, device=device, max_episode_steps=args.max_episode_steps
        )
        for episode, (_, episode_return, length) in enumerate(episodes):
            if episode >= args.num_episodes:
                break
            cut = " (cut at --max_episode_steps)" if length >= args.max_episode_steps else ""
            print(f"episode {episode}: return {episode_return:.1f}, length {length}{cut}", flush=True)
            results.append((episode_return, length))
    finally:
        env.close()  # the video too: a replay stopped early still leaves a playable one
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
    if env.writer is not None:
        (width, height), frames = env.writer.size or (0, 0), env.writer.frames
        print(f"video: {args.video} ({frames} frames of {width}x{height} at {env.writer.fps} fps)")
        figures["video"] = {
            "path": args.video,
            "frames": frames,
            "width": width,
            "height": height,
            "fps": env.writer.fps,
        }
    print(json.dumps(figures), flush=True)  # the last line, for scripts
    return 0


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
        raise EnjoyError(f"--opponent: {why}")
    try:
        opponent = make_opponent(
            args.opponent, spec, lambda path: load_policy(cfg, spec, path, device), device, seed=args.seed
        )
    except OpponentError as exc:
        raise EnjoyError(str(exc)) from None
    env = make_batch_env(
        cfg.env.env, cfg.env.env_backend, 2 * min(args.num_episodes, 32), seed=args.seed, spec=spec, training=False
    )
    try:
        figures = play_matches(policy, env, opponent, args.num_episodes, args.deterministic, device=device)
    finally:
        env.close()
    print(
        f"{figures['games']} games of {cfg.env.env} from {os.path.basename(path)} against {opponent.name}: "
        f"won {figures['win_rate']:.1%}, drew {figures['draw_rate']:.1%}, lost {figures['loss_rate']:.1%} "
        f"(games per seat {figures['games_per_seat']}, mean length {figures['length_mean']:.1f})"
    )
    print(
        json.dumps(
            {
                "enjoy": cfg.env.env,
                "checkpoint": os.path.basename(path),
                "opponent": opponent.name,
                "episodes": figures["games"],
                "deterministic": bool(args.deterministic),
                **figures,
            }
        ),
        flush=True,
    )
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.render:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # Gymnasium's renderers draw off screen
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    from sf_engine.envs import EnvError

    try:
        check_args(args)
        return run(args)
    except KeyboardInterrupt:  # Ctrl-C: the video so far is closed and playable
        print("interrupted", file=sys.stderr)
        return 130
    except (EnjoyError, EnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
