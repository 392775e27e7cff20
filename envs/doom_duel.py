"""Doom in self-play: the agents of one VizDoom multiplayer deathmatch over loopback (`--env doom_duel`:
two), as a PettingZoo-style ParallelEnv (its API, told by envs.multiagent.is_multiagent; pettingzoo
itself is not needed), so that the engine batches them as the rows of a multi-agent env.

Each player of a multiplayer game waits inside VizDoom until every player's tic has arrived, so the
players cannot be stepped one after the other by one thread: each plays in a process of its own
(`python -m sf_engine.envs.doom_duel ...`, a plain subprocess, which a daemonic rollout worker may
start), driven over a socket pair, and all are advanced one tic at a time together (VizDoom's netgame
stalls when a player runs several tics in one call while another waits for its next command).
A game that still stalls (VizDoom's netgame code does, rarely, and worse under load) is killed after
STALL_TIMEOUT_S, as is one whose player process died or whose game failed: its episode ends truncated
for every agent and the next reset starts a new game. A player process dies with its owner (Linux's
parent-death signal); its VizDoom game is then reaped (envs.doom.reap_orphaned_games).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection

import gymnasium as gym
import numpy as np

from .doom import FRAME_SKIP, SCREEN_HW, DoomEnv, reap_orphaned_games, scenario

START_TIMEOUT_S = 60.0  # a new game's players find each other within this
STALL_TIMEOUT_S = 10.0  # a tic or a new episode that takes longer: the game is stuck


class GameLost(RuntimeError):
    """A player's game stalled, or its process died: the game is killed and a new one started."""


