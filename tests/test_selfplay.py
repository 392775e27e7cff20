"""Self-play that measures itself (sf_engine.selfplay): ratings against openskill's own numbers and on players of
known strength, the win rates and --opponent_sampling's weights, the workers drawing the pool by them, and the
ratings in a run's figures and through a resume."""

import json

import numpy as np
import pytest

from sf_engine.selfplay.ratings import DRAW, LOSS, WIN, Ratings, outcomes, round_robin
from sf_engine.selfplay.sampling import WINDOW_GAMES, WinRates, sampling_weights

openskill = pytest.importorskip("openskill.models")


def test_ratings_are_openskills_own_game_by_game():
    model = openskill.PlackettLuce()
    a, b, c = model.rating(), model.rating(), model.rating()
    ratings = Ratings(3)
    for first, second, outcome in [(0, 1, WIN), (1, 2, DRAW), (2, 0, LOSS), (0, 2, WIN)]:
        ratings.rate(first, second, outcome)
    [[a], [b]] = model.rate([[a], [b]], ranks=[0, 1])
    [[b], [c]] = model.rate([[b], [c]], ranks=[0, 0])
    [[c], [a]] = model.rate([[c], [a]], ranks=[1, 0])
    [[a], [c]] = model.rate([[a], [c]], ranks=[0, 1])
    for player, expected in enumerate([a, b, c]):
        assert (ratings[player].mu, ratings[player].sigma) == pytest.approx((expected.mu, expected.sigma), rel=1e-12)
    assert [ratings[p].games for p in range(3)] == [3, 2, 3]
    assert ratings[0].ordinal == pytest.approx(a.mu - 3 * a.sigma)


def test_counted_games_are_each_rated_once_from_the_side_they_were_won():
    """The workers count each game at [i, j] and [j, i]: 3 wins of 0 over 1 and a draw are 4 games, 0 ahead."""
    results = np.zeros((2, 2, 3))
    results[0, 1] = [3, 1, 0]
    results[1, 0] = [0, 1, 3]
    ratings = Ratings(2)
    assert ratings.rate_counts(results, np.random.default_rng(0)) == 4
    assert ratings[0].mu > 25 > ratings[1].mu and ratings[0].games == ratings[1].games == 4


def test_outcomes_are_the_first_players_and_loss_minus_them_the_seconds():
    first, second = np.array([1.0, 0.0, -1.0]), np.array([-1.0, 0.0, 1.0])
    assert outcomes(first, second).tolist() == [WIN, DRAW, LOSS]
    assert (LOSS - outcomes(first, second)).tolist() == outcomes(second, first).tolist()


def test_a_copied_player_starts_where_its_source_is_with_no_games():
    ratings = Ratings(3)
    for _ in range(5):
        ratings.rate(0, 1, WIN)
    ratings.copy(0, 2)
    assert (ratings[2].mu, ratings[2].sigma, ratings[2].games) == (ratings[0].mu, ratings[0].sigma, 0)


def test_ratings_survive_their_state():
    ratings = Ratings(2)
    ratings.rate(0, 1, WIN)
    again = Ratings(2)
    again.load(json.loads(json.dumps(ratings.state())))  # numbers only
    assert (again[0], again[1]) == (ratings[0], ratings[1])


@pytest.mark.parametrize(
    "how, expected",
    [
        ("uniform", [1 / 3, 1 / 3, 1 / 3]),
        ("pfsp", [0.8 / 1.5, 0.5 / 1.5, 0.2 / 1.5]),
        ("pfsp_hard", [0.64 / 0.93, 0.25 / 0.93, 0.04 / 0.93]),
        ("pfsp_var", [0.16 / 0.57, 0.25 / 0.57, 0.16 / 0.57]),
    ],
)
def test_pfsp_weights_for_given_win_rates(how, expected):
    assert sampling_weights(np.array([0.2, 0.5, 0.8]), how) == pytest.approx(expected)


def test_a_pool_that_is_always_beaten_is_drawn_alike():
    assert sampling_weights(np.ones(4), "pfsp") == pytest.approx([0.25] * 4)


def test_win_rates_start_even_follow_the_recent_games_and_reset_for_a_new_snapshot():
    rates = WinRates(2, 2)
    rates.add(0, 1, np.array([1, 0, 0]))
    assert 0.5 < rates.rate[0, 1] < 0.7  # one game does not make it 1: the 0.5 it starts at counts for a few
    rates.add(0, 1, np.array([0, 0, 10 * WINDOW_GAMES]))
    assert rates.rate[0, 1] < 0.01  # the losses of the last window outweigh the win before
    rates.add(0, 1, np.array([WINDOW_GAMES, 0, 0]))
    assert 0.55 < rates.rate[0, 1] < 0.7  # the last WINDOW_GAMES games weigh about 1 - 1/e
    rates.add(1, 1, np.array([0, 4, 0]))
    rates.reset(1)
    assert rates.rate[:, 1].tolist() == [0.5, 0.5] and rates.games[:, 1].tolist() == [0, 0]
    rates.add(0, 0, np.array([3, 0, 0]))
    rates.add(1, 0, np.array([3, 0, 0]))
    rates.reset_row(1)
    assert rates.rate[1].tolist() == [0.5, 0.5] and rates.rate[0, 0] > 0.5  # the other row keeps its own


