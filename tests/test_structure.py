"""The code's shape: files and functions of a readable size, no import cycles, and the layering the
design asks for (envs never imports sf_engine; the model and envs know nothing of the shared buffers)."""
import ast
import glob
import os
import subprocess
import sys

from conftest import REPO

PACKAGES = {"sf_engine": "sf_engine", "envs": "sf_engine.envs"}  # folder -> the package it installs as
ENVS = "sf_engine.envs"


def _modules() -> dict:
    """module name -> parsed source of every module of the two packages."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in glob.glob(os.path.join(REPO, folder, "*.py")):
            name = f"{package}.{os.path.basename(path)[:-3]}".removesuffix(".__init__")
            with open(path) as f:
                out[name] = f.read()
    return out


def _imports(modules: dict) -> dict:
    """module -> the modules of the two packages it imports (at the top or inside a function)."""
    graph = {}
    for name, source in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom):
                package = name if name in PACKAGES.values() else name.rpartition(".")[0]
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
                module = ".".join(part for part in (base, node.module) if part)
                targets |= {module} | {f"{module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def test_files_and_functions_stay_small():
    for name, source in _modules().items():
        assert source.count("\n") <= 400, f"{name}: {source.count(chr(10))} lines"
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno < 60, f"{name}.{node.name}: over 60 lines"


def test_no_import_cycles_and_the_layers_hold():
    graph = _imports(_modules())

    def reaches(start, target, seen=()):
        return any(nxt == target or (nxt not in seen and reaches(nxt, target, seen + (nxt,))) for nxt in graph[start])

    cycles = [name for name in graph if reaches(name, name)]
    assert not cycles, f"import cycles through {cycles}"
    envs = [m for m in graph if m.startswith(ENVS)]
    assert len(envs) >= 4 and graph[ENVS] >= {f"{ENVS}.registry", f"{ENVS}.spec"}, "the envs imports were not read"
    assert not [(m, t) for m in envs for t in graph[m] if not t.startswith(ENVS)]
    for name in ["sf_engine.model"] + envs:
        assert "sf_engine.shared_buffers" not in graph[name], name


def test_the_main_process_needs_no_torch_when_nothing_is_measured(tmp_path):
    """Start-up is part of the user's wait: with the sampler's size and the device given, building the
    plan and loading the main process's modules import no torch (the forkserver preloads it for the
    children; --device auto imports it only where the CUDA driver sees a GPU, to ask torch too)."""
    code = ("import sys; from sf_engine import runner, supervisor, serial; from sf_engine.plan import build_plan; "
            "build_plan(['--num_workers', '1', '--num_envs_per_worker', '8', '--device', 'cpu', "
            f"'--train_dir', {str(tmp_path)!r}]); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout
