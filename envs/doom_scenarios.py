"""The Doom family's scenarios: which env ids are Doom (VizDoom's Gymnasium ids and Sample Factory's
names) and how each is played (its config file, Sample Factory's settings, reward scaling and shaping,
the stats it reports). Data only, without VizDoom: the runner reads it when it probes an env id for its
family, a rollout worker when it makes a game (envs.doom.DoomEnv).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    """One VizDoom scenario as this family plays it. `cfg`: its config file among VizDoom's scenarios;
    `reward_scale`: Sample Factory's scaling of the env reward; `gathering`: Sample Factory's gathering
    shaping (+1 whenever health rises); `bots`: a deathmatch hosted with this many of VizDoom's
    built-in bots, `minutes` long; `shaping`: (game variable, reward per unit it rises, per unit it
    falls); `stats`: (name, game variable): its change over each episode, reported at the episode's end
    (TensorBoard's episode/NAME); `objective`: the stat that is the true objective (unset: the env's own
    return before shaping); `settings`: (DoomGame setter without 'set_', value) applied over the config
    file, and `buttons` added to its own, where Sample Factory's copy of the config differs from VizDoom's;
    `players` > 1: a multiplayer deathmatch of that many agents, `minutes` long (envs.doom_duel)."""

    cfg: str
    reward_scale: float = 1.0
    gathering: bool = False
    bots: int = 0
    minutes: float = 4.0
    shaping: tuple = ()
    stats: tuple = ()
    objective: str | None = None
    settings: tuple = ()
    buttons: tuple = ()
    players: int = 1


# Sample Factory's deathmatch shaping (its DEATHMATCH_V0 scheme, without the weapon and ammo terms)
DEATHMATCH_SHAPING = (
    ("FRAGCOUNT", 1.0, 1.5),
    ("DEATHCOUNT", -0.75, 0.75),
    ("HITCOUNT", 0.01, 0.01),
    ("DAMAGECOUNT", 0.003, 0.003),
    ("HEALTH", 0.005, 0.003),
    ("ARMOR", 0.005, 0.001),
)
DEATHMATCH_STATS = (("frags", "FRAGCOUNT"), ("deaths", "DEATHCOUNT"), ("hits", "HITCOUNT"))
BATTLE_SHAPING = (("KILLCOUNT", 1.0, 0.0),) + DEATHMATCH_SHAPING[2:]  # its wad rewards no kill itself

# what Sample Factory's own copies of VizDoom's configs change: rendering, and gathering's rewards
_SF_RENDER = (
    ("render_decals", False),
    ("render_particles", False),
    ("render_crosshair", False),
    ("render_screen_flashes", True),
)
_SF_HUD = _SF_RENDER + (("render_hud", True),)
_SF_GATHERING = _SF_RENDER + (("render_weapon", False), ("living_reward", 0.01), ("death_penalty", 0.0))

# Sample Factory's names for the single-player scenarios that VizDoom ships (its doom_utils.DOOM_ENVS),
# played with its settings
SAMPLE_FACTORY_NAMES = {
    "doom_basic": Scenario("basic.cfg", reward_scale=0.01, settings=_SF_HUD),
    "doom_health_gathering_supreme": Scenario(
        "health_gathering_supreme.cfg", gathering=True, settings=_SF_GATHERING, buttons=("MOVE_BACKWARD",)
    ),
    "doom_health_gathering": Scenario(
        "health_gathering.cfg", gathering=True, settings=_SF_GATHERING, buttons=("MOVE_BACKWARD",)
    ),
    "doom_defend_the_center": Scenario("defend_the_center.cfg", settings=_SF_HUD),
    "doom_defend_the_line": Scenario("defend_the_line.cfg", settings=_SF_HUD),
    "doom_my_way_home": Scenario("my_way_home.cfg", settings=_SF_RENDER),
    "doom_deadly_corridor": Scenario("deadly_corridor.cfg", reward_scale=0.01, settings=_SF_HUD),
    # against 7 built-in bots on VizDoom's own deathmatch map (Sample Factory's dwango5 map is its own)
    "doom_deathmatch_bots": Scenario(
        "cig.cfg", bots=7, shaping=DEATHMATCH_SHAPING, stats=DEATHMATCH_STATS, objective="frags"
    ),
    # the monster arena VizDoom ships (Sample Factory's battle.wad is its own)
    "doom_battle": Scenario(
        "deathmatch.cfg", shaping=BATTLE_SHAPING, stats=(("kills", "KILLCOUNT"),), objective="kills"
    ),
    # two agents in one multiplayer deathmatch on VizDoom's deathmatch map, over loopback (self-play)
    "doom_duel": Scenario(
        "cig.cfg", players=2, minutes=2.0, shaping=DEATHMATCH_SHAPING, stats=DEATHMATCH_STATS, objective="frags"
    ),
}

# VizDoom's Gymnasium ids (vizdoom.gymnasium_wrapper, one button at a time) -> their config files
GYMNASIUM_IDS = {
    "VizdoomBasic-v1": "basic.cfg",
    "VizdoomBasicAudio-v1": "basic_audio.cfg",
    "VizdoomBasicNotifications-v1": "basic_notifications.cfg",
    "VizdoomDeadlyCorridor-v1": "deadly_corridor.cfg",
    "VizdoomDefendCenter-v1": "defend_the_center.cfg",
    "VizdoomDefendLine-v1": "defend_the_line.cfg",
    "VizdoomHealthGathering-v1": "health_gathering.cfg",
    "VizdoomHealthGatheringSupreme-v1": "health_gathering_supreme.cfg",
    "VizdoomMyWayHome-v1": "my_way_home.cfg",
    "VizdoomPredictPosition-v1": "predict_position.cfg",
    "VizdoomTakeCover-v1": "take_cover.cfg",
    "VizdoomDeathmatch-v1": "deathmatch.cfg",
    "VizdoomCorridor-v1": "deadly_corridor.cfg",
    "VizdoomRocketBasic-v1": "rocket_basic.cfg",
    "VizdoomSimplerBasic-v1": "simpler_basic.cfg",
}


def is_doom(env_id: str) -> bool:
    return env_id in SAMPLE_FACTORY_NAMES or env_id in GYMNASIUM_IDS


def scenario(env_id: str) -> Scenario:
    return SAMPLE_FACTORY_NAMES.get(env_id) or Scenario(GYMNASIUM_IDS[env_id])
