"""The code's shape: subpackages by role whose layers hold, files and functions of a readable size, no
import cycles, every family default a flag."""

import ast
import glob
import os
import subprocess
import sys

from conftest import REPO

PACKAGES = {"sf_engine": "sf_engine", "envs": "sf_engine.envs"}  # folder -> the package it installs as
ENVS = "sf_engine.envs"
# what each subpackage may import of sf_engine besides itself: the layers, lowest first. A layer never
# imports one above it: the runtime imports no role and nothing of run/ (it starts the roles by name:
# wiring.ROLES); the model and the algorithms know nothing of the runtime or the roles; the envs and the
# self-play maths (ratings, opponent sampling) know nothing else of sf_engine.
MAY_IMPORT = {
    "envs": set(),
    "selfplay": set(),
    "config": {"selfplay", "envs"},
    "stats": {"config", "selfplay"},
    "model": {"config", "envs"},
    "algo": {"model", "config", "envs"},
    "replay": {"algo", "model", "stats", "config", "envs"},
    "runtime": {"replay", "algo", "stats", "config", "envs"},
    "play": {"runtime", "replay", "algo", "model", "stats", "config", "selfplay", "envs"},
    "roles": {"play", "runtime", "replay", "algo", "model", "stats", "config", "selfplay", "envs"},
    "scaleout": {"roles", "runtime", "replay", "algo", "model", "stats", "config", "selfplay", "envs"},
    "run": {"scaleout", "roles", "play", "runtime", "replay", "algo", "model", "stats", "config", "selfplay", "envs"},
}
TOP_LEVEL = {"sf_engine", "sf_engine.export"}  # the package itself and `python -m sf_engine.export`


def _modules() -> dict:
    """module name -> (source, whether it is a package) of every module of sf_engine (its subpackages
    included) and of envs/."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True):
            relative = os.path.relpath(path, os.path.join(REPO, folder))[:-3].replace(os.sep, ".")
            name = f"{package}.{relative}".removesuffix(".__init__")
            with open(path) as f:
                out[name] = (f.read(), path.endswith("__init__.py"))
    return out


def _imports(modules: dict) -> dict:
    """module -> the modules of the two packages it imports (at the top or inside a function)."""
    graph = {}
    for name, (source, is_package) in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom):
                parts = (name if is_package else name.rpartition(".")[0]).split(".")
                base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
                module = ".".join(part for part in (base, node.module) if part)
                targets |= {module} | {f"{module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _room(module: str) -> str | None:
    """The subpackage (layer) a module lives in: 'envs', 'config', ..., or None at the top."""
    if module.startswith(ENVS):
        return "envs"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or module in {f"sf_engine.{room}" for room in MAY_IMPORT} else None


def test_files_and_functions_stay_small():
    for name, (source, _) in _modules().items():
        assert source.count("\n") <= 400, f"{name}: {source.count(chr(10))} lines"
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno < 60, f"{name}.{node.name}: over 60 lines"


def test_every_module_lives_in_a_subpackage_of_its_role():
    modules = _modules()
    rooms = {_room(name) for name in modules} - {None}
    assert rooms == set(MAY_IMPORT), f"subpackages {sorted(rooms)}, the layers name {sorted(MAY_IMPORT)}"
    assert {name for name in modules if _room(name) is None} == TOP_LEVEL


def test_no_import_cycles_and_the_layers_hold():
    graph = _imports(_modules())

    def reaches(start, target, seen=()):
        return any(nxt == target or (nxt not in seen and reaches(nxt, target, seen + (nxt,))) for nxt in graph[start])

    cycles = [name for name in graph if reaches(name, name)]
    assert not cycles, f"import cycles through {cycles}"
    envs = [m for m in graph if m.startswith(ENVS)]
    assert len(envs) >= 4 and graph[ENVS] >= {f"{ENVS}.registry", f"{ENVS}.spec"}, "the envs imports were not read"
    assert graph["sf_engine.roles.learner"], "the roles' imports were not read"
    crossings = sorted(
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if _room(name)
        and _room(target)
        and _room(target) != _room(name)
        and _room(target) not in MAY_IMPORT[_room(name)]
    )
    assert not crossings, f"imports against the layers: {crossings}"


def test_the_main_process_needs_no_torch_when_nothing_is_measured(tmp_path):
    """Start-up is part of the user's wait: with the sampler's size and the device given, building the
    plan and loading the main process's modules import no torch (the forkserver preloads it for the
    children; --device auto imports it only where the CUDA driver sees a GPU, to ask torch too)."""
    code = (
        "import sys; from sf_engine.run import runner, serial, supervisor; from sf_engine.run.plan import build_plan; "
        "build_plan(['--num_workers', '1', '--num_envs_per_worker', '8', '--device', 'cpu', "
        f"'--train_dir', {str(tmp_path)!r}]); "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_classes_named_by_string_exist_and_sit_where_the_layers_allow():
    """Two tables name classes as "module:Class", imported only where they are built (no import statement
    for the layer test above to read): the runtime's ROLES name the role classes it starts (roles/ and
    scaleout/), each algorithm's spec its learning class (algo/). Each must exist."""
    from sf_engine.config.algorithms import built_in_algorithms
    from sf_engine.runtime.wiring import ROLES, import_class

    for table, rooms in (
        ({name: spec.learner for name, spec in built_in_algorithms().items()}, {"algo"}),
        ({name: role.cls for name, role in ROLES.items()}, {"roles", "scaleout"}),
    ):
        for name, path in table.items():
            assert _room(path.partition(":")[0]) in rooms, (name, path)
            assert isinstance(import_class(path), type), (name, path)


def test_an_algorithms_spec_is_pure_data_of_the_config_layer():
    """sf_engine.config.algorithms finds the built-in specs (sf_engine/algo/<name>/spec.py) by name while the
    configuration is built, in every process: a spec module and its packages import only the config layer (and
    other specs), and no torch."""
    modules = _modules()
    for name, (source, _) in modules.items():
        if name.startswith("sf_engine.algo.") and name.endswith(".spec"):
            for target in _imports(modules)[name]:
                assert target.startswith("sf_engine.config") or target.endswith(".spec"), (name, target)
        if name == "sf_engine.algo" or (name.startswith("sf_engine.algo.") and modules[name][1]):
            imports = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))]
            assert not imports, f"{name}: a spec's package imports nothing"
    code = "import sys, sf_engine.config.groups; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
