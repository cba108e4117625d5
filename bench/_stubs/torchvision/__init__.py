"""Stand-in for torchvision, for the peers benchmark only.

physicsnemo.nn imports timm, which imports torchvision; the package index's torchvision wheels need
CUDA libraries the CPU torch lacks. MeshGraphNet uses none of it, so every torchvision submodule
and attribute resolves to a placeholder here.
"""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+stub"


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        child = _Meta(name, (cls,), {})  # a distinct placeholder per name (used as dict keys)
        setattr(cls, name, child)
        return child

    def __hash__(cls):
        return id(cls)


class _Placeholder(metaclass=_Meta):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("torchvision stub: not available in the meshshard benchmark environment")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
