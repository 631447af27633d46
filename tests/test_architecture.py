"""The seams a newcomer relies on: core/ in packages by job, no import cycle, layers that import downwards only (core
imports no backend; the benchmark, bench/, sits above them all), and a backend added from outside hydrali (an
installed package's entry point) without touching a task or core."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.plain_torch_spec import install

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"core": "hydrali.core", "tasks": "hydrali.tasks", "backends": "hydrali.backends", "bench": "hydrali.bench"}
# the command lines, on top of everything: they may import any layer (the benchmark builds its framework loops from the
# backends' public builders)
ENTRY_LAYER = ("hydrali.core.cli", "hydrali.bench", "hydrali.core.__main__")
# the one module of core that names a backend's module: the registry's table of the built-in backends' specs (read by
# name, never imported by core itself)
NAMES_BUILT_IN_BACKENDS = "hydrali.core.contracts.registry"


def _modules() -> dict[str, Path]:
    """Every module of hydrali's code folders, by dotted name."""
    found = {}
    for folder, dotted in PACKAGES.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([dotted, *parts])] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(path: Path, modules: dict[str, Path], module: str) -> set[str]:
    """The hydrali modules that `path` (module `module`) imports anywhere in its code (in functions too; not under
    TYPE_CHECKING), relative imports resolved."""
    imported: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            return
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            origin = ".".join(part for part in (base, node.module or "") if part)
            for alias in node.names:
                name = f"{origin}.{alias.name}"
                imported.add(name if name in modules else origin)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in imported if name in modules}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph` (its strongly connected components of more than one module, or self-imports)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules, name) for name, path in modules.items()}


def test_core_is_packages_by_job_and_the_benchmark_lives_in_one():
    assert len(list((REPO / "core").glob("*.py"))) <= 6, sorted(p.name for p in (REPO / "core").glob("*.py"))
    strays = [
        str(p.relative_to(REPO))
        for folder in PACKAGES
        for p in (REPO / folder).rglob("*bench*.py")
        if p.relative_to(REPO).parts[0] != "bench"
    ]
    assert strays == [], f"benchmark modules outside bench/: {strays}"


def test_no_import_cycle(import_graph):
    assert _cycles(import_graph) == []


def test_the_walker_finds_a_cycle():
    """The cycle check itself can fail: a two-module cycle and a self-import are found."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"a"}}) == [["a"]]


def test_layers_import_downwards_only(import_graph):
    """core's library knows no task and no backend (it reaches them through the registry, by name); backends know no
    task and tasks no backend; only the command lines (core.cli, bench) may import any layer."""

    def layer(module: str) -> str:
        return module.split(".")[1]

    wrong = []
    for module, targets in import_graph.items():
        if module.startswith(ENTRY_LAYER):
            continue
        for target in targets:
            if layer(target) != layer(module) and layer(target) != "core":
                wrong.append(f"{module} -> {target}")
            elif layer(module) == "core" and target.startswith(ENTRY_LAYER):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_core_imports_no_backend_and_names_one_only_in_the_registry(import_graph):
    """No module of core, its command lines included, imports a backend's module anywhere in its code (in functions
    too; not under TYPE_CHECKING), and none names one in a string (an import by name, a worker's dotted target) but the
    registry's table of the built-in backends' specs: what drives a backend's modules directly (the benchmark's loops)
    lives above core, in bench/."""
    core = {name: path for name, path in _modules().items() if name.startswith("hydrali.core")}
    imports = sorted(f"{m} -> {t}" for m in core for t in import_graph[m] if t.startswith("hydrali.backends"))
    named = sorted(
        f"{name}:{node.lineno}: {node.value!r}"
        for name, path in core.items()
        if name != NAMES_BUILT_IN_BACKENDS
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "hydrali.backends." in node.value
    )
    assert imports == [], f"core imports backends: {imports}"
    assert named == [], f"core names backends' modules: {named}"


@pytest.fixture()
def plain_backend_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a Python that has backend=plain installed: a backend as a third party would ship it, its
    spec and its plain PyTorch loop (tests/support/plain_torch_spec.py, plain_torch_backend.py) registered by an
    installed distribution's entry point (group hydrali.backends). Nothing of hydrali is edited; it trains
    (tests/test_third_backend.py: as Lightning does)."""
    return install(tmp_path / "site")


def _hydrali(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hydrali.core", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_a_backend_from_an_installed_package_joins_help_and_the_config_checks(plain_backend_env, tmp_path):
    """A backend registered by an entry point, without a file of hydrali changed: --help lists it, its schema checks
    its keys and values, and its own refusal of a setting ends the run in one line (exit code 2). That it trains
    through the run contract is tests/test_third_backend.py's."""
    shown = _hydrali(plain_backend_env, tmp_path, "--help")
    assert shown.returncode == 0, shown.stderr
    groups = next(line for line in shown.stdout.splitlines() if line.startswith("backend:"))
    assert "plain" in groups.split(":", 1)[1].replace(",", " ").split()
    assert any(line.split()[:1] == ["plain"] and "plain PyTorch loop" in line for line in shown.stdout.splitlines())

    typo = _hydrali(plain_backend_env, tmp_path, "backend=plain", "backend.devics=1", "tracking=none")
    assert typo.returncode == 2 and "backend.devics" in typo.stderr and "backend.devices" in typo.stderr, typo.stderr
    refused = _hydrali(
        plain_backend_env, tmp_path, "backend=plain", "backend.devices=2", "tracking=none", "data.size=16"
    )
    assert refused.returncode == 2, refused.stderr
    assert "backend.devices=2: backend=plain trains in one process" in refused.stderr, refused.stderr


def test_a_task_without_a_side_on_the_backends_framework_is_refused_before_any_work(plain_backend_env, tmp_path):
    without = _hydrali(plain_backend_env, tmp_path, "backend=plain", "tracking=none", "~task.sides.torch")
    assert without.returncode == 2, without.stderr
    assert "backend=plain trains torch models but task=classification has no torch side" in without.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*.yaml"))


def test_without_the_package_there_is_no_plain_backend(tmp_path):
    """backend=plain comes from the installed distribution alone: hydrali itself does not know it."""
    shown = _hydrali({**os.environ}, tmp_path, "backend=plain")
    assert shown.returncode == 2 and "backend" in shown.stderr and "plain" in shown.stderr


def test_the_registry_reads_no_framework(plain_backend_env):
    """Reading every backend's spec (what --help and the schema do) imports neither torch nor TensorFlow: hydrali's
    own, and an installed package's (backend=plain's spec lives apart from its torch loop)."""
    probe = textwrap.dedent("""
        import sys
        from hydrali.core.contracts.registry import backend_specs, task_specs
        from hydrali.core.config.store import register_schemas
        register_schemas()
        assert sorted(backend_specs()) == sys.argv[1:], backend_specs()
        assert sorted(task_specs()) == ["classification", "detection"], task_specs()
        loaded = [m for m in ("torch", "tensorflow", "keras", "lightning") if m in sys.modules]
        assert not loaded, loaded
    """)
    for env, backends in ((None, ["keras", "lightning"]), (plain_backend_env, ["keras", "lightning", "plain"])):
        done = subprocess.run(
            [sys.executable, "-c", probe, *backends], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr


def _readme_layout() -> set[str]:
    """The folders the README's layout block lists (an indented entry is a sub-folder of the entry above it)."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("Layout:") :].split("\n\n", 2)[1]
    listed, parent = set(), ""
    for line in block.splitlines():
        entry = line[4:].split(" ", 1)[0] if line.startswith("    ") and line[4:5] != " " else None
        nested = line[6:].split(" ", 1)[0] if line.startswith("      ") and line[6:7] != " " else None
        if entry and entry.endswith("/"):
            parent = entry
            listed.add(entry.rstrip("/"))
        elif nested and nested.endswith("/"):
            listed.add(parent + nested.rstrip("/"))
    return listed


def test_the_readmes_layout_lists_every_package_of_the_tree():
    packages = {
        str(init.parent.relative_to(REPO)) for folder in PACKAGES for init in (REPO / folder).rglob("__init__.py")
    }
    listed = _readme_layout()
    assert packages - {"backends"} <= listed, f"packages the README does not list: {sorted(packages - listed)}"
    assert all((REPO / entry).is_dir() for entry in listed), [e for e in listed if not (REPO / e).is_dir()]


FRAMEWORKS = ("torch", "tensorflow", "keras", "lightning")


def test_core_and_bench_import_no_framework_at_module_level_outside_files_named_by_framework():
    """`hydrali --help` and a Keras run never load torch: core's modules (and the benchmark's) import a framework only
    inside functions, but for the files named by the framework they drive (torch_*.py, keras_*.py), as in tasks/."""
    loaders = []
    for name, path in _modules().items():
        if not name.startswith(("hydrali.core", "hydrali.bench")) or path.name.startswith(("torch_", "keras_")):
            continue
        for node in ast.parse(path.read_text()).body:
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            loaders += [f"{name}: {n}" for n in names if n.split(".")[0] in FRAMEWORKS]
    assert loaders == []


TORCH_PACKAGE = "hydrali.backends.torch"  # what every torch backend shares
LIGHTNING = ("lightning", "pytorch_lightning", "lightning_fabric")


def _imported_names(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports anywhere in its code (in functions too; not under TYPE_CHECKING), with its line:
    absolute names as written (a relative import stays inside hydrali and is left out)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.lineno, node.module or ""))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def test_a_torch_backend_can_be_built_without_lightning(import_graph):
    """backends/torch/ holds what every torch backend shares (DALI's loaders, the task's torch side, optimizer and
    schedule, the trained network and its export), so that a plain-PyTorch backend trains with it alone: none of its
    modules imports Lightning anywhere in its code (in functions too) or another backend's package, and importing
    every one of them loads no Lightning."""
    torch_modules = {
        name: path for name, path in _modules().items() if name == TORCH_PACKAGE or name.startswith(TORCH_PACKAGE + ".")
    }
    assert len(torch_modules) > 1, sorted(torch_modules)
    lightning = sorted(
        f"{name}:{line}: {imported}"
        for name, path in torch_modules.items()
        for line, imported in _imported_names(path)
        if imported.split(".")[0] in LIGHTNING
    )
    assert lightning == [], f"backends/torch imports Lightning: {lightning}"
    other_backends = sorted(
        f"{module} -> {target}"
        for module in torch_modules
        for target in import_graph[module]
        if target.startswith("hydrali.backends.") and not target.startswith(TORCH_PACKAGE)
    )
    assert other_backends == [], f"backends/torch imports another backend: {other_backends}"

    probe = textwrap.dedent(f"""
        import importlib, sys
        for name in {sorted(torch_modules)!r}:
            importlib.import_module(name)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {LIGHTNING!r})
        assert not loaded, loaded
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_the_wheel_lists_every_package_of_the_tree():
    """pyproject.toml names hydrali's packages one by one (its folders map onto one namespace): every folder of
    Python modules and every config group must be there, or an installed hydrali lacks it (an editable install
    would not show it)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {init.parent for folder in PACKAGES for init in (REPO / folder).rglob("__init__.py")}
    folders |= {path.parent for path in (REPO / "conf").rglob("*.yaml")} | {REPO / "conf"}
    tree = set()
    for folder in folders:
        top, *rest = folder.relative_to(REPO).parts
        tree.add(".".join(["hydrali", top, *rest]))
    assert tree - listed == set(), f"packages missing from pyproject.toml: {sorted(tree - listed)}"


def test_a_broken_backend_plugin_is_one_line_naming_it(tmp_path):
    """An installed package whose entry point cannot be loaded ends every command in one line that names it."""
    site = tmp_path / "site"
    dist_info = site / "hydrali_broken_backend-0.1.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: hydrali-broken-backend\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[hydrali.backends]\nbroken = hydrali_no_such_module:SPEC\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    shown = _hydrali(env, tmp_path, "--help")
    assert shown.returncode == 2, shown.stderr
    lines = shown.stderr.strip().splitlines()
    assert len(lines) == 1 and "'broken'" in lines[0] and "hydrali_no_such_module" in lines[0], shown.stderr


def test_no_backend_module_reads_the_hydra_config():
    """A backend trains from core's typed run contract (core/contracts/run.py) and reads its own settings from an
    instance of its schema: no module under backends/ imports OmegaConf or Hydra (beyond the exception type a task's
    builder raises), and none takes or names a `cfg`."""
    found = []
    for name, path in _modules().items():
        if not name.startswith("hydrali.backends."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                imported = [node.module or ""]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                imported = []
            found += [
                f"{name} imports {m}"
                for m in imported
                if m.split(".")[0] == "omegaconf" or (m.split(".")[0] == "hydra" and m != "hydra.errors")
            ]
            if isinstance(node, ast.arg) and node.arg == "cfg" or isinstance(node, ast.Name) and node.id == "cfg":
                found.append(f"{name}:{node.lineno} names cfg")
    assert not found, found


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module's, class's and function's bodies."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _named_in_core(words: set[str], modules: dict[str, Path] | None = None) -> list[str]:
    """Where a string literal of core's code (`modules`: hydrali's; docstrings aside) is one of `words`, or a module
    path of a backend or a task, but in the registry's table of the built-in specs."""
    found = []
    for name, path in (_modules() if modules is None else modules).items():
        if not name.startswith("hydrali.core") or name == NAMES_BUILT_IN_BACKENDS:
            continue
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                value = node.value
                if value in words or value.startswith(("hydrali.backends", "hydrali.tasks")):
                    found.append(f"{path.name}:{node.lineno}: {value!r}")
    return found


def test_core_names_no_backend_task_or_framework_and_no_backends_own_setting():
    """What a backend, a task or a framework knows stays with it (its spec, its task or backend code): no string of
    core's code is a backend's name, a task's, a framework's, or a setting that one backend's schema has and another's
    lacks (Lightning's channels_last, Keras' xla_cache); core reads each through the registry's specs."""
    import dataclasses

    from hydrali.core.contracts.registry import backend_specs, task_specs

    specs = backend_specs()
    keys = {name: {f.name for f in dataclasses.fields(spec.schema)} for name, spec in specs.items()}
    own_keys = set().union(*keys.values()) - set.intersection(*keys.values())
    names = set(specs) | set(task_specs()) | {spec.framework for spec in specs.values()} | {"tensorflow"}
    assert {"channels_last", "ddp_bucket_mb", "compile_cache", "xla_cache"} <= own_keys  # the rule sees them
    assert _named_in_core(own_keys | names) == []


def test_the_name_check_finds_a_backend_named_in_core(tmp_path):
    """The check itself can fail: a core module comparing a framework with "keras" and naming "channels_last" is
    found (planted in a copy of core's module list), and a docstring naming them is not."""
    planted = tmp_path / "planted.py"
    body = '    """Names keras."""\n    return framework == "keras" or backend["channels_last"]\n'
    planted.write_text("def f(framework, backend):\n" + body)
    found = _named_in_core({"keras", "channels_last"}, {"hydrali.core.run.planted": planted})
    assert found == ["planted.py:3: 'keras'", "planted.py:3: 'channels_last'"]


def test_every_network_check_a_task_declares_names_a_builder_and_a_check_that_exist():
    """A renamed builder or check would silently turn a task's layout check off (core looks the builder up by name)."""
    from hydra.utils import get_method

    from hydrali.core.contracts.registry import task_specs

    for spec in task_specs().values():
        for builder, check in spec.network_checks.items():
            assert callable(get_method(builder)) and callable(get_method(check)), (spec.name, builder, check)
