"""The house rules of the package layout (README: Layout), checked on the source and in fresh
interpreters: which side a module runs on is visible from its folder, and imports respect it.

- A rank never imports the kernel side (nor widgets): checked in a fresh interpreter that
  imports everything a rank does.
- Importing the kernel side loads no rank logic: the kernel names rank entry points through
  shared/specs.py trampolines; only the in-process path runs rank code, and imports it at call time.
- No import cycles among nbtrain's modules (type-only imports included), and each package imports
  only the packages allowed beneath it; the Accelerator's sub-packages form layers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nbtrain"

# Which packages each package may import (module-level or lazily inside functions).
ALLOWED = {
    "shared": {"shared"},
    "rank": {"shared", "rank"},
    "accelerator": {"shared", "rank", "accelerator"},
    "integrations": {"shared", "rank", "integrations"},
    # The display owns the run state it draws (display/runstate.py) and the pump of its "where?"
    # button (display/commpump.py): the kernel feeds and pumps them, and display imports none of
    # the kernel (test_display_imports_nothing_of_the_kernel).
    "display": {"shared", "display"},
    # ...and ``nbtrain.rank`` itself: its __init__ holds only the process targets (trampolines).
    "kernel": {"shared", "kernel", "display", "rank.__init__"},
    "": {"shared", "kernel", "rank", "accelerator", "integrations", "display", ""},  # nbtrain/*
}
# Documented exceptions: the kernel module that runs rank logic (num_processes=1: the kernel is
# rank 0), and the commands that name the rank-side script runner and the demo's training as
# the function their ranks run. (The package's root module and nbtrain/_version.py, a leaf, may
# be named by any side.)
EXCEPTIONS = {
    "nbtrain.kernel.launch.inprocess": {"rank"},
    "nbtrain.kernel.cli.commands": {"rank.script"},
    "nbtrain.kernel.cli.demo": {"rank.demo_training"},
}

# The Accelerator's sub-packages (README: Layout), lowest first: each imports only itself and
# those before it (besides shared and rank), so they form layers. The modules directly in
# accelerator/ (logging) import none of them.
ACCELERATOR_LAYERS = [
    "comm",
    "training",
    "data",
    "devices",
    "checkpoint",
    "tracking",
    "fsdp",
    "front",
]

# The kernel side's sub-packages along a launch's path (nbtrain/kernel/__init__.py), lowest
# first: each imports only itself and those before it, type-only imports included, so no
# circle can come back through ``if TYPE_CHECKING:``. The modules directly in kernel/ (the
# public entry points) sit on top and may import any of them.
KERNEL_LAYERS = ["host", "options", "specs", "procs", "group", "run", "launch", "warm", "cli"]
# In launch/, the kinds sit side by side: none imports another (choose.py, above them, picks).
LAUNCH_KINDS = ["inprocess", "local", "xla", "elastic", "cluster"]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, *, type_only: bool = False) -> set[str]:
    """nbtrain modules ``path`` imports, outside ``if TYPE_CHECKING:`` blocks (``type_only``:
    those too)."""
    tree = ast.parse(path.read_text())
    skipped = (
        set()
        if type_only
        else {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for node in ast.walk(block)
        }
    )
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("nbtrain")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nbtrain"):
            assert node.level == 0, f"{path}: relative import"
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).exists()
                found.add(candidate if is_module else node.module)
    return found


def graph(*, type_only: bool = False) -> dict[str, set[str]]:
    """Each module's nbtrain imports (``type_only``: ``if TYPE_CHECKING:`` ones included)."""
    return {
        module_name(p): imports_of(p, type_only=type_only) for p in sorted(PACKAGE.rglob("*.py"))
    }


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else ""


