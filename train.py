#!/usr/bin/env python
"""Train an agent: `python train.py --help` lists every flag. Defaults solve CartPole-v1."""
import sys


def main(argv=None) -> int:
    from envs import EnvError
    from sf_engine.config import ConfigError, parse_config
    from sf_engine.runner import train

    cfg = parse_config(argv)
    try:
        return train(cfg)
    except (ConfigError, EnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
