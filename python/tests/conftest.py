"""pytest configuration of the mok PyTorch tests (python/tests)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device and mok built with its GPU ops")
    # Every GPU op's outputs and workspace start as 0xff bytes (helpers.assert_written finds what no kernel
    # wrote); a no-op where mok has no GPU ops. Imported here, after the tests' sys.path is set up.
    try:
        import mok
    except ImportError:
        return
    mok._C._set_poison_outputs(True)