def free_port() -> int:
    """A UDP port free on the loopback address now (the host's game binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class DoomMultiplayer:
    """The `players` agents ("player_0", ...) of one multiplayer game of `env_id`. Every agent acts each
    step; the game ends for all at its time limit (terminal: the frags were the point) and the next
    reset() starts a new episode. An episode's last info holds episode_extra_stats per agent (frags,
    deaths, hits; true_objective: frags). `stalls`: games killed because they stalled or a player was lost."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": DoomEnv.metadata["render_fps"]}

    def __init__(self, env_id: str = "doom_duel", render_mode=None):
        self.env_id, self.render_mode = env_id, render_mode
        sc = scenario(env_id)
        self.minutes = sc.minutes  # passed on: the players' processes read no patched scenario
        self.possible_agents = [f"player_{i}" for i in range(sc.players)]
        self.agents: list = []
        probe = DoomEnv(env_id)  # the spaces, without starting a game
        self._action_space = probe.action_space
        probe.close()
        self._obs_space = gym.spaces.Box(0, 255, (*SCREEN_HW, 3), np.uint8)
        self._links: list = []
        self._procs: list = []
        self._last_obs: dict = {}
        self.stalls = 0

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._action_space

    def _start(self) -> None:
        port = free_port()
        debug = os.environ.get("SF_ENGINE_DOOM_DEBUG")  # VizDoom's own messages, to find a stall
        try:
            for player in range(len(self.possible_agents)):
                ours, theirs = socket.socketpair()
                self._links.append(Connection(ours.detach()))
                with theirs:
                    self._procs.append(
                        subprocess.Popen(
                            [
                                sys.executable,
                                "-m",
                                "sf_engine.envs.doom_duel",
                                str(theirs.fileno()),
                                self.env_id,
                                str(player),
                                str(port),
                                repr(self.minutes),
                            ],
                            pass_fds=(theirs.fileno(),),
                            stdout=None if debug else subprocess.DEVNULL,
                            stderr=None if debug else subprocess.DEVNULL,
                        )
                    )
        except BaseException:
            self._kill()
            raise

    def _ask(self, messages: list, timeout: float) -> list:
        """Each player's reply to its message, or GameLost: one stalled (no reply within `timeout`), its
        process died, or its game raised."""
        replies = []
        try:
            for link, message in zip(self._links, messages):
                link.send(message)
            for player, link in enumerate(self._links):
                if not link.poll(timeout):
                    raise GameLost(f"{self.env_id}: player {player}'s game did not answer in {timeout:.0f} s")
                replies.append(link.recv())
        except (EOFError, OSError) as exc:
            raise GameLost(f"{self.env_id}: a player's process is gone ({exc.__class__.__name__})") from None
        for player, reply in enumerate(replies):
            if isinstance(reply, BaseException):
                raise GameLost(f"{self.env_id}: player {player}'s game failed: {reply}")
        return replies

    def reset(self, seed=None, options=None):
        for attempt in range(3):
            started = not self._links
            if started:
                self._start()
            try:  # the host's seed is the game's: a joining player's own seed would break the game's sync
                replies = self._ask(
                    [("reset", seed)] + [("reset", None)] * (len(self._links) - 1),
                    START_TIMEOUT_S if started else STALL_TIMEOUT_S,
                )
                break
            except GameLost as exc:
                self._stalled(exc)
        else:
            raise RuntimeError(f"{self.env_id}: three games in a row stalled at their start")
        self.agents = list(self.possible_agents)
        self._last_obs = {a: obs for a, (obs, _) in zip(self.agents, replies)}
        return dict(self._last_obs), {a: info for a, (_, info) in zip(self.agents, replies)}

    def step(self, actions: dict):
        moves = [int(actions[a]) for a in self.agents]
        try:
            for _ in range(FRAME_SKIP - 1):
                self._ask([("tic", m) for m in moves], STALL_TIMEOUT_S)
            replies = self._ask([("step", m) for m in moves], STALL_TIMEOUT_S)
        except GameLost as exc:  # the episode ends here, truncated; reset() starts a new game
            self._stalled(exc)
            agents, self.agents = self.agents, []
            return (
                dict(self._last_obs),
                dict.fromkeys(agents, 0.0),
                dict.fromkeys(agents, False),
                dict.fromkeys(agents, True),
                {a: {} for a in agents},
            )
        obs, rewards, terms, truncs, infos = {}, {}, {}, {}, {}
        over = any(r[2] or r[3] for r in replies)  # the time limit ends the game for every player at once
        for agent, (o, r, term, trunc, info) in zip(self.agents, replies):
            obs[agent], rewards[agent], infos[agent] = o, float(r), info
            terms[agent], truncs[agent] = over and not trunc, bool(trunc)
        self._last_obs = obs
        if over:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    def _stalled(self, exc: Exception) -> None:
        self.stalls += 1
        logging.warning("%s; the game is killed and a new one started (%d so far)", exc, self.stalls)
        self._kill()

    def _kill(self) -> None:
        for proc in self._procs:
            proc.kill()
            proc.wait()
        for link in self._links:
            link.close()
        self._links, self._procs = [], []
        reap_orphaned_games()  # the killed players' games

    def render(self):
        if not self._links:
            return None
        return self._ask([("render", None)] + [("none", None)] * (len(self._links) - 1), STALL_TIMEOUT_S)[0]

    def close(self) -> None:
        for link in self._links:
            try:
                link.send(("close", None))
            except OSError:
                pass
        try:
            for proc in self._procs:
                proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if any(proc.poll() is None for proc in self._procs):
            self._kill()
        for link in self._links:
            link.close()
        self._links, self._procs, self.agents = [], [], []

    def __del__(self):
        if getattr(self, "_procs", None):
            self.close()


def _die_with_parent() -> None:
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _serve(link: Connection, env_id: str, player: int, port: int, minutes: float) -> None:
    """A player's process: its DoomEnv, driven by the messages of its link until 'close' or EOF. Ctrl-C
    is its owner's to handle (the owner closes it); it dies with its owner."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    env = DoomEnv(env_id, player=player, port=port, minutes=minutes)
    handlers = {
        "reset": lambda seed: env.reset(seed=seed),
        "tic": env.tic,
        "step": env.step,
        "render": lambda _: env.render(),
        "none": lambda _: None,
    }
    try:
        while True:
            try:
                command, arg = link.recv()
            except (EOFError, OSError):
                return
            if command not in handlers:
                return
            try:
                reply = handlers[command](arg)
            except Exception as exc:  # reported to the env's owner, which raises it there
                reply = RuntimeError(f"{exc.__class__.__name__}: {exc}")
            link.send(reply)
    finally:
        env.close()


class MultiplayerFactory:
    """Picklable factory of one multiplayer game's env (a rollout worker makes it)."""

    def __init__(self, env_id: str):
        self.env_id = env_id

    def __call__(self, render_mode=None):
        return DoomMultiplayer(self.env_id, render_mode=render_mode)


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    os._exit(0)
