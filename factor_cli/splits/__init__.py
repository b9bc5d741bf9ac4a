"""Split manifests: build, read, checksum and verify train/eval instance lists."""
