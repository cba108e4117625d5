"""Import a module of a top-level example (``examples/NAME/MODULE.py``) in a test.

The examples are scripts, not an installed package; tests that need their application code (the
heat-diffusion simulator, for instance) load it from its file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example_module(example: str, module: str) -> ModuleType:
    """``examples/<example>/<module>.py``, imported once under the name ``examples.<example>.<module>``."""
    name = f"examples.{example}.{module}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / example / f"{module}.py")
    assert spec is not None and spec.loader is not None, f"no module {module}.py in examples/{example}"
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded
    spec.loader.exec_module(loaded)
    return loaded
