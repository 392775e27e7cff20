"""sf_engine: a single-node, high-throughput, shared-memory reinforcement-learning engine."""

__version__ = "0.1.0"
