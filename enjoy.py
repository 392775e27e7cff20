#!/usr/bin/env python
"""Replay a trained agent: `python enjoy.py --help` lists every flag (sf_engine/play/enjoy.py)."""

import sys

if __name__ == "__main__":
    from sf_engine.play.enjoy import main

    sys.exit(main())