def test_every_import_stays_within_what_its_side_may_use():
    wrong = []
    for module, targets in graph().items():
        allowed = ALLOWED[package_of(module)] | EXCEPTIONS.get(module, set())
        for target in targets - {"nbtrain", "nbtrain._version"}:
            package = package_of(target)
            if target == f"nbtrain.{package}" and package:
                package = f"{package}.__init__"  # the package itself, not one of its modules
            if package not in allowed and ".".join(target.split(".")[1:3]) not in allowed:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_display_imports_nothing_of_the_kernel():
    """kernel -> display is the one direction between the two: the kernel feeds the run state
    and pumps the dashboard's button; display names nothing of nbtrain.kernel, not even for
    types, so a change to the kernel's internals cannot break a view."""
    wrong = [
        f"{module_name(path)} imports {target}"
        for path in sorted((PACKAGE / "display").rglob("*.py"))
        for target in imports_of(path, type_only=True)
        if target == "nbtrain.kernel" or target.startswith("nbtrain.kernel.")
    ]
    assert not wrong, "\n".join(wrong)


def layer(module: str, package: str) -> str | None:
    """The sub-package of nbtrain.<package> that ``module`` is in ("" directly in it; None
    outside it, or the package itself)."""
    parts = module.split(".")
    if parts[:2] != ["nbtrain", package] or len(parts) < 3:
        return None
    return parts[2] if (PACKAGE / package / parts[2]).is_dir() else ""


def layer_violations(package: str, layers: list[str], *, top_imports_them: bool) -> list[str]:
    """Imports (type-only ones included) from a sub-package of nbtrain.<package> into one
    listed after it, or into a module directly in the package; ``top_imports_them``: those
    modules sit on top of the layers (the kernel's entry points), else beneath them."""
    assert sorted(layers) == sorted(
        p.name for p in (PACKAGE / package).iterdir() if (p / "__init__.py").exists()
    )
    wrong = []
    for module, targets in graph(type_only=True).items():
        own = layer(module, package)
        if own is None or (own == "" and top_imports_them):
            continue
        allowed = layers[: layers.index(own) + 1] if own else []
        wrong += [
            f"{module} imports {target}"
            for target in targets
            if layer(target, package) not in (None, *allowed)
        ]
    return wrong


def test_the_accelerator_sub_packages_form_layers():
    wrong = layer_violations("accelerator", ACCELERATOR_LAYERS, top_imports_them=False)
    assert not wrong, "\n".join(wrong)


def test_the_kernel_sub_packages_form_layers():
    wrong = layer_violations("kernel", KERNEL_LAYERS, top_imports_them=True)
    assert not wrong, "\n".join(wrong)


def launch_kind(module: str) -> str | None:
    parts = module.split(".")
    if parts[:3] != ["nbtrain", "kernel", "launch"] or len(parts) < 4:
        return None
    return parts[3] if parts[3] in LAUNCH_KINDS else None


