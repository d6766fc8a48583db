"""The import layering, read from the source (every import, function-local ones included); the arrows point one way:

* ``resplan`` (the planner and executor) imports nothing from ``models``, and from ``kernels`` only the resident-row
  ops it runs in the graph (``kernels.rows``) and where kernels run (``kernels.runtime``);
* ``kernels`` imports neither ``resplan`` nor ``models``: the row ops take plain tensors and integers, which resplan
  builds from its records;
* ``models.layers`` and the model families import nothing from the engine or the benchmarks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # `from kernels import rows` names a module
    return out


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _reaches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


RULES = {  # package (files under it) -> (forbidden prefixes, allowed exceptions)
    "resplan": (("models", "kernels"), ("kernels.rows", "kernels.runtime")),
    "kernels": (("models", "resplan"), ()),
    "models/layers": (("models.engine", "models.bench", "models.demo", "models.generate"), ()),
    "models/qwen3_5": (("models.engine", "models.bench"), ()),
    "models/whisper": (("models.engine", "models.bench"), ()),
}


@pytest.mark.parametrize("package", list(RULES))
def test_imports_follow_the_layering(package):
    forbidden, allowed = RULES[package]
    bad = []
    for f in _files(package):
        for name in _imports(f):
            if any(_reaches(name, p) for p in forbidden) and not any(_reaches(name, a) for a in allowed):
                bad.append(f"{f.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(bad)


def test_resplan_imports_the_row_ops_at_the_top_of_its_modules():
    """No function-local import hides an arrow: resplan's imports of kernels are module-level statements."""
    bad = []
    for f in _files("resplan"):
        tree = ast.parse(f.read_text(), str(f))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in top:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                bad += [f"{f.relative_to(ROOT)}:{node.lineno} imports {n} inside a function" for n in names
                        if _reaches(n, "kernels")]  # fmt: skip
    assert not bad, "\n".join(bad)


def test_the_rule_sees_a_function_local_import(tmp_path):
    """The scan reads imports inside functions too (the kind that hid the layers-kernels cycle)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from models.layers.gdn import L2_EPS\n    import models.engine\n")
    assert {"models.layers.gdn", "models.layers.gdn.L2_EPS", "models.engine"} <= _imports(f)
