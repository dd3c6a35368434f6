"""Build hook: generate the gRPC stubs from protos/ before packaging.

The stubs are build output, never committed: protos/*.proto is the single source. They are
written into cephcsi/_generated/ (git-ignored) so that both wheel and editable installs see them.
"""
from __future__ import annotations

import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).resolve().parent


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
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
