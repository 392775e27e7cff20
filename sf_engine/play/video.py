"""Videos and on-screen rendering of a replay: frames piped to ffmpeg as they come (VideoWriter), the
env of a replay that also renders (VideoEnv), and the check that an env can render here at all. Runs in
the replaying process (enjoy.py --video / --render).
"""

from __future__ import annotations

import warnings

import numpy as np

from sf_engine.play.loading import LoadError, first_line


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
            raise LoadError(
                f"--video {self.path}: cannot write it ({exc.__class__.__name__}: {first_line(exc)})"
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
        if render and spec.device:
            flag = "--video" if render == "video" else "--render"
            raise LoadError(f"{flag}: {cfg.env.env} is a device env, which has no renderer: replay without {flag}")
        if render == "human" and spec.family == "atari":
            raise LoadError(f"--render: {cfg.env.env} is an EnvPool Atari env, which has no screen; use --video")
        if render and spec.family != "atari":
            render_mode = "rgb_array" if render == "video" else "human"
            if resolve_backend(cfg.env.env, backend) != "gymnasium":
                backend = "gymnasium"  # the renderer is Gymnasium's
                print(
                    f"{cfg.env.env}: EnvPool, which it was trained on, has no renderer: the replay plays "
                    f"Gymnasium's implementation of the same env"
                )
            check_renders(cfg, backend, seed, spec, render_mode)
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


def check_renders(cfg, backend: str, seed: int, spec, render_mode: str) -> None:
    """A throwaway env renders once, or LoadError: a missing renderer is one line, not a traceback."""
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
        raise LoadError(
            f"{flag}: {cfg.env.env} cannot render here ({exc.__class__.__name__}: "
            f"{first_line(exc)}); replay without {flag}"
        ) from None
