"""`python -m sf_engine.export`: the greedy policy of an experiment to ONNX and TorchScript (sf_engine.play.export)."""

import sys

if __name__ == "__main__":
    from sf_engine.play.export import main

    sys.exit(main())
