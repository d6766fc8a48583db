"""The import layering, read from the source (every import, function-local ones included):

* ``resplan`` (the planner and executor) imports nothing from ``models``, and from ``kernels`` only the resident-row
  ops (``kernels.rows``, which import resplan's records back) and where kernels run (``kernels.runtime``);
* ``kernels`` imports nothing from ``models``; its model ops import nothing from ``resplan`` either;
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
    "kernels": (("models",), ()),
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


def test_the_models_kernels_import_nothing_from_resplan():
    """Only the resident-row ops know the store's row layout; the model's ops are plain tensor kernels."""
    rows = ROOT / "kernels" / "rows"
    bad = [f"{f.relative_to(ROOT)} imports {n}" for f in _files("kernels") if rows not in f.parents
           for n in _imports(f) if _reaches(n, "resplan")]  # fmt: skip
    assert not bad, "\n".join(bad)


def test_the_rule_sees_a_function_local_import(tmp_path):
    """The scan reads imports inside functions too (the kind that hid the layers-kernels cycle)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from models.layers.gdn import L2_EPS\n    import models.engine\n")
    assert {"models.layers.gdn", "models.layers.gdn.L2_EPS", "models.engine"} <= _imports(f)