def _lookahead(observation, rng=np.random.default_rng(5)):
    """Stronger than the heuristic by construction: it wins and blocks as it does, never drops a piece under the
    opponent's winning square, and prefers the centre."""
    from sf_engine.envs.opponents import _drop_row, _wins, connect_four_tactics

    wins, blocks = connect_four_tactics(observation)
    if wins or blocks:
        return (wins or blocks)[0]
    planes = np.asarray(observation["observation"])
    board = planes[:, :, 0] + planes[:, :, 1]
    legal = np.flatnonzero(observation["action_mask"])
    safe = [c for c in legal if _drop_row(board, c) == 0 or not _wins(planes[:, :, 1], _drop_row(board, c) - 1, c)]
    choices = safe or list(legal)
    nearest = min(abs(c - 3) for c in choices)
    return int(rng.choice([c for c in choices if abs(c - 3) == nearest]))


def _random(observation, rng=np.random.default_rng(6)):
    return int(rng.choice(np.flatnonzero(observation["action_mask"])))


def test_the_ratings_recover_a_known_order_of_strength():
    """Random, the heuristic and a lookahead player, round robin with the seats swapped: rated game by game, they
    come out in that order, each apart from the next by more than the ratings' uncertainty."""
    connect_four = pytest.importorskip("pettingzoo.classic.connect_four_v3")
    from sf_engine.envs.opponents import connect_four_heuristic, play_game

    players, env = [_random, connect_four_heuristic, _lookahead], connect_four.env()
    ratings, results = round_robin(
        3, 40, lambda first, second, game: play_game(env, players[first], players[second], game)
    )
    assert results.sum() == 2 * 3 * 40 and (results[:, :, WIN] == results.transpose(1, 0, 2)[:, :, LOSS]).all()
    order = sorted(range(3), key=lambda p: ratings[p].mu)
    assert order == [0, 1, 2], [ratings[p] for p in range(3)]
    for weaker, stronger in [(0, 1), (1, 2)]:
        assert ratings[stronger].mu - ratings[weaker].mu > ratings[stronger].sigma + ratings[weaker].sigma


def test_opponent_sampling_needs_a_pool(tmp_path, capsys):
    from conftest import main_error

    from sf_engine.run.runner import main

    argv = ["--train_dir", str(tmp_path), "--env", "toy_multiagent:relay_game", "--opponent_sampling", "pfsp"]
    line = main_error(main, argv, capsys)
    assert "--opponent_sampling" in line and "--pool_every_versions" in line, line


def test_the_workers_draw_the_pool_by_the_learners_chances_and_count_the_games(tmp_path, shm_dir):
    """RelayGame with a pool of two snapshots and pfsp: once the learning policy is found to beat snapshot 1 always
    and to lose to snapshot 0, new games against the pool are all against snapshot 0; every game is counted for
    both its players, and rated."""
    pytest.importorskip("pettingzoo")
    from conftest import SerialRun, serial_plan

    flags = ["--pool_every_versions", "1", "--pool_size", "2", "--pool_share", "0.9", "--opponent_sampling", "pfsp"]
    sizes = ["--num_envs_per_worker", "16", "--batch_size", "128"]
    plan = serial_plan(tmp_path, shm_dir, "toy_multiagent:relay_game", *flags, *sizes)
    harness = SerialRun(plan, tmp_path)
    try:
        learner = harness.learner
        measures = learner.population.measures
        learner.train_on(harness.full_slots(plan.cfg.slots_per_batch)[: plan.cfg.slots_per_batch])
        assert harness.buffers.opponent_weights[1:].tolist() == [1.0, 0.0]  # one snapshot taken: it alone is drawn
        for _ in range(2):
            learner.train_on(harness.full_slots(plan.cfg.slots_per_batch)[: plan.cfg.slots_per_batch])
        assert min(learner.population.snapshot_versions) > 0
        measures.win_rates.rate[0, 1:] = [0.0, 1.0]
        measures._weigh()
        assert harness.buffers.opponent_weights[1:].tolist() == [1.0, 0.0]
        for _ in range(3):  # not trained (a snapshot would be taken); RelayGame's games are 4 moves: the games of
            slots = harness.full_slots(plan.cfg.slots_per_batch)  # the last slots all started after
            harness.queues.free_slots.put_many(slots)
        ids = harness.buffers.policy_id[slots]
        assert (ids == 1).any() and not (ids == 2).any(), np.unique(ids)
        results = harness.buffers.game_results.sum(0)
        assert results.sum() > 0 and np.array_equal(results, results.transpose(1, 0, 2)[..., ::-1])
        measures.last = 0.0
        figures = measures.measure_when_due(learner.population.versions())
        assert figures.games == int(np.triu(results.sum(-1), 1).sum())
        assert [p.name for p in figures.players] == ["policy_0", "pool_0", "pool_1"]
    finally:
        harness.close()


