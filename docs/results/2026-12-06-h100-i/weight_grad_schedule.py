"""The weight-gradient phase's schedule under Zipf routing, on the CPU (session 60; no GPU).

Per shape (mok-bench's six), the per-expert rows of a routing drawn as the reference's `given_routing` draws
uniform and zipf (s = 1.2: k distinct experts, expert e with weight (e + 1)^-s among those not taken; this
script's own random numbers, so not the same draw), the weight gradients' tiles as backward.cu lays them out
(dW1_e: (2I / 128) x (H / 256) tiles, dW2_e: (H / 128) x (I / 256), each with the expert's padded rows / 64
K-blocks, plus `EPILOGUE` K-blocks' worth for its store), longest chain first (order_longest_first), and the
time of the block that ends last against the ideal (total / blocks) for three assignments of tiles to the
132 persistent blocks: round-robin (gemm_tile_loop's today), a snake (every other round reversed), and
greedy to the least-loaded block (LPT, what claiming tiles at run time approaches).

    python3 weight_grad_schedule.py [shape ...]      # default: all six (a few minutes)
"""
import heapq
import random
import sys

SHAPES = {  # H, I, E, k, T (megakernel/tools/bench_common.h)
    "kimi-k2": (7168, 2048, 32, 8, 8192), "glm-5": (6144, 2048, 32, 8, 8192),
    "qwen3.5-397b": (4096, 1024, 64, 10, 8192), "deepseek-v4": (7168, 3072, 32, 6, 8192),
    "qwen3-30b-a3b": (2048, 768, 128, 8, 16384), "olmoe": (2048, 1024, 64, 8, 8192),
}
BLOCKS, EPILOGUE, ZIPF_S = 132, 4, 1.2


def expert_rows(E, k, T, zipf, rng):
    weight = [1 / (e + 1) ** ZIPF_S if zipf else 1.0 for e in range(E)]
    rows = [0] * E
    for _ in range(T):
        taken = set()
        for _ in range(k):
            u = rng.random() * sum(weight[e] for e in range(E) if e not in taken)
            for e in range(E):
                if e in taken:
                    continue
                u -= weight[e]
                if u <= 0:
                    break
            taken.add(e)
            rows[e] += 1
    return rows


def makespans(H, I, E, k, T, zipf):
    rows = expert_rows(E, k, T, zipf, random.Random(1))
    grads = []
    for e in range(E):
        k_blocks = -(-rows[e] // 128) * 128 // 64
        grads += [(k_blocks, (2 * I // 128) * (H // 256)), (k_blocks, (H // 128) * (I // 256))]
    tiles = [kb + EPILOGUE for w in sorted(range(len(grads)), key=lambda w: (-grads[w][0], w))
             for kb in [grads[w][0]] * grads[w][1]]
    ideal = sum(tiles) / BLOCKS
    round_robin, snake = [0] * BLOCKS, [0] * BLOCKS
    for t, cost in enumerate(tiles):
        r, b = divmod(t, BLOCKS)
        round_robin[b] += cost
        snake[b if r % 2 == 0 else BLOCKS - 1 - b] += cost
    heap = [(0, b) for b in range(BLOCKS)]
    for cost in tiles:
        end, b = heapq.heappop(heap)
        heapq.heappush(heap, (end + cost, b))
    greedy = max(end for end, _ in heap)
    return max(rows) / (T * k / E), max(round_robin) / ideal, max(snake) / ideal, greedy / ideal


if __name__ == "__main__":  # (session 61's l2_model.py imports its shapes and routings)
    for name in sys.argv[1:] or SHAPES:
        for zipf in (False, True):
            hot, rr, sn, lpt = makespans(*SHAPES[name], zipf)
            print(f"{name:14s} {'zipf' if zipf else 'uniform':7s} hottest expert {hot:4.1f}x the mean  "
                  f"last block / ideal: round-robin {rr:.3f}  snake {sn:.3f}  greedy {lpt:.3f}")
