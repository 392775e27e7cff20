"""Experience replay: the shared-memory buffer of transitions, its prioritized sampling structure and the rate
limiter that holds the replay ratio. Runs in the learner process."""
