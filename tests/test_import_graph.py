"""The package's modules import each other without a cycle, within ARCHITECTURE.md's
layers, and an underscored module only from where it sits.

The graph is read from the source with ``ast``: every import statement counts, the ones
inside functions too (a lazy import still ties the two modules together), except those
under ``if TYPE_CHECKING:``, which never run.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import trainer_resume

PACKAGE = Path(trainer_resume.__file__).resolve().parent
NAME = "trainer_resume"
ROOT = PACKAGE.parent
ARCHITECTURE = ROOT / "ARCHITECTURE.md"


def _module_name(path: Path) -> str:
    parts = [NAME, *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports by name."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        if node.level:
            anchor = module.split(".")
            anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
            base = ".".join([*anchor, node.module] if node.module else anchor)
        else:
            base = node.module or ""
        for alias in node.names:
            # `from package import submodule` names the submodule; any other name is the
            # package's own (its __init__ must have run).
            submodule = f"{base}.{alias.name}"
            targets.add(submodule if submodule in modules else base)
    return {target for target in targets if target in modules and target != module}


@functools.cache  # read once per session: several tests walk the same source
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {module: _imported(module, path, modules) for module, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_graph_sees_function_level_and_relative_imports():
    graph = _graph()
    # cli/arguments/ imports each subcommand inside its run() only.
    assert "trainer_resume.cli.demo" in graph["trainer_resume.cli.arguments.demo"]
    assert "trainer_resume.cli.inspect" in graph["trainer_resume.cli.arguments.inspect"]
    assert "trainer_resume.cli._common" in graph["trainer_resume.cli.inspect"]
    assert "trainer_resume.checkpoint_files" in graph["trainer_resume.cli.inspect"]


def test_the_cycle_finder_reports_a_loop_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_type_checking_imports_are_not_edges():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import x\nelse:\n    import y\n"
    )
    assert [ast.unparse(node) for node in _import_nodes(tree)] == [
        "import y",
        "from typing import TYPE_CHECKING",
    ]


def test_package_has_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(group) for group in cycles)


# ----------------------------------------------------------------------- the layers

_HEADING = re.compile(r"^## (\d+)\. .*\(imports (nothing of the package|layers? (\d+)(?:-(\d+))?)")
_ENTRY = re.compile(r"\*\*`([^`]+\.py)`\*\*")


class Layers:
    """ARCHITECTURE.md's layers: each module's layer and what each layer may import."""

    def __init__(self, text: str) -> None:
        self.of: dict[str, int] = {}  # module -> its layer
        self.imports: dict[int, set[int]] = {}  # layer -> the layers it may import
        self.placed_twice: list[str] = []
        layer = None
        for line in text.splitlines():
            if line.startswith("## "):
                match = _HEADING.match(line)
                assert match, f"ARCHITECTURE.md: a layer heading must say what it imports: {line}"
                layer = int(match.group(1))
                if match.group(2) == "nothing of the package":
                    self.imports[layer] = set()
                else:
                    first = int(match.group(3))
                    self.imports[layer] = {layer, *range(first, int(match.group(4) or first) + 1)}
                continue
            for path in _ENTRY.findall(line):
                module = _module_name(PACKAGE / path)
                if module in self.of:
                    self.placed_twice.append(module)
                assert layer is not None, f"ARCHITECTURE.md: {path} comes before the first layer"
                self.of[module] = layer


def _layer_violations(graph: dict[str, set[str]], layers: Layers) -> list[str]:
    """Each import of a module outside its layer and the layers its heading names."""
    return [
        f"{module} (layer {layers.of[module]}) imports {target} (layer {layers.of[target]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layers.of[target] not in layers.imports[layers.of[module]]
    ]


def _privacy_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import of an underscored module of a subpackage from outside that subpackage."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            owner, _, name = target.rpartition(".")
            if (
                name.startswith("_")
                and owner != NAME
                and not (module + ".").startswith(owner + ".")
            ):
                found.append(f"{module} imports {target}, private to {owner}")
    return found


def _layers() -> Layers:
    return Layers(ARCHITECTURE.read_text(encoding="utf-8"))


def test_every_module_has_one_entry_in_one_layer_of_architecture_md():
    layers = _layers()
    modules = set(_modules())
    assert not layers.placed_twice, f"placed in two layers: {layers.placed_twice}"
    assert not modules - set(layers.of), (
        f"give these a bullet in a layer: {modules - set(layers.of)}"
    )
    assert not set(layers.of) - modules, f"bullets of no module: {set(layers.of) - modules}"


def test_each_layer_imports_only_layers_above_it():
    for layer, imported in _layers().imports.items():
        assert all(other <= layer for other in imported), f"layer {layer} imports {imported}"


def test_every_import_stays_within_the_layers_of_architecture_md():
    violations = _layer_violations(_graph(), _layers())
    assert not violations, "imports against ARCHITECTURE.md's layers:\n" + "\n".join(violations)


def test_an_underscored_module_of_a_subpackage_is_imported_only_from_inside_it():
    violations = _privacy_violations(_graph())
    assert not violations, "\n".join(violations)


def test_the_package_top_level_keeps_at_most_six_underscored_modules():
    underscored = sorted(
        path.name
        for path in PACKAGE.iterdir()
        if path.name.startswith("_")
        and path.name not in ("__init__.py", "__main__.py", "__pycache__")
    )
    assert len(underscored) <= 6, f"group these into a package of their own: {underscored}"


def test_the_examples_import_no_underscored_module():
    modules = _modules()
    private = [
        f"{path.name} imports {target}"
        for path in sorted((ROOT / "examples").glob("*.py"))
        for target in sorted(_imported(f"examples.{path.stem}", path, modules))
        if any(part.startswith("_") and part != "__main__" for part in target.split(".")[1:])
    ]
    assert not private, private


def test_the_layer_check_reports_an_import_from_a_lower_layer_and_from_a_sibling():
    layers = Layers(
        "## 1. Bottom (imports nothing of the package)\n- **`errors.py`**: x\n"
        "## 2. Files (imports layer 1)\n- **`durable/__init__.py`**: x\n- **`rng.py`**: x\n"
        "## 3. Trainer (imports layers 1-2)\n- **`mixin/__init__.py`**: x\n"
        "## 4. Loaders (imports layers 1-2)\n- **`loaders/__init__.py`**: x\n"
    )
    graph = {
        "trainer_resume.errors": {"trainer_resume.rng"},  # upward from layer 1
        "trainer_resume.durable": {"trainer_resume.errors", "trainer_resume.rng"},
        "trainer_resume.rng": set(),
        "trainer_resume.mixin": {"trainer_resume.loaders"},  # a sibling layer
        "trainer_resume.loaders": {"trainer_resume.durable"},
    }
    assert _layer_violations(graph, layers) == [
        "trainer_resume.errors (layer 1) imports trainer_resume.rng (layer 2)",
        "trainer_resume.mixin (layer 3) imports trainer_resume.loaders (layer 4)",
    ]


def test_the_privacy_check_reports_an_import_from_outside_the_subpackage_only():
    graph = {
        "trainer_resume.durable": {"trainer_resume.durable._format", "trainer_resume._atomic"},
        "trainer_resume.durable._torch_io": {"trainer_resume.durable._format"},
        "trainer_resume.mixin": {"trainer_resume.durable._format", "trainer_resume._atomic"},
        "trainer_resume.loaders.reuse.loader": {"trainer_resume.loaders._state_keys"},
        "trainer_resume.cli": {"trainer_resume.loaders._state_keys"},
    }
    assert _privacy_violations(graph) == [
        "trainer_resume.cli imports trainer_resume.loaders._state_keys, private to trainer_resume.loaders",
        "trainer_resume.mixin imports trainer_resume.durable._format, private to trainer_resume.durable",
    ]


def test_importing_the_package_and_its_command_line_loads_neither_the_compiler_nor_lightning_nor_accelerate():
    # What the command line (inspect, export) and every rank pay before training: the
    # compiler's machinery loads where a trainer first needs it, not on import.
    probe = (
        "import sys, trainer_resume, trainer_resume.cli; "
        "print(sorted(m for m in ('torch._dynamo', 'pytorch_lightning', 'accelerate') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
