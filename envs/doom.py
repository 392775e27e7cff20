"""The Doom family: VizDoom's scenarios under their Gymnasium ids (`VizdoomBasic-v1`, ...) and under
Sample Factory's names (`doom_basic`, ...), with Sample Factory's observation settings, so that the
two engines do the same work per frame: the screen rendered at 160x120 in RGB and resized to 128x72
(nearest-neighbour, Sample Factory's default), frame skip 4 (an env step is 4 game tics; frames
count all of them), one discrete action per button plus 'idle', and Sample Factory's reward scaling
and shaping. `doom_deathmatch_bots` hosts a deathmatch against VizDoom's built-in bots. The scenarios,
and which env ids are Doom, are envs.doom_scenarios.

Needs the `doom` extra (vizdoom and OpenCV); without it, making or probing a Doom env stops with one
line saying how to install it. The game runs in its own process, which VizDoom starts at the first
reset and stops on close().
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from dataclasses import replace

import gymnasium as gym
import numpy as np

# the scenario table lives in doom_scenarios; its names stay importable from here
from .doom_scenarios import GYMNASIUM_IDS, SAMPLE_FACTORY_NAMES, Scenario, is_doom, scenario  # noqa: F401

INSTALL_HINT = "pip install 'sf_engine[doom]' (vizdoom and opencv-python-headless)"
INI_PREFIX = "sf_engine_vizdoom_"  # + the owning process's pid + '_': each game's ini folder
SHM_PREFIXES = ("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")  # + the game's instance id, in /dev/shm
FRAME_SKIP = 4
SCREEN_HW = (72, 128)  # the network's input, resized from the 120x160 render

# a hosted deathmatch's rules: forced respawns at once and far from the others, no autoaim or crouching
DEATHMATCH_RULES = (
    "+sv_forcerespawn 1 +sv_noautoaim 1 +sv_respawnprotect 1 +sv_spawnfarthest 1 +sv_nocrouch 1 "
    "+viz_respawn_delay 0 +viz_nocheat 1"
)


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
    action: Discrete(1 + buttons), 0 idle and i pressing button i - 1 for the 4 tics of a step (delta
    buttons, which take an amount, are left out). `render()` gives the full-resolution screen of the
    last step, not the network's input. An episode's last step has info["episode_extra_stats"] (the
    scenario's stats and `true_objective`, the env's own return before shaping)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 35 // FRAME_SKIP}

    def __init__(
        self,
        env_id: str = "doom_basic",
        render_mode=None,
        frame_skip: int = FRAME_SKIP,
        player: int = 0,
        port: int = 0,
        minutes: float | None = None,
    ):
        """`player`, `port`: a multiplayer scenario's seat (0 hosts the game on 127.0.0.1:port, the
        others join it); `minutes`: a deathmatch's length, when not the scenario's."""
        import vizdoom

        self.env_id, self.render_mode, self.frame_skip = env_id, render_mode, frame_skip
        self.scenario = sc = scenario(env_id) if minutes is None else replace(scenario(env_id), minutes=minutes)
        game = vizdoom.DoomGame()
        game.load_config(os.path.join(vizdoom.scenarios_path, sc.cfg))
        game.set_screen_resolution(vizdoom.ScreenResolution.RES_160X120)
        game.set_screen_format(vizdoom.ScreenFormat.RGB24)
        game.set_window_visible(False)
        game.set_sound_enabled(False)
        game.set_mode(vizdoom.Mode.PLAYER)
        for name, value in sc.settings:
            getattr(game, "set_" + name)(value)
        for button in sc.buttons:
            game.add_available_button(getattr(vizdoom.Button, button))
        self.multiplayer = bool(sc.bots) or sc.players > 1
        if self.multiplayer:  # a deathmatch: player 0 hosts it (bots join at each episode's start), others join
            if player == 0:
                port_arg = f" -port {port}" if sc.players > 1 else ""
                game.add_game_args(
                    f"-host {sc.players}{port_arg} -deathmatch +timelimit {sc.minutes} " + DEATHMATCH_RULES
                )
            else:
                game.add_game_args(f"-join 127.0.0.1:{port}")
            name = "agent" if sc.bots else f"player_{player}"
            game.add_game_args(f"+name {name} +colorset {3 * player}")
            game.set_episode_timeout(int(sc.minutes * 60 * 35))
        # the engine's ini, not in the cwd; the folder's name says which process owns the game
        self._ini_dir = tempfile.mkdtemp(prefix=f"{INI_PREFIX}{os.getpid()}_")
        game.set_doom_config_path(os.path.join(self._ini_dir, "_vizdoom.ini"))
        self.game, self._running = game, False
        buttons = [str(b).split(".")[-1] for b in game.get_available_buttons()]
        plain = [i for i, name in enumerate(buttons) if "DELTA" not in name]
        self._actions = [[0.0] * len(buttons)]  # 0: idle
        for i in plain:
            self._actions.append([1.0 if j == i else 0.0 for j in range(len(buttons))])
        self._variables = self._game_variables(vizdoom)
        self.action_space = gym.spaces.Discrete(len(self._actions))
        self.observation_space = gym.spaces.Box(0, 255, (*SCREEN_HW, 3), np.uint8)
        self._screen = np.zeros((120, 160, 3), np.uint8)
        self._values = self._start = None  # the game variables of the last state, of the episode's first
        self._true_return = 0.0

    def _game_variables(self, vizdoom) -> list:
        """The game variables the shaping and the stats read, added to the scenario's own; their names
        in the order of a state's game_variables."""
        sc = self.scenario
        wanted = [v for v, *_ in sc.shaping] + [v for _, v in sc.stats] + (["HEALTH"] if sc.gathering else [])
        present = [str(v).split(".")[-1] for v in self.game.get_available_game_variables()]
        for name in dict.fromkeys(wanted):
            if name not in present:
                self.game.add_available_game_variable(getattr(vizdoom.GameVariable, name))
                present.append(name)
        return present if wanted else []

    def _observe(self) -> np.ndarray:
        import cv2

        state = self.game.get_state()
        if state is not None:  # None once the episode is over: the last screen stays
            self._screen = state.screen_buffer
            if self._variables:
                self._values = dict(zip(self._variables, state.game_variables.tolist()))
        return cv2.resize(self._screen, SCREEN_HW[::-1], interpolation=cv2.INTER_NEAREST)

    def _add_bots(self) -> None:
        if self.scenario.bots:
            self.game.send_game_command("removebots")
            for _ in range(self.scenario.bots):
                self.game.send_game_command("addbot")

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
        self._add_bots()
        self._values, self._true_return = None, 0.0
        obs = self._observe()
        self._start = self._values  # counters such as deaths run on over a multiplayer game's episodes
        return obs, {}

    def _shaping(self, before: dict, after: dict) -> float:
        sc, reward = self.scenario, 0.0
        if sc.gathering and after["HEALTH"] > before["HEALTH"]:
            reward += 1.0  # Sample Factory's gathering shaping: +1 whenever health rises
        for name, per_rise, per_fall in sc.shaping:
            delta = _floored(name, after[name]) - _floored(name, before[name])
            reward += delta * per_rise if delta > 0 else delta * per_fall
        return reward

    def _act(self, buttons: list) -> float:
        """The buttons held for frame_skip tics; the reward over them. The players of a multiplayer game
        (envs.doom_duel) are advanced a tic at a time, all together: tic() for a step's first tics, then
        step() for its last. A several-tic action in one call stalls there, waiting on another player's
        next tics that its own driver will only send after this call returns."""
        if self.scenario.players == 1:
            return self.game.make_action(buttons, self.frame_skip)
        if self.game.is_episode_finished():
            return 0.0
        self.game.set_action(buttons)
        self.game.advance_action(1, True)  # the state, and the reward since the last update: the step's tics
        return self.game.get_last_reward()

    def tic(self, action) -> None:
        """Multiplayer: one of a step's first frame_skip - 1 tics with `action`'s buttons held (the state
        and the reward are updated at the step's last tic)."""
        if not self.game.is_episode_finished():
            self.game.set_action(self._actions[int(action)])
            self.game.advance_action(1, False)

    def step(self, action):
        before = self._values
        reward = self._act(self._actions[int(action)])
        over = self.game.is_episode_finished()
        if self.scenario.bots and not over and self.game.is_player_dead():
            self.game.respawn_player()  # (a netgame of several agents respawns its players by itself: its
            # respawn call would advance one player's game alone, which stalls the others)
        truncated = over and self.game.is_episode_timeout_reached() and not self.multiplayer
        obs = self._observe()
        self._true_return += reward
        info = {}
        if before is not None and not over:
            reward += self._shaping(before, self._values)
        if over:
            extra = {
                name: self._values[variable] - self._start[variable] if self._start else 0.0
                for name, variable in self.scenario.stats
            }
            extra["true_objective"] = extra[self.scenario.objective] if self.scenario.objective else self._true_return
            info["episode_extra_stats"] = extra
        return obs, reward * self.scenario.reward_scale, over and not truncated, truncated, info

    def render(self):
        return self._screen.copy()

    def close(self):
        if self._running:
            self.game.close()
            self._running = False
        shutil.rmtree(self._ini_dir, ignore_errors=True)


def _floored(name: str, value: float) -> float:
    """A game variable as the shaping counts it: a dead player's health below zero counts as zero (a
    telefrag sets it to -999,900, whose climb back to 100 at the respawn would pay 5,000)."""
    return max(value, 0.0) if name == "HEALTH" else value


def _arg(cmdline: list, name: str):
    return cmdline[cmdline.index(name) + 1] if name in cmdline[:-1] else None


def _owner(ini_dir: str):
    """The pid in an ini folder's name made by DoomEnv, or None for a folder that is not one."""
    name = os.path.basename(ini_dir)
    if not name.startswith(INI_PREFIX):
        return None
    pid = name[len(INI_PREFIX) :].split("_", 1)[0]
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
