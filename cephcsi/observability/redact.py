"""Render protobuf requests for logs with every field the CSI spec marks `csi_secret` removed.

Driven by the field option in the proto, not a list of names, so a secret field added in a
later spec version is stripped without a code change.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from cephcsi._generated import csi_pb2

if TYPE_CHECKING:
    from google.protobuf.descriptor_pb2 import FieldOptions
    from google.protobuf.internal.extension_dict import _ExtensionFieldDescriptor

# protoc's .pyi declares an extension as a plain FieldDescriptor; the Extensions API (typed by
# types-protobuf) takes the extension's handle, which is what csi_secret is at run time.
_SECRET_OPTION = cast("_ExtensionFieldDescriptor[FieldOptions, bool]", csi_pb2.csi_secret)


def _is_secret(field: FieldDescriptor) -> bool:
    options = field.GetOptions()
    return bool(options.HasExtension(_SECRET_OPTION) and options.Extensions[_SECRET_OPTION])


def _strip(doc: dict[str, Any], descriptor: Descriptor) -> None:
    for field in descriptor.fields:
        key = field.json_name
        if key not in doc and field.name in doc:
            key = field.name
        if key not in doc:
            continue
        if _is_secret(field):
            doc[key] = "***stripped***"
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            value = doc[key]
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, dict):
                    _strip(item, field.message_type)


def redacted(message: Message) -> dict[str, Any]:
    """A JSON-able dict of the message with secrets replaced by a marker."""
    doc = json_format.MessageToDict(message, preserving_proto_field_name=True)
    # Generated messages carry the pure-Python or the upb descriptor (one API, two classes).
    _strip(doc, cast(Descriptor, message.DESCRIPTOR))
    return doc
