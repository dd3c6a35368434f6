"""Build hook: generate the gRPC stubs from protos/ before packaging.

The stubs are build output, never committed: protos/*.proto is the single source. They are
written into cephcsi/_generated/ (git-ignored) so that both wheel and editable installs see them.

Why the package is added by hand: setuptools computes the package list
([tool.setuptools.packages.find]) when setup() reads pyproject.toml, long before build_py
runs. In a clean tree (`git archive`, a container build context, CI) cephcsi/_generated/
does not exist at that moment, so a wheel built from it would silently lack the stubs and
fail at import (`No module named 'cephcsi._generated'`). tests/integration/packaging/
builds a wheel from a clean export to keep it that way.
"""
from __future__ import annotations

import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).resolve().parent
GENERATED_PACKAGE = "cephcsi._generated"


def generate_stubs() -> None:
    import grpc_tools
    from grpc_tools import protoc

    out_package = ROOT / "cephcsi" / "_generated"
    out_package.mkdir(exist_ok=True)
    (out_package / "__init__.py").write_text('"""Generated from protos/ at build time; do not edit."""\n')
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    for proto in sorted((ROOT / "protos").glob("*.proto")):
        # The virtual path makes generated imports absolute within the package
        # (`from cephcsi._generated import csi_pb2`), which plain -I would not.
        args = [
            "grpc_tools.protoc",
            f"-Icephcsi/_generated={ROOT / 'protos'}",
            f"-I{well_known}",
            f"--python_out={ROOT}",
            f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}",
            f"cephcsi/_generated/{proto.name}",
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {proto}")


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        generate_stubs()
        # self.packages is the distribution's own list (build_py.finalize_options takes it
        # by reference), so this also reaches the wheel's metadata. A tree that already had
        # the stubs (an editable install ran before) lists the package already.
        if self.packages is not None and GENERATED_PACKAGE not in self.packages:
            self.packages.append(GENERATED_PACKAGE)
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
