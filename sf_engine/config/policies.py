"""The `policies` group of the configuration: several policies in one run (sf_engine.config.groups imports it
into its GROUPS; the command line and config.json read it like every group)."""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.config.fields import flag_field as _f
from sf_engine.config.fields import int_or_auto
from sf_engine.selfplay.league import ROLES
from sf_engine.selfplay.sampling import WEIGHTINGS


@dataclass(frozen=True)
class PolicyConfig:
    num_policies: int = _f(
        1,
        "Policies trained side by side (Sample Factory's name), each with its own weights, "
        "version counter, optimizer and TensorBoard scalars; the learner and the policy worker "
        "serve them all. Each env row (each agent of a multi-agent env) is played by one "
        "policy per episode, and trains only that policy.",
    )
    agent_policies: str = _f(
        "",
        "How rows are given to policies: '' (default) draws a policy at random for each "
        "episode of each row (random pairing in a multi-agent env); 'AGENT=P,AGENT=P' fixes "
        "each agent of a PettingZoo env to policy P (every agent named).",
    )

    pool_every_versions: int = _f(
        0,
        "Self-play opponent pool: every this many versions of policy 0 a frozen snapshot "
        "of it joins the pool (0: no pool). Snapshots act but never train.",
    )
    pool_share: float = _f(
        0.25,
        "With a pool: the share of seats of a multi-agent game played by pool snapshots "
        "(each seat drawn at each episode; at least one seat of every game stays with a "
        "learning policy).",
    )
    pool_size: int = _f(8, "With a pool: snapshots kept; the oldest gives way to the newest.")
    opponent_sampling: str = _f(
        "uniform",
        "With a pool: how its snapshots are drawn as opponents, by the learning policies' win rate x against "
        "each over its last 200 games (a draw counts half): uniform (alike), pfsp (weight 1-x: those they still "
        "lose to), pfsp_hard ((1-x)^2), pfsp_var (x(1-x): those at their level); prioritized fictitious "
        "self-play, Vinyals et al. 2019.",
        choices=tuple(WEIGHTINGS),
    )
    league: bool = _f(
        False,
        "A league (AlphaStar's) in a two-player game, over --num_policies 3: policy 0 the main agent, 1 a main "
        "exploiter, 2 a league exploiter, each drawing its opponents as AlphaStar does among the trained players "
        "and the pool of their frozen snapshots (--pool_size slots): the main agent is frozen into the pool every "
        "--league_freeze_versions versions, an exploiter once it wins --league_freeze_win_rate of its games since "
        "its last snapshot or after that many versions (the main exploiter then starts over, the league exploiter "
        "with chance 0.25).",
    )
    league_freeze_win_rate: float = _f(0.7, "With --league: the win rate that freezes an exploiter into the pool.")
    league_freeze_versions: int = _f(
        200,
        "With --league: the main agent is frozen into the pool every this many versions, an exploiter after this "
        "many at the latest.",
    )
    pbt: bool = _f(
        False,
        "Population-based training over the --num_policies policies: every period the worst "
        "--pbt_replace_fraction take a copy of a better member's weights and optimizer state "
        "(exploit) and mutate their hyperparameters (explore: learning rate, entropy coefficient, "
        "gamma, clip ratio). Members 1.. start from explored hyperparameters.",
    )
    pbt_period_env_steps: int | str = _f(
        "auto",
        "Env steps per policy (on average over the population) between PBT "
        "rounds; 'auto': 20 training batches (--batch_size x "
        "--num_batches_per_epoch x 20).",
        type=int_or_auto,
    )
    pbt_replace_fraction: float = _f(0.3, "Share of the population replaced each round (the worst; at least one).")
    pbt_mutation_rate: float = _f(0.15, "Chance that each hyperparameter of a replaced member is mutated.")
    pbt_resample_prob: float = _f(
        0.25,
        "Chance that a mutation draws the hyperparameter anew from its range "
        "(sf_engine.roles.population.RANGES) instead of perturbing it.",
    )
    pbt_perturb_min: float = _f(
        1.05,
        "A perturbation multiplies or divides a hyperparameter by a factor within "
        "[--pbt_perturb_min, --pbt_perturb_max].",
    )
    pbt_perturb_max: float = _f(1.5, "See --pbt_perturb_min.")
    pbt_replace_reward_gap: float = _f(
        0.1,
        "A member is replaced only when its objective trails the better one's "
        "by this share of the population's objective range.",
    )

    @property
    def pool(self) -> int:
        """Snapshot slots of the opponent pool (0 without one)."""
        return self.pool_size if self.pool_every_versions > 0 or self.league else 0

    @property
    def num_acting(self) -> int:
        """Policies that act: the trained ones (ids 0..num_policies-1), then the pool's snapshots."""
        return self.num_policies + self.pool

    def counts_games(self, agents: tuple) -> bool:
        """Two-player games of more than one acting policy: their games are counted, the players rated and the
        pool's opponents drawn by --opponent_sampling (sf_engine.selfplay)."""
        return self.num_acting > 1 and len(agents) == 2

    def check(self, agents: tuple) -> None:
        """Bad values and combinations: ValueError with one line naming the flag."""
        self.agent_mapping(agents)
        self._check_league(agents)
        if self.pool_every_versions < 0 or self.pool_size < 1:
            raise ValueError("--pool_every_versions must be >= 0 and --pool_size at least 1")
        if not 0.0 < self.pool_share < 1.0:
            raise ValueError(f"--pool_share must be within (0, 1) (got {self.pool_share})")
        if self.pool and len(agents) < 2:
            raise ValueError(
                "--pool_every_versions: an opponent pool needs a multi-agent env (its snapshots play "
                "seats against the learning policies); drop it for a single-agent env"
            )
        if self.opponent_sampling != "uniform" and not self.pool:
            raise ValueError(
                f"--opponent_sampling {self.opponent_sampling} weights the opponent pool's snapshots: give "
                f"--pool_every_versions too (e.g. 10), or drop it"
            )
        if self.pbt and self.num_policies < 2:
            raise ValueError("--pbt needs a population: give --num_policies 2 or more (e.g. 4)")
        if (
            not 0.0 < self.pbt_replace_fraction <= 0.5
            or not 0.0 <= self.pbt_mutation_rate <= 1.0
            or not 0.0 <= self.pbt_resample_prob <= 1.0
        ):
            raise ValueError(
                "--pbt_replace_fraction must be within (0, 0.5], --pbt_mutation_rate and "
                "--pbt_resample_prob within [0, 1]"
            )
        if not 1.0 <= self.pbt_perturb_min <= self.pbt_perturb_max:
            raise ValueError("--pbt_perturb_min and --pbt_perturb_max: need 1 <= min <= max (e.g. 1.05 and 1.5)")
        if self.pbt_period_env_steps != "auto" and self.pbt_period_env_steps < 1:
            raise ValueError("--pbt_period_env_steps must be at least 1, or auto")

    def _check_league(self, agents: tuple) -> None:
        if not self.league:
            return
        if len(agents) != 2 or self.num_policies != len(ROLES):
            raise ValueError(
                f"--league plays two-player games with --num_policies {len(ROLES)} ({', '.join(ROLES)}): "
                + ("give --num_policies 3" if len(agents) == 2 else "the env is not a two-player one")
            )
        clash = [
            flag
            for flag, given in (
                ("--pool_every_versions", self.pool_every_versions > 0),
                ("--opponent_sampling", self.opponent_sampling != "uniform"),
                ("--agent_policies", bool(self.agent_policies)),
                ("--pbt", self.pbt),
            )
            if given
        ]
        if clash:
            raise ValueError(f"--league draws every role's opponents and freezes them itself: drop {clash[0]}")
        if not 0.5 < self.league_freeze_win_rate <= 1.0 or self.league_freeze_versions < 1:
            raise ValueError("--league_freeze_win_rate must be within (0.5, 1] and --league_freeze_versions >= 1")

    def agent_mapping(self, agents: tuple) -> tuple | None:
        """Policy of each agent (in `agents` order) under --agent_policies, or None (random). ValueError
        with one line when the mapping is malformed, names unknown agents or misses one."""
        if not self.agent_policies:
            return None
        mapping = {}
        for item in self.agent_policies.split(","):
            name, sep, policy = item.strip().partition("=")
            if not sep or not policy.strip().isdigit():
                raise ValueError(f"--agent_policies: {item!r} is not AGENT=POLICY (e.g. player_0=0,player_1=1)")
            mapping[name.strip()] = int(policy)
        unknown = sorted(set(mapping) - set(agents))
        missing = [a for a in agents if a not in mapping]
        if unknown or missing:
            raise ValueError(
                f"--agent_policies: the env's agents are {', '.join(agents) or 'none (single-agent env)'}"
                f"; {'unknown ' + ', '.join(unknown) if unknown else 'missing ' + ', '.join(missing)}"
            )
        bad = [p for p in mapping.values() if not 0 <= p < self.num_policies]
        if bad:
            raise ValueError(
                f"--agent_policies: policy {bad[0]} is not within 0..{self.num_policies - 1} "
                f"(--num_policies {self.num_policies})"
            )
        return tuple(mapping[a] for a in agents)
