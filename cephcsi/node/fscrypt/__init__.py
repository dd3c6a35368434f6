"""File encryption (fscrypt) in google/fscrypt's on-disk layout, as ceph-csi sets it up.

The kernel does the encryption; this package only keeps the `.fscrypt` metadata (protectors and
policies, protobuf records written by google/fscrypt's tool and library, which ceph-csi uses) and
talks to the kernel through its ioctls (fcntl.ioctl on the directory). No Python library does
either: the PyPI fscrypt bindings wrap the CLI or only the v1 ioctl, none reads google/fscrypt's
metadata. The record format is small enough to encode by hand (wire.py) instead of adding a
build-time protoc step for five messages.
"""
