#!/usr/bin/env python3
"""Seeds for fuzz_neuron_cache: neuron compile cache entries as the plugin writes them
(plugins/neuron/cache_entry.cpp), whole and damaged. Usage: make_neuron_cache_seeds.py OUTDIR"""
import os
import struct
import sys

FORMAT = 0x3230726A70706E6B  # "knppjr02"
MODULE = b"module @kiln_group {\n  func.func public @main() {\n    return\n  }\n}\n"


def fnv1a64(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def entry(module, payload):
    return (struct.pack("<QQ", FORMAT, len(module)) + module +
            struct.pack("<QQ", len(payload), fnv1a64(payload)) + payload)


out = sys.argv[1]
os.makedirs(out, exist_ok=True)
payload = bytes((i * 37 + 11) % 256 for i in range(300))
whole = entry(MODULE, payload)
seeds = {
    "whole": whole,
    "empty_executable": entry(MODULE, b""),
    "another_module": entry(b"module @other {}\n", payload),
    "cut_in_the_executable": whole[:-40],
    "cut_in_the_header": whole[:12],
    "a_byte_changed": whole[:-5] + bytes([whole[-5] ^ 0x5A]) + whole[-4:],
    "longer_than_its_header": whole + b"\0" * 8,
    "module_size_past_the_end": struct.pack("<QQ", FORMAT, 3 << 30) + MODULE,
    "executable_size_past_the_end": entry(MODULE, payload)[: 16 + len(MODULE)] + struct.pack("<QQ", 1 << 39, 0),
    "another_format": b"\x01" * 64,
}
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