@pytest.mark.e2e
def test_a_two_player_run_reports_its_ratings_and_keeps_them_through_a_resume(tmp_path, shm_dir):
    """A Connect Four run with a pool: summary.json's ratings (the policy and every snapshot taken, their games
    and chances); run again with a larger budget, it goes on from the ratings it had (the games rated before
    count), and the checkpoint holds them as numbers."""
    pytest.importorskip("pettingzoo")
    import torch

    import sf_engine

    run = dict(
        env="pettingzoo.classic.connect_four_v3:env",
        experiment="rated",
        train_dir=str(tmp_path),
        shm_dir=shm_dir,
        num_workers=1,
        num_envs_per_worker=32,
        pool_every_versions=2,
        pool_size=3,
        opponent_sampling="pfsp_var",
        eval_every_sec=0,
    )
    first = sf_engine.train(train_for_env_steps=40_000, **run).summary["ratings"]
    assert first[0]["name"] == "policy_0" and first[0]["games"] > 0, first
    pool = [p for p in first if p["name"].startswith("pool_")]
    assert pool and sum(p["chance"] for p in pool) == pytest.approx(1.0, abs=1e-6), first  # over those taken
    result = sf_engine.train(train_for_env_steps=80_000, **run)
    second = result.summary["ratings"]
    assert second[0]["games"] > first[0]["games"], (first, second)
    saved = torch.load(result.summary["checkpoint"], weights_only=True)
    assert saved["selfplay"]["ratings"]["games"][0] > first[0]["games"], saved["selfplay"]


def test_the_leagues_roles_draw_their_opponents_as_alphastar_does():
    from sf_engine.selfplay.league import EMPTY, match_chances

    # players: main agent, main exploiter, league exploiter; pool: a main agent snapshot, a main exploiter one, empty
    sources = np.array([0, 1, 2, 0, 1, EMPTY])
    rates = np.full((3, 6), 0.5)
    rates[0, 3:5] = [0.8, 0.2]  # the main agent beats its own snapshot, loses to the exploiter's
    rates[1, 0] = 0.3  # the main exploiter still wins 30% against the main agent
    rates[2, 3:5] = [0.5, 0.9]
    chances = match_chances(rates, sources)
    assert chances.sum(1) == pytest.approx([1.0, 1.0, 1.0]) and not chances[:, 5].any()  # the empty slot never
    hard_all = np.array([0.04, 0.64]) / 0.68  # (1 - x)^2 over both snapshots
    assert chances[0, :3] == pytest.approx([0.35, 0, 0])
    assert chances[0, 3:5] == pytest.approx(0.5 * hard_all + 0.15 * np.array([0.0, 1.0]))  # its own beaten: not hard
    assert chances[1].tolist() == [1.0, 0, 0, 0, 0, 0]  # the exploiter against the main agent as it is
    rates[1, 0] = 0.05
    assert match_chances(rates, sources)[1].tolist() == [0, 0, 0, 1.0, 0, 0]  # below 10%: the main agent's snapshot
    assert chances[2, 3:5] == pytest.approx(np.array([0.25, 0.01]) / 0.26)
    alone = match_chances(np.full((3, 6), 0.5), np.array([0, 1, 2, EMPTY, EMPTY, EMPTY]))
    assert alone.tolist() == [[1.0, 0, 0, 0, 0, 0]] * 3  # no snapshot yet: everybody plays the main agent


