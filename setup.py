"""Installs `hpcring-horovod-alias.pth` into site-packages beside the package, in wheels and editable installs

Python runs a `.pth` file's `import` line at every start-up: this one does nothing unless HPCRING_HOROVOD is
set, and then imports hpcring, which installs the `horovod` alias (hpcring/horovod_alias), so
`HPCRING_HOROVOD=1 python script.py` works in any Python of the environment, Spark executors and Ray workers
included.

It also builds hpcring's compiled request path, `hpcring.engine.core._core` (C through the CPython API and
numpy's C API, docs/dev/engine.md says why), with the machine's C compiler. The extension is optional: where
it cannot be built (no compiler, no headers) pip still installs hpcring, which then runs its pure-Python
path (`hpcring doctor` says which is in use). Where torch is importable at build time (a build without
isolation), it also builds the torch reader the compiled submit reads tensors with. Everything else about
the build is in pyproject.toml.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PTH = Path(__file__).parent / "hpcring" / "horovod_alias" / "hpcring-horovod-alias.pth"


class BuildPyWithPth(build_py):
    """build_py, plus the .pth at the root of what becomes site-packages: `build_lib` for a wheel; for an
    editable install (PEP 660) the unpacked editable wheel, which setuptools gives as install_lib, since
    its build_lib is not shipped."""

    def run(self) -> None:
        super().run()
        target = self.build_lib
        if getattr(self, "editable_mode", False):
            target = self.distribution.get_command_obj("install").install_lib or target
        self.copy_file(str(PTH), str(Path(target) / PTH.name))


CORE_SOURCES = ["handle.c", "lock.c", "submit.c", "entry.c", "lone_check.c", "lone.c", "module.c"]


def core_extensions() -> list[Extension]:
    """The compiled core, when numpy's headers are at hand (a build requirement in pyproject.toml)."""
    try:
        import numpy
    except ImportError:
        return []
    src = Path("hpcring") / "engine" / "core" / "src"
    return [
        Extension(
            "hpcring.engine.core._core",
            sources=[str(src / name) for name in CORE_SOURCES],
            include_dirs=[numpy.get_include(), str(src)],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ]


def torch_reader_extensions() -> list[Extension]:
    """The torch reader (C++), when torch is importable here: only a build without isolation sees the
    installed torch (`pip install --no-build-isolation`, as Horovod's and flash-attn's torch extensions are
    built). It is built against that torch and refuses to load under any other (torch_reader.cpp)."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return []
    src = Path("hpcring") / "engine" / "core" / "src"
    libs = cpp_extension.library_paths()
    return [
        Extension(
            "hpcring.engine.core._torch_reader",
            sources=[str(src / "torch_reader.cpp")],
            include_dirs=[*cpp_extension.include_paths(), str(src)],
            library_dirs=libs,
            runtime_library_dirs=libs,
            libraries=["c10", "torch", "torch_cpu", "torch_python"],
            define_macros=[
                ("HPCRING_TORCH_VERSION", f'"{torch.__version__}"'),
                ("HPCRING_TORCH_GIT", f'"{torch.version.git_version}"'),
                ("_GLIBCXX_USE_CXX11_ABI", str(int(torch._C._GLIBCXX_USE_CXX11_ABI))),
            ],
            extra_compile_args=["-O2", "-std=c++20", "-fvisibility=hidden", "-Wall"],
            language="c++",
            optional=True,
        )
    ]


setup(
    cmdclass={"build_py": BuildPyWithPth},
    ext_modules=core_extensions() + torch_reader_extensions(),
)
