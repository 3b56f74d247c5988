"""Local-memory accesses (LDL/STL) of a kernel object's SASS, and those within 200 instructions of each wgmma group
(HGMMA), from `cuobjdump -sass OBJ > OBJ.sass` (cuobjdump: pip's nvidia-cuda-cuobjdump; the CI image has none).
Usage: python3 local_accesses.py OBJ.sass"""
import bisect
import re
import sys

instructions = [line.strip() for line in open(sys.argv[1]) if re.search(r"/\*[0-9a-f]{4,}\*/", line)]
gmma = [k for k, line in enumerate(instructions) if "GMMA" in line]
local = [k for k, line in enumerate(instructions) if re.search(r"\b(LDL|STL)", line)]
groups = []
for k in gmma:
    if groups and k - groups[-1][-1] < 30:
        groups[-1].append(k)
    else:
        groups.append([k])
print(f"{sys.argv[1]}: {len(instructions)} instructions, {len(local)} local accesses, {len(groups)} wgmma groups")
for g in groups:
    near = bisect.bisect_right(local, g[-1] + 200) - bisect.bisect_left(local, g[0] - 200)
    print(f"  wgmma group at instruction {g[0]} ({len(g)} HGMMA): {near} local accesses within 200")