def test_an_exploiter_is_frozen_by_its_win_rate_or_its_versions_the_main_agent_by_its_versions():
    from sf_engine.selfplay.league import FREEZE_MIN_GAMES, LEAGUE_EXPLOITER, MAIN_AGENT, MAIN_EXPLOITER, freeze_due

    for exploiter in (MAIN_EXPLOITER, LEAGUE_EXPLOITER):
        assert freeze_due(exploiter, np.array([70, 0, 30]), 5, 0.7, 200)
        assert freeze_due(exploiter, np.array([60, 20, 20]), 5, 0.7, 200)  # a draw counts half
        assert not freeze_due(exploiter, np.array([69, 0, 31]), 5, 0.7, 200)
        assert not freeze_due(exploiter, np.array([FREEZE_MIN_GAMES - 1, 0, 0]), 5, 0.7, 200)  # too few to judge
        assert freeze_due(exploiter, np.array([0, 0, 0]), 200, 0.7, 200)
    assert not freeze_due(MAIN_AGENT, np.array([100, 0, 0]), 199, 0.7, 200)
    assert freeze_due(MAIN_AGENT, np.array([0, 0, 100]), 200, 0.7, 200)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--league"], ["--league", "--num_policies 3"]),
        (["--league", "--num_policies", "3", "--pool_every_versions", "5"], ["--league", "drop --pool_every_versions"]),
        (["--opponent_sampling", "pfsp"], ["--opponent_sampling", "--pool_every_versions"]),
        (
            ["--league", "--num_policies", "3", "--num_remote_samplers", "2", "--ray_address", "local"],
            ["--league", "sampler nodes", "--num_remote_samplers"],
        ),
    ],
)
def test_league_and_opponent_sampling_flags_that_do_not_fit_are_one_line(tmp_path, capsys, flags, words):
    from conftest import main_error

    from sf_engine.run.runner import main

    line = main_error(main, ["--train_dir", str(tmp_path), "--env", "toy_multiagent:relay_game", *flags], capsys)
    assert all(word in line for word in words), line


def test_a_league_in_serial_mode_freezes_its_players_plays_each_roles_opponents_and_resumes(tmp_path, shm_dir):
    """RelayGame, a league frozen every 2 versions: each role's snapshots join the pool with their source, the main
    exploiter starts over from its first weights once frozen, every game is led by a trained player against an
    opponent its chances allow, and the population's state (pool, sources, freezes, payoff) comes back whole."""
    pytest.importorskip("pettingzoo")
    import torch
    from conftest import SerialRun, serial_plan

    from sf_engine.selfplay.league import MAIN_EXPLOITER, ROLES

    flags = ["--league", "--num_policies", "3", "--league_freeze_versions", "2", "--pool_size", "6"]
    sizes = ["--num_envs_per_worker", "16", "--batch_size", "128"]
    plan = serial_plan(tmp_path, shm_dir, "toy_multiagent:relay_game", *flags, *sizes)
    harness = SerialRun(plan, tmp_path)
    try:
        learner, population = harness.learner, harness.learner.population
        first = {k: v.clone() for k, v in population.first_states[MAIN_EXPLOITER]["model"].items()}
        for _ in range(8):
            learner.train_on(harness.full_slots(plan.cfg.slots_per_batch)[: plan.cfg.slots_per_batch])
        measures = population.measures
        sources = measures.sources[3:].tolist()
        assert set(sources) == {0, 1, 2}, sources  # every role was frozen
        exploiter = learner.policies[MAIN_EXPLOITER]
        assert exploiter.min_version > 0 and population.frozen_at[MAIN_EXPLOITER] > 0
        chances = harness.buffers.match_chances
        assert chances.sum(1) == pytest.approx([1.0] * 3)
        chances[:] = 0.0
        chances[[0, 1, 2], [3, 0, 4]] = 1.0  # main agent -> slot 0, main exploiter -> main agent, league exp. -> slot 1
        for _ in range(3):  # not trained (the learner would weigh them again); the games of the last slots are new
            slots = harness.full_slots(plan.cfg.slots_per_batch)
            harness.queues.free_slots.put_many(slots)
        ids = harness.buffers.policy_id[slots][:, -1].reshape(-1, 2)  # each game's two players
        pairs = {tuple(sorted(pair)) for pair in ids.tolist()}
        assert pairs <= {(0, 3), (0, 1), (2, 4)} and len(pairs) == 3, pairs
        measures.last = 0.0
        measures.measure_when_due(population.versions())
        assert len(measures.payoff.players) > 3 and measures.payoff.results.sum() > 0
        trained = {p for p in measures.payoff.players if "@v" not in p}
        restarted = {f"{role}#{g}" for role in ROLES[1:] for g in range(2, 9)}
        assert set(ROLES) < trained <= set(ROLES) | restarted and "main_exploiter#2" in trained, trained
        torch.save(population.state(), tmp_path / "league.pt")  # as a checkpoint keeps it, and reads it back
        state = torch.load(tmp_path / "league.pt", weights_only=True)
    finally:
        harness.close()
    (tmp_path / "again").mkdir()
    again = SerialRun(plan, tmp_path / "again")
    try:
        population = again.learner.population
        population.load(state)
        assert population.measures.sources.tolist() == measures.sources.tolist()
        assert population.frozen_at == state["league"]["frozen_at"]
        assert population.measures.payoff.players == measures.payoff.players
        assert population.measures.names == measures.names
        kept = population.first_states[MAIN_EXPLOITER]["model"]
        assert all(torch.equal(kept[key], value) for key, value in first.items())
    finally:
        again.close()
