"""Runs the Python reader of docs/golden-format.md (its first ```python block) on a committed golden.

usage: doc_snippet_test.py DOC GOLDEN. Exits 77 (CTest's skip) when h5py or numpy is missing.
"""
import re
import sys
import tempfile

try:
    import h5py  # noqa: F401
    import numpy as np
except ImportError:
    print("h5py or numpy missing: skipped (pip install h5py==3.12.1 numpy==2.2.6)")
    sys.exit(77)

doc, golden = sys.argv[1], sys.argv[2]
snippet = re.search(r"```python\n(.*?)```", open(doc).read(), re.S).group(1)
scope = {}
exec(snippet, scope)
read_golden = scope["read_golden"]

g = read_golden(golden)
assert g["attrs"]["format"] == "mok-golden" and g["attrs"]["format_version"] == 1
c = g["config"]
N, H = c["ranks"] * c["tokens_per_rank"], c["hidden"]
for name in ("x", "dy"):
    v = g["inputs"][name]
    assert v.dtype == np.float32 and v.shape == (N, H), (name, v.dtype, v.shape)
    assert np.all((v.view(np.uint32) & 0xFFFF) == 0), "a bf16 decoded to float32 has a zero low half"
    assert np.all(np.abs(v) <= 1), "x and dy are uniform in [-1, 1), rounded to bf16"
y = g["outputs"]["y"]
assert y.dtype == np.float32 and y.shape == (N, H) and np.all(np.isfinite(y)) and np.any(y != 0)
assert g["routing"]["offsets"][-1] == N * c["top_k"]

# Every tensor decoded is the file's bits: a bf16's its top half, the rest as stored (read here without the snippet).
with h5py.File(golden, "r") as f:
    for group in ("inputs", "routing", "outputs"):
        assert sorted(g[group]) == sorted(f[group]), (group, sorted(g[group]))
        for name, ds in f[group].items():
            raw, got = ds[()], g[group][name]
            want = raw.astype(np.uint32) << 16 if ds.attrs["dtype"] == "bf16" else raw.view(raw.dtype)
            assert got.shape == raw.shape and np.array_equal(got.view(want.dtype), want), f"/{group}/{name}"

# The seal check rejects a corrupt copy.
data = bytearray(open(golden, "rb").read())
data[len(data) // 2] ^= 1
with tempfile.NamedTemporaryFile(suffix=".h5") as bad:
    bad.write(data)
    bad.flush()
    try:
        read_golden(bad.name)
        sys.exit("a corrupt copy was read without complaint")
    except ValueError as e:
        assert "corrupt" in str(e), e
print("1 passed, 0 failed")
