"""Self-play's maths: the ratings of the players of two-player games (ratings.py) and the choice of the pool's
opponents by the win rates measured so far (sampling.py). It imports nothing else of sf_engine; the learner's part,
which applies them to the games the rollout workers count, is sf_engine.roles.game_measures."""