def test_no_launch_kind_imports_another_type_only_imports_included():
    assert set(LAUNCH_KINDS) <= {
        p.stem for p in (PACKAGE / "kernel" / "launch").iterdir() if p.name != "__init__.py"
    }
    wrong = [
        f"{module} imports {target}"
        for module, targets in graph(type_only=True).items()
        for target in targets
        if launch_kind(module) and launch_kind(target) not in (None, launch_kind(module))
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles_type_only_imports_included():
    # nbtrain/__init__ names every public module lazily; importing it is no cycle.
    cycles = [
        c
        for c in find_cycles(graph(type_only=True))
        if not c.startswith("nbtrain ->") and " -> nbtrain " not in c + " "
    ]
    assert not cycles, "\n".join(sorted(set(cycles)))


def find_cycles(edges: dict[str, set[str]]) -> list[str]:
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(edges.get(module, ())):
            if target in path:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target in edges and target not in done:
                visit(target, [*path, target])
        done.add(module)

    done: set[str] = set()
    for module in sorted(edges):
        if module not in done:
            visit(module, [module])
    return cycles


def test_no_module_outside_the_side_environment_readers_reads_os_environ():
    readers = {"nbtrain.kernel.host.environment", "nbtrain.rank.rankenv"}
    offenders = [
        module_name(path)
        for path in PACKAGE.rglob("*.py")
        if module_name(path) not in readers and _uses_environ(ast.parse(path.read_text()))
    ]
    assert not offenders, offenders


def _uses_environ(tree: ast.AST) -> bool:
    """Code (not text) touching os.environ, os.getenv or os.putenv."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in {"environ", "getenv", "putenv", "unsetenv"}
        ):
            return True
    return False


def loaded_after(code: str) -> set[str]:
    script = textwrap.dedent(code) + "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return set(out.split())


RANK_IMPORTS = """
import nbtrain
from nbtrain import Accelerator, DistributedType, log, progress, set_seed
import nbtrain.rank.worker
import nbtrain.rank.xla_host
import nbtrain.rank.session
import nbtrain.integrations.transformers
import pkgutil, importlib, nbtrain.accelerator
for info in pkgutil.walk_packages(nbtrain.accelerator.__path__, "nbtrain.accelerator."):
    importlib.import_module(info.name)
acc = Accelerator(cpu=True)
"""


def test_a_rank_imports_nothing_of_the_kernel_side():
    loaded = loaded_after(RANK_IMPORTS)
    assert "nbtrain.accelerator.front.core" in loaded and "nbtrain.rank.worker" in loaded  # it ran
    kernel = sorted(m for m in loaded if m.startswith(("nbtrain.kernel", "nbtrain.display")))
    assert kernel == []
    assert "ipywidgets" not in loaded


@pytest.mark.parametrize(
    "entry",
    [
        "nbtrain.kernel.entry",
        "nbtrain.kernel.launch.elastic.agent",
        "nbtrain.kernel.launch.xla",
        "nbtrain.kernel.cli.commands",
        "nbtrain.kernel.warm.magics",
    ],
)
def test_importing_the_kernel_side_loads_no_rank_logic(entry):
    loaded = loaded_after(f"import {entry}\nfrom nbtrain import notebook_launcher")
    assert entry in loaded
    rank_side = sorted(
        m for m in loaded if m.startswith(("nbtrain.rank.", "nbtrain.accelerator", "nbtrain.integ"))
    )
    assert rank_side == []  # (nbtrain.rank itself holds only the process targets)


# --- sizes: small modules with one job each, short functions ----------------------------------

MAX_MODULE_LINES = 400
# From its ``def`` to its last line, less its docstring: the public entry points document
# each of their twenty-odd parameters there (API.md), which is no code to split.
MAX_FUNCTION_LINES = 50


def test_no_module_is_over_400_lines():
    long = [
        f"{path.relative_to(PACKAGE.parent)}: {lines}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "\n".join(long)


def test_no_function_is_over_50_lines_of_code():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE.parent))
        for name, lines in _function_lengths(ast.parse(path.read_text())):
            if lines > MAX_FUNCTION_LINES:
                long.append(f"{where}:{name}: {lines}")
    assert not long, "\n".join(long)


def _function_lengths(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """Each function's qualified name and length, nested ones included."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                assert first.end_lineno is not None
                lines -= first.end_lineno - first.lineno + 1  # the docstring
            found.append((prefix + node.name, lines))
            found += _function_lengths(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            found += _function_lengths(node, f"{prefix}{node.name}.")
        else:
            found += _function_lengths(node, prefix)
    return found


# The repository's top level is fixed (README: Layout). A test run writes nothing there: tools
# that write into the working directory (DVCLive runs ``dvc init`` at a git checkout's root) run
# in a temporary one. Committed files and untracked, unignored ones both count.
TOP_LEVEL = {
    ".ci", ".gitignore", "README.md", "benchmarks", "binder", "constraints.txt",
    "constraints-xla.txt", "nbtrain", "notebooks", "pyproject.toml", "tests",
}


def test_the_repository_root_holds_only_the_fixed_layout():
    root = PACKAGE.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout (an installed copy)")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    top = {path.split("/", 1)[0] for path in listed}
    assert top - TOP_LEVEL == set(), "unexpected at the repository root; see README: Layout"
    assert {"nbtrain", "tests", "pyproject.toml"} <= top  # it listed the checkout
