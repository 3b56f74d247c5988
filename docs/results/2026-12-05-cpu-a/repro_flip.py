# usage: python3 repro_flip.py SRC DST OFFSET XOR  -- flips one byte and rewrites the seal
import sys, hashlib
src, dst, off, x = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
d = bytearray(open(src, 'rb').read()); d[off] ^= x
body = bytes(d[512:])
seal = f"mok-golden 1\nsize {len(d)}\nsha256 {hashlib.sha256(body).hexdigest()}\n".encode().ljust(512, b'\0')
open(dst, 'wb').write(seal + body)
