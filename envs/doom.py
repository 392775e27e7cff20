"""The Doom family: VizDoom's scenarios under their Gymnasium ids (`VizdoomBasic-v1`, ...) and under
Sample Factory's names (`doom_basic`, ...), with Sample Factory's observation settings, so that the
two engines do the same work per frame: the screen rendered at 160x120 in RGB and resized to 128x72
(area interpolation), frame skip 4 (an env step is 4 game tics; frames count all of them), one
discrete action per button plus 'idle', and Sample Factory's reward scaling and shaping.

Needs the `doom` extra (vizdoom and OpenCV); without it, making or probing a Doom env stops with one
line saying how to install it. The game runs in its own process, which VizDoom starts at the first
reset and stops on close().
"""
from __future__ import annotations

import glob
import os
import shutil
import tempfile
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

INSTALL_HINT = "pip install 'sf_engine[doom]' (vizdoom and opencv-python-headless)"
INI_PREFIX = "sf_engine_vizdoom_"  # + the owning process's pid + '_': each game's ini folder
SHM_PREFIXES = ("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")  # + the game's instance id, in /dev/shm
FRAME_SKIP = 4
SCREEN_HW = (72, 128)  # the network's input, resized from the 120x160 render


@dataclass(frozen=True)
class Scenario:
    """One VizDoom scenario as this family plays it. `cfg`: its config file among VizDoom's scenarios;
    `reward_scale`: Sample Factory's scaling of the env reward; `gathering`: Sample Factory's gathering
    shaping (+1 whenever health rises, the env's own reward kept apart as the true objective)."""
    cfg: str
    reward_scale: float = 1.0
    gathering: bool = False


# Sample Factory's names for the single-player scenarios that VizDoom ships (its doom_utils.DOOM_ENVS)
SAMPLE_FACTORY_NAMES = {
    "doom_basic": Scenario("basic.cfg", reward_scale=0.01),
    "doom_health_gathering_supreme": Scenario("health_gathering_supreme.cfg", gathering=True),
    "doom_health_gathering": Scenario("health_gathering.cfg", gathering=True),
    "doom_defend_the_center": Scenario("defend_the_center.cfg"),
    "doom_defend_the_line": Scenario("defend_the_line.cfg"),
    "doom_my_way_home": Scenario("my_way_home.cfg"),
    "doom_deadly_corridor": Scenario("deadly_corridor.cfg", reward_scale=0.01),
}

# VizDoom's Gymnasium ids (vizdoom.gymnasium_wrapper, one button at a time) -> their config files
GYMNASIUM_IDS = {
    "VizdoomBasic-v1": "basic.cfg", "VizdoomBasicAudio-v1": "basic_audio.cfg",
    "VizdoomBasicNotifications-v1": "basic_notifications.cfg", "VizdoomDeadlyCorridor-v1": "deadly_corridor.cfg",
    "VizdoomDefendCenter-v1": "defend_the_center.cfg", "VizdoomDefendLine-v1": "defend_the_line.cfg",
    "VizdoomHealthGathering-v1": "health_gathering.cfg",
    "VizdoomHealthGatheringSupreme-v1": "health_gathering_supreme.cfg", "VizdoomMyWayHome-v1": "my_way_home.cfg",
    "VizdoomPredictPosition-v1": "predict_position.cfg", "VizdoomTakeCover-v1": "take_cover.cfg",
    "VizdoomDeathmatch-v1": "deathmatch.cfg", "VizdoomCorridor-v1": "deadly_corridor.cfg",
    "VizdoomRocketBasic-v1": "rocket_basic.cfg", "VizdoomSimplerBasic-v1": "simpler_basic.cfg",
}


def is_doom(env_id: str) -> bool:
    return env_id in SAMPLE_FACTORY_NAMES or env_id in GYMNASIUM_IDS


def scenario(env_id: str) -> Scenario:
    return SAMPLE_FACTORY_NAMES.get(env_id) or Scenario(GYMNASIUM_IDS[env_id])


def missing(env_id: str):
    """None when the Doom family's packages import; else the one-line reason with the install command."""
    for module in ("vizdoom", "cv2"):
        try:
            __import__(module)
        except ImportError:
            return f"--env {env_id}: the Doom family needs {module!r}, which is not installed: {INSTALL_HINT}"
    return None


