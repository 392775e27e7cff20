"""The figures of a two-player run's ratings (sf_engine.selfplay, reported by the learner as stats.messages.Ratings):
TensorBoard scalars, summary.json's `ratings`, the status line's part. Each takes the latest report or None."""

from __future__ import annotations

import dataclasses

from sf_engine.stats.messages import Ratings


def ratings_scalars(ratings: Ratings | None) -> dict:
    """ratings/<player>/{mu,sigma,ordinal} of the trained policies; the pool's spread (its best and worst mu) and,
    for each snapshot slot, the learning policies' win rate against it and its chance to be drawn."""
    if ratings is None:
        return {}
    out = {"ratings/games": ratings.games}
    pool = [p for p in ratings.players if p.frozen]
    for player in ratings.players:
        if player.mu is not None and not player.frozen:
            out.update({f"ratings/{player.name}/{key}": getattr(player, key) for key in ("mu", "sigma", "ordinal")})
    for player in pool:
        if player.win_rate is not None:  # a plain pool's snapshot: the learning policies' win rate, its chance
            out.update(
                {f"ratings/{player.name}/win_rate": player.win_rate, f"ratings/{player.name}/chance": player.chance}
            )
    rated = [p.mu for p in pool if p.mu is not None]
    if rated:
        out.update({"ratings/pool_best_mu": max(rated), "ratings/pool_worst_mu": min(rated)})
    return out


def ratings_summary(ratings: Ratings | None) -> list | None:
    """summary.json's `ratings`: every player's figures (PlayerRating's fields), or None."""
    return None if ratings is None else [dataclasses.asdict(player) for player in ratings.players]


def ratings_status(ratings: Ratings | None) -> str:
    """' | rating policy_0 27.3±1.1 vs pool 22.0..26.9 (12,345 games)', or '' before any game was rated."""
    if ratings is None or not ratings.games:
        return ""
    trained = [p for p in ratings.players if not p.frozen and p.mu is not None]
    pool = [p.mu for p in ratings.players if p.frozen and p.mu is not None]
    line = " | rating " + " ".join(f"{p.name} {p.mu:.1f}±{p.sigma:.1f}" for p in trained)
    if pool:
        line += f" vs pool {min(pool):.1f}..{max(pool):.1f}"
    return line + f" ({ratings.games:,} games)"
