"""Lightning's definitions as released, for undoing one of the patch's changes in a patched environment.

The defect catalogue reverts a hunk of the patch by putting back, for one run, the method as pytorch-lightning 2.6.6
released it: read from the release's sdist (the one ``patch.series`` applies the items to), compiled in the patched
module's namespace, and set on the patched class by the catalogue's usual ``mock.patch``.
"""

from __future__ import annotations

import ast
import tarfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from patch.series import DEFAULT_CACHE, PACKAGE_IN_SDIST, RELEASE, download_sdist


def released_source(module: ModuleType, cache: Path = DEFAULT_CACHE) -> str:
    """The text of ``module`` (a ``pytorch_lightning`` module) as the release's sdist holds it."""
    relative = Path(*module.__name__.split(".")[1:]).with_suffix(".py")
    member = f"pytorch_lightning-{RELEASE}/{PACKAGE_IN_SDIST.as_posix()}/{relative.as_posix()}"
    with tarfile.open(download_sdist(cache)) as archive:
        extracted = archive.extractfile(member)
        if extracted is None:
            raise FileNotFoundError(f"{member} is not a file in the {RELEASE} sdist")
        return extracted.read().decode()


def released_method(owner: type, name: str, cache: Path = DEFAULT_CACHE) -> Callable[..., Any]:
    """``owner.name`` as released, compiled in the namespace of ``owner``'s (patched) module. Refuses a method that
    uses ``super()``, which would need the class body it was compiled in."""
    module = __import__(owner.__module__, fromlist=["_"])
    tree = ast.parse(released_source(module, cache))
    found = [
        method for node in tree.body if isinstance(node, ast.ClassDef) and node.name == owner.__name__
        for method in node.body if isinstance(method, ast.FunctionDef) and method.name == name
    ]
    if len(found) != 1:
        raise LookupError(f"{owner.__name__}.{name} is not one method of the {RELEASE} release's {module.__name__}")
    method = found[0]
    if any(isinstance(n, ast.Name) and n.id == "super" for n in ast.walk(method)):
        raise ValueError(f"{owner.__name__}.{name} calls super(): it cannot be compiled outside its class body")
    method.decorator_list = [d for d in method.decorator_list if ast.unparse(d) != "override"]
    namespace = dict(vars(module))
    exec(compile(textwrap.dedent(ast.unparse(method)), f"<{RELEASE} {module.__name__}>", "exec"), namespace)
    return namespace[name]
