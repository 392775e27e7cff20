"""The front door for a plug-in author: every name of sf_engine.__all__ resolves to the engine's own class, the
package imports neither torch nor TensorBoard until one of them is used, an observer's misspelled hook is one line
before anything on disk changes, and a subclass of sf_engine.Observer stops a run."""

import ast
import os
import subprocess
import sys

import pytest
from conftest import REPO, files_of

import sf_engine

PLUG_IN_NAMES = (
    "Algorithm",
    "TrainResult",
    "TrainingHooks",
    "TrajectoryBatch",
    "ReplayBatch",
    "SequenceBatch",
    "AlgorithmSpec",
    "SLOTS",
    "TRANSITIONS",
    "SEQUENCES",
    "Observer",
    "LoadError",
)


def test_every_public_name_resolves_to_the_engines_own():
    from sf_engine.algo import base, batch
    from sf_engine.config import algorithms
    from sf_engine.play import loading
    from sf_engine.stats import observers

    assert set(PLUG_IN_NAMES) <= set(sf_engine.__all__)
    assert len(set(sf_engine.__all__)) == len(sf_engine.__all__)
    for name in sf_engine.__all__:
        assert getattr(sf_engine, name) is not None, name
        assert name in dir(sf_engine), name
    owners = {
        "Algorithm": base,
        "TrainResult": base,
        "TrainingHooks": base,
        "TrajectoryBatch": batch,
        "ReplayBatch": batch,
        "SequenceBatch": batch,
        "AlgorithmSpec": algorithms,
        "SLOTS": algorithms,
        "TRANSITIONS": algorithms,
        "SEQUENCES": algorithms,
        "Observer": observers,
        "LoadError": loading,
    }
    for name, module in owners.items():
        assert getattr(sf_engine, name) is getattr(module, name), name
    assert sf_engine.AlgorithmSpec(learner="m:C", description="d").data == sf_engine.SLOTS
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        sf_engine.NoSuchName  # noqa: B018


def test_load_policy_fails_with_the_one_named_load_error(tmp_path):
    with pytest.raises(sf_engine.LoadError, match="no such experiment directory or checkpoint file") as failed:
        sf_engine.load_policy(str(tmp_path / "nothing"))
    assert type(failed.value).__name__ == "LoadError"


def _imported_after(code: str) -> list:
    """The heavy or lazy modules (torch, TensorBoard, the modules behind the lazy names) a fresh interpreter has
    imported after running `code`."""
    watched = ("torch", "tensorboard", "sf_engine.stats.observers", "sf_engine.algo.base", "sf_engine.play")
    report = f"print(sorted(m for m in sys.modules if m.startswith({watched!r})))"
    out = subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}\n{report}"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_import_sf_engine_imports_no_torch_and_the_plug_in_names_add_none():
    assert _imported_after("import sf_engine") == []
    names = [name for name in PLUG_IN_NAMES if name != "Observer"]
    used = _imported_after(f"import sf_engine\nfor name in {names!r}: getattr(sf_engine, name)")
    assert "torch" not in used and not any(m.startswith("tensorboard") for m in used), used
    assert "sf_engine.algo.base" in used  # the lazy names were resolved, by importing their module
    observer = _imported_after("import sf_engine\nsf_engine.Observer")
    assert "torch" not in observer and "sf_engine.stats.observers" in observer, observer


class Misspelled(sf_engine.Observer):
    def on_reprot(self, figures):
        return True


class DuckTyped:
    def on_report(self, figures):
        return None

    def on_checkpoints(self, path):
        pass


@pytest.mark.parametrize(
    "observer, wrong, closest",
    [(Misspelled(), "on_reprot", "on_report"), (DuckTyped(), "on_checkpoints", "on_checkpoint")],
)
def test_a_misspelled_hook_is_one_line_before_anything_on_disk_changes(tmp_path, observer, wrong, closest):
    (tmp_path / "keep").write_text("x")
    before = files_of(tmp_path)
    with pytest.raises(sf_engine.ConfigError) as refused:
        sf_engine.train(train_dir=str(tmp_path), experiment="x", train_for_env_steps=1, observers=[observer])
    line = str(refused.value)
    assert "\n" not in line
    assert f"observer {type(observer).__name__}.{wrong} is no observer hook" in line, line
    assert line.endswith(f"did you mean {closest}?"), line
    assert files_of(tmp_path) == before and not (tmp_path / "x").exists()


def test_other_methods_and_duck_typed_observers_pass_the_check():
    from sf_engine.stats.observers import HOOKS, check_observers

    class Helpers(sf_engine.Observer):
        def record(self, figures):
            pass

        def _on_private(self):
            pass

        @property
        def on_value(self):  # not a method: read by the observer itself
            raise AssertionError("the check must not read a property")

    class OnlyReport:
        def on_report(self, figures):
            return False

    given = (Helpers(), OnlyReport(), sf_engine.Observer())
    assert check_observers(iter(given)) == list(given)
    base = sf_engine.Observer()
    assert all(getattr(base, hook)(None) is None for hook in HOOKS)  # each hook a no-op


@pytest.mark.e2e
def test_an_observer_subclass_stops_a_serial_run_beside_a_duck_typed_one(tmp_path, shm_dir):
    class StopAt(sf_engine.Observer):
        def __init__(self, env_steps):
            self.env_steps, self.checked = env_steps, 0

        def on_report(self, figures):
            self.checked += 1
            return figures["env_steps"] >= self.env_steps

    class Counter:
        def __init__(self):
            self.reports = []

        def on_report(self, figures):
            self.reports.append(figures["env_steps"])

    stopper, counter = StopAt(2_000), Counter()
    result = sf_engine.train(
        train_dir=str(tmp_path),
        shm_dir=shm_dir,
        experiment="stop",
        mode="serial",
        num_workers=1,
        num_envs_per_worker=8,
        rollout=32,
        batch_size=256,
        train_for_env_steps=10_000_000,
        observers=[stopper, counter],
    )
    assert result.stop_reason == "observer StopAt asked to stop"
    assert 2_000 <= result.summary["env_steps"] < 1_000_000
    assert stopper.checked >= 1 and counter.reports and counter.reports[-1] == result.summary["env_steps"]
    assert os.path.isfile(result.checkpoint)


def test_the_documented_refusal_is_the_one_train_gives(tmp_path):
    with open(os.path.join(REPO, "docs", "api.md")) as f:
        documented = [line for line in f.read().splitlines() if line.startswith("observer StopWhenSolved.on_reprot")]
    StopWhenSolved = type("StopWhenSolved", (sf_engine.Observer,), {"on_reprot": lambda self, figures: True})
    with pytest.raises(sf_engine.ConfigError) as refused:
        sf_engine.train(train_dir=str(tmp_path), train_for_env_steps=1, observers=[StopWhenSolved()])
    assert documented == [str(refused.value)]