class DoomEnv(gym.Env):
    """One VizDoom game. Observation: the screen, [72, 128, 3] uint8 (RGB, resized from 160x120);
    action: Discrete(1 + buttons), 0 idle and i pressing button i - 1 for the 4 tics of a step.
    `render()` gives the full-resolution screen of the last step, not the network's input."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 35 // FRAME_SKIP}

    def __init__(self, env_id: str = "doom_basic", render_mode=None, frame_skip: int = FRAME_SKIP):
        import vizdoom

        self.env_id, self.render_mode, self.frame_skip = env_id, render_mode, frame_skip
        self.scenario = scenario(env_id)
        game = vizdoom.DoomGame()
        game.load_config(os.path.join(vizdoom.scenarios_path, self.scenario.cfg))
        game.set_screen_resolution(vizdoom.ScreenResolution.RES_160X120)
        game.set_screen_format(vizdoom.ScreenFormat.RGB24)
        game.set_window_visible(False)
        game.set_sound_enabled(False)
        game.set_mode(vizdoom.Mode.PLAYER)
        # the engine's ini, not in the cwd; the folder's name says which process owns the game
        self._ini_dir = tempfile.mkdtemp(prefix=f"{INI_PREFIX}{os.getpid()}_")
        game.set_doom_config_path(os.path.join(self._ini_dir, "_vizdoom.ini"))
        self.game, self._running = game, False
        buttons = game.get_available_buttons_size()
        self._actions = np.eye(buttons + 1, buttons, k=-1).tolist()  # row 0 idle, row i button i - 1
        variables = [str(v).split(".")[-1] for v in game.get_available_game_variables()]
        self._health_index = variables.index("HEALTH") if self.scenario.gathering else None
        self.action_space = gym.spaces.Discrete(buttons + 1)
        self.observation_space = gym.spaces.Box(0, 255, (*SCREEN_HW, 3), np.uint8)
        self._screen = np.zeros((120, 160, 3), np.uint8)
        self._health = None
        self._true_return = 0.0

    def _observe(self) -> np.ndarray:
        import cv2

        state = self.game.get_state()
        if state is not None:  # None once the episode is over: the last screen stays
            self._screen = state.screen_buffer
            if self.scenario.gathering:
                self._health = float(state.game_variables[self._health_index])
        return cv2.resize(self._screen, SCREEN_HW[::-1], interpolation=cv2.INTER_AREA)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.game.set_seed(int(seed) % 2**31)
        if not self._running:
            self.game.init()
            self._running = True
            _record_instance(self._ini_dir)
        else:
            self.game.new_episode()
        self._health, self._true_return = None, 0.0
        return self._observe(), {}

    def step(self, action):
        previous_health = self._health
        reward = self.game.make_action(self._actions[int(action)], self.frame_skip)
        over = self.game.is_episode_finished()
        truncated = over and self.game.is_episode_timeout_reached()
        obs = self._observe()
        self._true_return += reward
        info = {}
        if self.scenario.gathering and not over and previous_health is not None and self._health > previous_health:
            reward += 1.0  # Sample Factory's gathering shaping: +1 whenever health rises
        if over:
            info["true_objective"] = self._true_return
        return obs, reward * self.scenario.reward_scale, over and not truncated, truncated, info

    def render(self):
        return self._screen.copy()

    def close(self):
        if self._running:
            self.game.close()
            self._running = False
        shutil.rmtree(self._ini_dir, ignore_errors=True)


def _arg(cmdline: list, name: str):
    return cmdline[cmdline.index(name) + 1] if name in cmdline[:-1] else None


def _owner(ini_dir: str):
    """The pid in an ini folder's name made by DoomEnv, or None for a folder that is not one."""
    name = os.path.basename(ini_dir)
    if not name.startswith(INI_PREFIX):
        return None
    pid = name[len(INI_PREFIX):].split("_", 1)[0]
    return int(pid) if pid.isdigit() else None


def _record_instance(ini_dir: str) -> None:
    """Writes the game's instance id (which names its segments in /dev/shm) into its ini folder, so
    that the segments of a game killed with its worker can still be found by the folder."""
    import psutil

    for child in psutil.Process().children():
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        instance = _arg(cmdline, "+viz_instance_id")
        if instance and os.path.dirname(_arg(cmdline, "-config") or "") == ini_dir:
            with open(os.path.join(ini_dir, "instance"), "w") as f:
                f.write(instance)
            return


def _remove_segments(instance, shm_dir: str) -> None:
    if instance and instance.isalnum():
        for prefix in SHM_PREFIXES:
            try:
                os.unlink(os.path.join(shm_dir, prefix + instance))
            except OSError:
                pass


def reap_orphaned_games(shm_dir: str = "/dev/shm") -> list:
    """VizDoom runs each game in a process of its own, which outlives a rollout worker killed with
    SIGKILL (it is handed to init) and keeps its shared-memory segments and message queues. Kills the
    games of this family whose owning process is no longer their parent, removes their segments and
    ini folders; returns one line per game reaped. Touches no game whose owner lives, nor any other
    VizDoom game (only those started with this family's ini folders). Games killed with their worker
    leave only files: those of owners that are gone are removed too."""
    import psutil

    done, ini_dirs = [], glob.glob(os.path.join(tempfile.gettempdir(), INI_PREFIX + "*"))
    if not ini_dirs:  # every game, orphaned or not, has its ini folder: none, nothing to reap (no process scan)
        return done
    for process in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        config = _arg(cmdline, "-config")
        if not cmdline or os.path.basename(cmdline[0]) != "vizdoom" or config is None:
            continue
        ini_dir = os.path.dirname(config)
        owner = _owner(ini_dir)
        if owner is None or process.info["ppid"] == owner:
            continue
        try:
            process.kill()
            process.wait(timeout=5.0)
        except psutil.NoSuchProcess:
            pass
        except psutil.Error:
            continue
        _remove_segments(_arg(cmdline, "+viz_instance_id"), shm_dir)
        shutil.rmtree(ini_dir, ignore_errors=True)
        done.append(f"reaped a VizDoom game (pid {process.info['pid']}) whose worker (pid {owner}) is gone")
    for ini_dir in ini_dirs:  # games killed with their worker: only their files are left
        owner = _owner(ini_dir)
        if owner is None or psutil.pid_exists(owner) or not os.path.isdir(ini_dir):
            continue
        try:
            with open(os.path.join(ini_dir, "instance")) as f:
                _remove_segments(f.read().strip(), shm_dir)
        except OSError:
            pass
        shutil.rmtree(ini_dir, ignore_errors=True)
        done.append(f"removed the files of a VizDoom game whose worker (pid {owner}) was killed with it")
    return done


class DoomFactory:
    """Picklable factory of one Doom env, as a rollout worker makes it."""

    def __init__(self, env_id: str):
        self.env_id = env_id

    def __call__(self, render_mode=None):
        return DoomEnv(self.env_id, render_mode=render_mode)
