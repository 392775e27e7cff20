#!/usr/bin/env python
"""Train an agent: `python train.py --help` lists every flag. Defaults solve CartPole-v1."""

import sys

if __name__ == "__main__":
    from sf_engine.run.runner import main

    sys.exit(main())
