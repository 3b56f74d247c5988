"""Compares the kernels of two sets of cubins (sm_90a, nvcc -cubin), kernel by kernel: each kernel's .text
(its SASS), .nv.info (registers, barriers, parameter bank) and .nv.shared / .nv.constant0 sections, byte for
byte, and for a .text that differs, how: instructions whose 64-bit first word differs, whose opcode (its low 12
bits) differs, and whether the opcodes are the same multiset. No nvdisasm here (this machine's CUDA has no
cuobjdump or nvdisasm), so the sections are read with binutils' readelf.

    python3 compare_cubins.py OLD.cubin[,OLD2.cubin...] NEW.cubin[,NEW2.cubin...]
"""
import collections
import re
import subprocess
import sys


def sections(path):
    table = subprocess.run(["readelf", "-W", "-S", path], capture_output=True, text=True, check=True).stdout
    data = open(path, "rb").read()
    found = {}
    for line in table.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+(\S+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if not m or not re.match(r"\.(text|nv\.info|nv\.shared|nv\.constant0)\.", m.group(1)):
            continue
        name, kind, offset, size = m.group(1), m.group(2), int(m.group(3), 16), int(m.group(4), 16)
        found[name] = ("NOBITS", size) if kind == "NOBITS" else data[offset : offset + size]
    return found


def union(paths):
    merged = {}
    for p in paths.split(","):
        merged.update(sections(p))
    return merged


def opcode(text, i):
    return int.from_bytes(text[16 * i : 16 * i + 8], "little") & 0xFFF


old, new = union(sys.argv[1]), union(sys.argv[2])
same = 0
for name in sorted(set(old) | set(new)):
    if name not in old or name not in new:
        print("only in", "old" if name in old else "new", name)
    elif old[name] == new[name]:
        same += 1
    else:
        a, b = old[name], new[name]
        line = f"differs {name}: {len(a)} / {len(b)} bytes"
        if name.startswith(".text.") and len(a) == len(b):
            n = len(a) // 16
            words = sum(a[16 * i : 16 * i + 8] != b[16 * i : 16 * i + 8] for i in range(n))
            ops = sum(opcode(a, i) != opcode(b, i) for i in range(n))
            bag = collections.Counter(opcode(a, i) for i in range(n)) == collections.Counter(opcode(b, i) for i in range(n))
            line += f"; {n} instructions, first word differs in {words}, opcode in {ops}, opcodes the same multiset: {bag}"
        print(line)
print(f"{same} sections identical")
