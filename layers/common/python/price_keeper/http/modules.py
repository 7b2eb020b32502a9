"""Loading ``lambdas/<function>/handler.py`` modules by path (the local gateway and the
docs function both need every handler, and each must be imported exactly once per use)."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

# The local server is threaded: without the lock a second request could get a module that
# is in sys.modules but not yet executed (no ``lambda_handler`` yet).
_loading = threading.RLock()


def load_handler_module(lambdas_dir: Path, function: str, namespace: str = "lambdas") -> ModuleType:
    """The function's handler module, imported once per ``namespace``: another namespace gets
    a copy of its own (its own router)."""
    name = f"{namespace}_{function}_handler"
    with _loading:
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, Path(lambdas_dir) / function / "handler.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
