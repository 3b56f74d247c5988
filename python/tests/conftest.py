"""pytest configuration of the mok PyTorch tests (python/tests)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device and mok built with its GPU ops")
