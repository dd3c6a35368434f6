"""protos/csi.proto must match the official CSI spec v1.12.0 wherever it declares something.

The official csi.proto is fetched at test time from the Go module proxy (it is not committed),
compiled with grpcio-tools, and compared element by element with what our stubs were built from.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile

import grpc_tools
import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from cephcsi._generated import csi_pb2

pytestmark = pytest.mark.unit

SPEC_MODULE = "github.com/container-storage-interface/spec@v1.12.0"


@pytest.fixture(scope="module")
def official() -> descriptor_pb2.FileDescriptorProto:
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    out = subprocess.run(["go", "mod", "download", "-json", SPEC_MODULE], capture_output=True, text=True,
                         timeout=300, env=env, check=True)
    spec_dir = pathlib.Path(json.loads(out.stdout)["Dir"])
    with tempfile.TemporaryDirectory() as tmp:
        out_file = pathlib.Path(tmp) / "official.pb"
        include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
        rc = protoc.main(["protoc", f"-I{spec_dir}", f"-I{include}", f"--descriptor_set_out={out_file}", "csi.proto"])
        assert rc == 0, "the official csi.proto did not compile"
        fds = descriptor_pb2.FileDescriptorSet.FromString(out_file.read_bytes())
    return fds.file[0]


@pytest.fixture(scope="module")
def ours() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    csi_pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


def _messages(file: descriptor_pb2.FileDescriptorProto) -> dict[str, descriptor_pb2.DescriptorProto]:
    found: dict[str, descriptor_pb2.DescriptorProto] = {}

    def walk(prefix: str, messages: object) -> None:
        for message in messages:  # type: ignore[attr-defined]
            name = f"{prefix}.{message.name}"
            found[name] = message
            walk(name, message.nested_type)

    walk("", file.message_type)
    return found


def _enums(file: descriptor_pb2.FileDescriptorProto) -> dict[str, dict[str, int]]:
    found = {f".{e.name}": {v.name: v.number for v in e.value} for e in file.enum_type}
    for name, message in _messages(file).items():
        for enum in message.enum_type:
            found[f"{name}.{enum.name}"] = {v.name: v.number for v in enum.value}
    return found


def _field_signature(field: descriptor_pb2.FieldDescriptorProto) -> tuple[object, ...]:
    return (field.number, field.type, field.label, field.type_name, field.oneof_index if field.HasField("oneof_index") else None,
            field.options.SerializeToString(deterministic=True))


def test_package(ours: descriptor_pb2.FileDescriptorProto, official: descriptor_pb2.FileDescriptorProto) -> None:
    assert ours.package == official.package == "csi.v1"


def test_services_and_rpcs_match(ours: descriptor_pb2.FileDescriptorProto, official: descriptor_pb2.FileDescriptorProto) -> None:
    theirs = {s.name: s for s in official.service}
    assert {"Identity", "Controller", "Node"} <= {s.name for s in ours.service}
    for service in ours.service:
        assert service.name in theirs, f"service {service.name} is not in the spec"
        methods = {m.name: m for m in theirs[service.name].method}
        assert {m.name for m in service.method} == set(methods), f"{service.name}: RPC set differs"
        for method in service.method:
            other = methods[method.name]
            assert (method.input_type, method.output_type, method.client_streaming, method.server_streaming) == (
                other.input_type, other.output_type, other.client_streaming, other.server_streaming
            ), f"{service.name}.{method.name}"


def test_every_declared_message_matches_field_for_field(
    ours: descriptor_pb2.FileDescriptorProto, official: descriptor_pb2.FileDescriptorProto
) -> None:
    theirs = _messages(official)
    mine = _messages(ours)
    assert len(mine) > 90
    for name, message in mine.items():
        assert name in theirs, f"message {name} is not in the spec"
        expected = {f.name: _field_signature(f) for f in theirs[name].field}
        actual = {f.name: _field_signature(f) for f in message.field}
        assert actual == expected, f"message {name} differs from the spec"
        assert [o.name for o in message.oneof_decl] == [o.name for o in theirs[name].oneof_decl], name


def test_every_declared_enum_matches(ours: descriptor_pb2.FileDescriptorProto, official: descriptor_pb2.FileDescriptorProto) -> None:
    theirs = _enums(official)
    for name, values in _enums(ours).items():
        assert values == theirs.get(name), f"enum {name} differs from the spec"


def test_extensions_match(ours: descriptor_pb2.FileDescriptorProto, official: descriptor_pb2.FileDescriptorProto) -> None:
    theirs = {e.name: (e.number, e.extendee, e.type) for e in official.extension}
    assert {e.name: (e.number, e.extendee, e.type) for e in ours.extension} == theirs
