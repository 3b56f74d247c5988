"""The shapes of docs/benchmarks.md, as mok-bench (megakernel/tools/bench.cpp) runs them.
name: (H, I, E, k, T) — hidden, intermediate, experts, top-k, tokens."""
SHAPES = {
    "kimi-k2": (7168, 2048, 32, 8, 8192),
    "glm-5": (6144, 2048, 32, 8, 8192),
    "qwen3.5-397b": (4096, 1024, 64, 10, 8192),
    "deepseek-v4": (7168, 3072, 32, 6, 8192),
    "qwen3-30b-a3b": (2048, 768, 128, 8, 16384),
    "olmoe": (2048, 1024, 64, 8, 8192),
}
