"""The weight-gradient phase's operand reads from DRAM through an LRU L2, per tile order (session 61; CPU only).

Per shape, the per-expert rows of a routing drawn by weight_grad_schedule.py's expert_rows (session 60, imported), the weight
gradients' tiles (dW1_e: (2I / 128) x (H / 256), dW2_e: (H / 128) x (I / 256), longest chain first; with `seg`,
each chain cut into segments of seg K-blocks of 64 rows, segment-major, whose partials' traffic is NOT counted), each
tile's start over 132 blocks for three assignments (rr: round-robin, gemm_tile_loop's before session 61; snake: every
other round reversed; greedy: the next tile to the first free block, which claiming tiles at run time does), one K-block
of 64 rows per time unit plus EPI units for the store. Every K-block a tile reads is two granules (its A columns, 16 KB;
its B columns, 32 KB) shared by the tiles of the same gradient and column block; each tile's output (128 KB) passes
through L2 too. An LRU L2 of 25 or 50 MB (the H100's two partitions, or one) counts the operand bytes it misses: the
DRAM reads. Output: GB read and the span (time units) per shape, routing, segment length and assignment.

    python3 l2_model.py [shape ...]      # default: qwen3-30b-a3b olmoe (minutes each)
"""
import heapq
import os
import random
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-h100-i"))
from weight_grad_schedule import BLOCKS, SHAPES, expert_rows  # session 60's shapes and routings

EPI = 4  # K-blocks' worth of time for a tile's store, as weight_grad_schedule.py's EPILOGUE


def tiles_of(H, I, rows, seg):
    """(gradient id, tile (mi, ni), k_first, k_blocks, M, N) items, longest first, segments segment-major."""
    grads = []
    for e, r in enumerate(rows):
        kb = -(-r // 128) * 2
        grads.append((kb, 2 * e, 2 * I, H)); grads.append((kb, 2 * e + 1, H, I))
    grads.sort(key=lambda g: (-g[0], g[1]))
    items = []
    nseg = max(1, max(-(-g[0] // seg) for g in grads)) if seg else 1
    for s in range(nseg):
        for kb, gid, M, N in grads:
            lo = s * seg if seg else 0
            hi = min(kb, lo + seg) if seg else kb
            if lo >= hi: continue
            for mi in range(M // 128):
                for ni in range(N // 256):
                    items.append((gid, mi, ni, lo, hi - lo, hi == kb))
    return items

def simulate(items, order, cap_mb):
    # assign start times
    ends = [0.0] * BLOCKS
    starts = []
    if order == "greedy":
        heap = [(0.0, b) for b in range(BLOCKS)]
        for it in items:
            t, b = heapq.heappop(heap)
            starts.append(t); heapq.heappush(heap, (t + it[4] + EPI, b))
        span = max(t for t, _ in heap)
    else:
        for i, it in enumerate(items):
            r, b = divmod(i, BLOCKS)
            if order == "snake" and r % 2: b = BLOCKS - 1 - b
            starts.append(ends[b]); ends[b] += it[4] + EPI
        span = max(ends)
    # events: (time, granule, bytes)
    ev = []
    for (gid, mi, ni, lo, kb, last), s in zip(items, starts):
        for j in range(kb):
            ev.append((s + j, ("a", gid, mi, lo + j), 16384))
            ev.append((s + j, ("b", gid, ni, lo + j), 32768))
        ev.append((s + kb, ("p", gid, mi, ni), 131072))  # partial or result write (read back for partials)
    ev.sort(key=lambda e: e[0])
    lru, used, cap, miss = OrderedDict(), 0, cap_mb * 2**20, 0
    for t, g, nb in ev:
        if g in lru:
            lru.move_to_end(g)
            if g[0] != "p": continue
        else:
            if g[0] != "p": miss += nb
            lru[g] = nb; used += nb
        while used > cap:
            _, v = lru.popitem(last=False); used -= v
    return miss / 1e9, span

for name in sys.argv[1:] or ["qwen3-30b-a3b", "olmoe"]:
    H, I, E, k, T = SHAPES[name]
    for zipf in (False, True):
        rows = expert_rows(E, k, T, zipf, random.Random(1))
        for seg in (0, 32, 64):
            items = tiles_of(H, I, rows, seg)
            out = []
            for order in ("rr", "snake", "greedy"):
                for cap in (25, 50):
                    gb, span = simulate(items, order, cap)
                    out.append(f"{order}/{cap}MB {gb:.2f}GB span {span:.0f}")
            print(f"{name} {'zipf' if zipf else 'unif'} seg{seg}: " + "; ".join(out), flush=True)
