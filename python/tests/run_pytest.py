"""CTest's entry to the mok PyTorch tests: pytest on this folder, or exit 77 (CTest's skip) with the
reason when torch or pytest is missing, or, with --cuda, when there is no GPU to run on.

    run_pytest.py [--cuda] [pytest arguments...]
"""

import importlib.util
import pathlib
import sys

SKIP = 77


def skip(reason: str) -> None:
    print(f"SKIP: {reason}")
    sys.exit(SKIP)


def main() -> int:
    args = sys.argv[1:]
    cuda = "--cuda" in args
    args = [a for a in args if a != "--cuda"]
    for module in ("torch", "pytest"):
        if importlib.util.find_spec(module) is None:
            skip(f"{module} is not importable by {sys.executable}; the mok PyTorch tests need it")
    if cuda:
        import torch

        import mok

        if not mok._C.HAS_CUDA:
            skip("mok._C was built without the GPU ops (no megakernel or a CPU-only torch)")
        if not torch.cuda.is_available():
            skip("no CUDA device")
    import pytest

    return pytest.main([str(pathlib.Path(__file__).parent), "-q", "-p", "no:cacheprovider", *args])


if __name__ == "__main__":
    sys.exit(main())
