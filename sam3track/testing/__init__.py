"""Stand-ins for Ascend tooling so sam3track's NPU path can be tested on any machine (fake atc, acl emulator)."""
