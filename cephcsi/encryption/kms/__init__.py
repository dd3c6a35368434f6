"""KMS types: where a volume's passphrase comes from and where it is kept (ceph-csi's
internal/kms). `registry` builds one from a ConfigMap section; each type registers itself."""
