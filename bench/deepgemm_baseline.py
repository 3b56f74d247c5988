#!/usr/bin/env python3
"""DeepGEMM grouped-GEMM baseline for MoE forward shapes (H100 / SM90, offline).

Run from the repo root:   python3 bench/deepgemm_baseline.py [--shapes kimi-k2,olmoe] [--precisions fp8,bf16]

The source tree (carried to the GPU machine, which has no network; 29 MB): DeepGEMM at 54e2261 with its
submodules' headers at their pinned commits, from any clone of the three repositories:
    mkdir -p .deps/deepgemm/third-party/cutlass .deps/deepgemm/third-party/fmt
    git -C DeepGEMM archive 54e22612409371d6364144b69086735beb54e98b | tar -x -C .deps/deepgemm
    git -C cutlass archive f3fde58372d33e9a5650ba7b80fc48b3b49d40c8 include LICENSE.txt | tar -x -C .deps/deepgemm/third-party/cutlass
    git -C fmt archive 553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28 include LICENSE | tar -x -C .deps/deepgemm/third-party/fmt
    cp docs/results/2026-12-07-h100-d/call3/DEPS_PROVENANCE.txt .deps/deepgemm/   # names them; part of the build stamp

What it does
  1. Copies the vendored DeepGEMM tree (.deps/deepgemm: DeepGEMM + cutlass/fmt headers at the
     submodule commits, see .deps/deepgemm/DEPS_PROVENANCE.txt) to $DG_BENCH_BUILD_ROOT
     (default /tmp/deepgemm_bench), links cutlass' cute/ and cutlass/ into deep_gemm/include
     (as DeepGEMM's develop.sh does) and builds the host extension deep_gemm._C with
     `python3 setup.py build_ext --inplace` (no network, no pip).  A fallback builds the same
     single translation unit with a direct g++ command.  Builds are cached by a source/toolchain
     stamp, so a second run on a warm machine skips the build.
  2. Imports deep_gemm from that copy, JIT-compiles every needed kernel in parallel worker
     processes (shared DG_JIT_CACHE_DIR), then times, per MoE shape and precision, the two
     grouped GEMMs of the MoE forward with the m-grouped "contiguous" API:
        GEMM1: [sumM, H] x W1[e]^T, W1 [E, 2I, H] -> [sumM, 2I]
        GEMM2: [sumM, I] x W2[e]^T, W2 [E, H, I]  -> [sumM, H]
     FP8 E4M3 with fine-grained FP32 scales (activations 1x128, weights 128x128) and BF16.
     Timing: CUDA events around the GEMM only; before each timed launch a 256 MiB buffer is
     written so L2 holds none of the inputs; median of --iters launches after --warmup warm-ups
     (the JIT/first call is done separately and never timed).
  3. Measures dense peaks in the same process (torch.mm bf16 and torch._scaled_mm e4m3, 8192^3),
     checks a few output rows of every GEMM against a float32 reference built from the
     (dequantized) operands, prints a summary table and exits non-zero on build/import failure (2)
     or on a failed correctness check (3).
"""
import argparse
import glob
import hashlib
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import SHAPES  # noqa: E402  (bench/shapes.py: name -> (H, I, E, k, T), as mok-bench runs them)

REPO = Path(__file__).resolve().parents[1]
SRC = Path(os.environ.get('DG_BENCH_SRC', REPO / '.deps' / 'deepgemm'))
BUILD_ROOT = Path(os.environ.get('DG_BENCH_BUILD_ROOT', '/tmp/deepgemm_bench'))
WORK = BUILD_ROOT / 'DeepGEMM'          # built copy of the source tree; importable package root
JIT_CACHE = BUILD_ROOT / 'jit_cache'    # DG_JIT_CACHE_DIR
BUILD_LOG = BUILD_ROOT / 'build.log'
STAMP = BUILD_ROOT / 'build_stamp.json'
CUDA_HOME = os.environ.get('CUDA_HOME') or os.environ.get('CUDA_PATH') or '/usr/local/cuda'

PRECISIONS = ('fp8', 'bf16')
GEMMS = ('gemm1', 'gemm2')
REL_ERR_TOL = 1e-2
SCRUB_BYTES = 256 * 1024 * 1024

T0 = time.time()


def log(msg: str) -> None:
    print(f'[{time.strftime("%H:%M:%S")} +{time.time() - T0:6.1f}s] {msg}', flush=True)


def die(msg: str, code: int = 2, log_path: Path = None, tail: int = 80) -> None:
    print('\n' + '=' * 100, flush=True)
    print(f'ERROR: {msg}', flush=True)
    if log_path is not None and Path(log_path).exists():
        lines = Path(log_path).read_text(errors='replace').splitlines()
        print(f'--- last {min(tail, len(lines))} lines of {log_path} ---')
        print('\n'.join(lines[-tail:]))
        print('--- end of log ---')
    print('=' * 100, flush=True)
    sys.exit(code)


def tail_text(text: str, n: int = 40) -> str:
    return '\n'.join(text.splitlines()[-n:])


# ----------------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------------
def setup_env() -> None:
    """Environment for DeepGEMM's build and JIT (NVCC path by default)."""
    os.environ['CUDA_HOME'] = CUDA_HOME                      # read by deep_gemm._find_cuda_home and setup.py
    cuda_bin = os.path.join(CUDA_HOME, 'bin')
    if cuda_bin not in os.environ.get('PATH', '').split(os.pathsep):
        os.environ['PATH'] = cuda_bin + os.pathsep + os.environ.get('PATH', '')
    os.environ['DG_JIT_CACHE_DIR'] = str(JIT_CACHE)          # default would be $HOME/.deep_gemm
    os.environ.setdefault('DG_JIT_USE_NVRTC', '0')           # NVCC (the performance path)
    os.environ.setdefault('TORCH_CUDA_ARCH_LIST', '9.0')
    os.environ.setdefault('PYTHONDONTWRITEBYTECODE', '1')


def preflight_toolchain() -> None:
    nvcc = os.path.join(CUDA_HOME, 'bin', 'nvcc')
    cuobjdump = os.path.join(CUDA_HOME, 'bin', 'cuobjdump')
    if not os.path.exists(nvcc):
        die(f'{nvcc} not found (DeepGEMM JIT-compiles every kernel with NVCC). Set CUDA_HOME to a CUDA toolkit.')
    if not os.path.exists(cuobjdump):
        # Built against CUDA >= 12.4 headers, DeepGEMM loads cubins via cuLibraryEnumerateKernels
        # (DG_JIT_USE_LIBRARY_ENUM_KERNELS in csrc/jit/handle.hpp); cuobjdump only serves DG_JIT_DUMP_SASS.
        log(f'note: {cuobjdump} not found (not needed with CUDA >= 12.4 headers)')
    for d in ('include/cuda.h', 'include/nvrtc.h', 'include/cublasLt.h', 'include/cccl'):
        if not os.path.exists(os.path.join(CUDA_HOME, d)):
            die(f'{CUDA_HOME}/{d} not found; needed to build deep_gemm._C')
    if not SRC.joinpath('setup.py').exists():
        die(f'DeepGEMM source tree not found at {SRC} (expected .deps/deepgemm next to bench/)')
    try:
        out = subprocess.run([nvcc, '--version'], capture_output=True, text=True, timeout=60).stdout
        log(f'nvcc: {out.strip().splitlines()[-1] if out.strip() else "?"}')
    except Exception as e:  # noqa
        log(f'WARNING: nvcc --version failed: {e}')


# ----------------------------------------------------------------------------------------------
# Build
# ----------------------------------------------------------------------------------------------
def source_fingerprint() -> str:
    h = hashlib.sha256()
    files = [SRC / 'setup.py', SRC / 'DEPS_PROVENANCE.txt']
    for sub in ('csrc', 'deep_gemm', 'third-party/cutlass/include/cutlass/version.h'):
        p = SRC / sub
        files += sorted(q for q in p.rglob('*') if q.is_file()) if p.is_dir() else [p]
    for f in files:
        if f.exists():
            h.update(str(f.relative_to(SRC)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def torch_build_info():
    import torch
    from torch.utils import cpp_extension
    return {
        'torch': torch.__version__,
        'torch_cuda': torch.version.cuda,
        'cxx11_abi': int(torch.compiled_with_cxx11_abi()),
        'python': sys.version.split()[0],
        'ext_suffix': sysconfig.get_config_var('EXT_SUFFIX'),
        'torch_includes': cpp_extension.include_paths(),
        'torch_lib': os.path.join(os.path.dirname(torch.__file__), 'lib'),
    }


def system_compiler(name: str, override: str, inherited: str) -> str:
    """$override (DG_BENCH_CXX, DG_BENCH_CC), else the system's /usr/bin/<name>, else $inherited (CXX, CC), else <name>.
    The system's before an inherited $CXX / $CC: the GPU machine sets both to its own /opt/gcc, whose build of the
    extension crashed at the first GEMM call in std::regex's locale code, a second libstdc++ beside the one torch
    loads (docs/benchmarks.md, sessions 68 and 69). setuptools compiles the C++ sources and links with $CC, so both."""
    system = f'/usr/bin/{name}'
    return os.environ.get(override) or (system if os.path.exists(system) else os.environ.get(inherited) or name)


def host_cxx() -> str:
    return system_compiler('g++', 'DG_BENCH_CXX', 'CXX')


def host_cc() -> str:
    return system_compiler('gcc', 'DG_BENCH_CC', 'CC')


def detect_cxx_std(info) -> str:
    """DeepGEMM's setup.py hard-codes -std=c++17; newer torch headers #error unless C++20."""
    forced = os.environ.get('DG_BENCH_CXX_STD')
    if forced:
        return forced
    cxx = host_cxx()
    py_inc = sysconfig.get_paths()['include']
    incs = [f'-I{p}' for p in info['torch_includes'] + [py_inc, f'{CUDA_HOME}/include']]
    try:
        r = subprocess.run([cxx, '-std=c++17', '-E', '-x', 'c++', '-', '-o', os.devnull, *incs],
                           input='#include <torch/python.h>\n', capture_output=True, text=True, timeout=120)
    except Exception as e:  # noqa
        log(f'WARNING: C++ standard probe failed to run ({e}); keeping c++17')
        return '17'
    if r.returncode == 0:
        return '17'
    if 'C++20' in r.stderr or 'c++20' in r.stderr:
        return '20'
    log('WARNING: preprocessing <torch/python.h> with -std=c++17 failed for another reason '
        '(the build will likely fail the same way):\n' + tail_text(r.stderr, 15))
    return '17'


def make_shims(info) -> str:
    """setup.py imports `wheel.bdist_wheel` and `packaging.version`; provide local shims only if absent."""
    shim = BUILD_ROOT / 'shim'
    need = []
    try:
        importlib.import_module('wheel.bdist_wheel')
    except Exception:
        need.append('wheel')
    if importlib.util.find_spec('packaging') is None:
        need.append('packaging')
    if not need:
        return ''
    shutil.rmtree(shim, ignore_errors=True)
    if 'wheel' in need:
        (shim / 'wheel').mkdir(parents=True)
        (shim / 'wheel' / '__init__.py').write_text('')
        (shim / 'wheel' / 'bdist_wheel.py').write_text(
            '# shim written by deepgemm_baseline.py: setup.py only subclasses it (build_ext never runs it)\n'
            'try:\n    from setuptools.command.bdist_wheel import bdist_wheel\n'
            'except Exception:\n    from setuptools import Command\n\n'
            '    class bdist_wheel(Command):\n        user_options = []\n\n'
            '        def initialize_options(self):\n            pass\n\n'
            '        def finalize_options(self):\n            pass\n\n'
            '        def run(self):\n            raise RuntimeError("bdist_wheel unavailable (shim)")\n')
    if 'packaging' in need:
        (shim / 'packaging').mkdir(parents=True)
        (shim / 'packaging' / '__init__.py').write_text('')
        (shim / 'packaging' / 'version.py').write_text(
            'try:\n    from torch._vendor.packaging.version import parse, Version\n'
            'except Exception:\n    from setuptools._vendor.packaging.version import parse, Version\n')
    log(f'note: python module(s) {need} missing; using local shims in {shim} for setup.py')
    return str(shim)


def prepare_work_tree(cxx_std: str) -> None:
    if WORK.exists():
        shutil.rmtree(WORK)
    shutil.copytree(SRC, WORK, symlinks=True,
                    ignore=shutil.ignore_patterns('__pycache__', 'build', '*.so', '*.egg-info'))
    inc = WORK / 'deep_gemm' / 'include'
    for name in ('cute', 'cutlass'):  # what develop.sh does: JIT uses -I<pkg>/include only
        dst = inc / name
        if dst.is_symlink() or dst.exists():
            dst.unlink() if dst.is_symlink() else shutil.rmtree(dst)
        dst.symlink_to(WORK / 'third-party' / 'cutlass' / 'include' / name, target_is_directory=True)
    if cxx_std != '17':
        sp = WORK / 'setup.py'
        text = sp.read_text()
        if "'-std=c++17'" not in text:
            log("WARNING: could not find '-std=c++17' in setup.py to patch")
        sp.write_text(text.replace("'-std=c++17'", f"'-std=c++{cxx_std}'"))
        log(f'patched the /tmp copy of setup.py: -std=c++17 -> -std=c++{cxx_std} (torch headers require it)')


def build_with_setup_py(info, shim: str, timeout: int) -> bool:
    env = dict(os.environ)
    env.update({
        'DG_USE_LOCAL_VERSION': '0',   # no `git status` (the copy is not a git checkout)
        'DG_FORCE_BUILD': '1',         # never try to download a prebuilt wheel (only bdist_wheel would)
        'DG_SKIP_CUDA_BUILD': '0',
        'MAX_JOBS': str(os.cpu_count() or 16),
        'CXX': host_cxx(),
        'CC': host_cc(),
        # The compilers' folder first, as call 7 of results/2026-12-07-h100-e ran it (setup.py runs as sys.executable).
        'PATH': os.pathsep.join(p for p in (os.path.dirname(host_cc()), env.get('PATH', '')) if p),
        # no rpath in setup.py; make libcudart/libnvrtc resolvable even if torch did not preload them
        'LDFLAGS': (env.get('LDFLAGS', '') + f' -Wl,-rpath,{CUDA_HOME}/lib64').strip(),
        # python's sysconfig adds -g; -g0 (last wins) makes the heavy single TU compile faster
        'CFLAGS': (env.get('CFLAGS', '') + ' -g0').strip(),
        'CXXFLAGS': (env.get('CXXFLAGS', '') + ' -g0').strip(),
    })
    if shim:
        env['PYTHONPATH'] = shim + os.pathsep + env.get('PYTHONPATH', '')
    cmd = [sys.executable, 'setup.py', 'build_ext', '--inplace', '--build-temp', str(BUILD_ROOT / 'build_temp')]
    log(f'build (setup.py, CC={env["CC"]}, CXX={env["CXX"]}): cd {WORK} && {" ".join(cmd)}')
    with open(BUILD_LOG, 'w') as f:
        f.write(f'$ cd {WORK} && {" ".join(cmd)}\n')
        f.flush()
        try:
            r = subprocess.run(cmd, cwd=WORK, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            f.write(f'\n*** build timed out after {timeout}s ***\n')
            return False
    return r.returncode == 0 and bool(glob.glob(str(WORK / 'deep_gemm' / '_C*.so')))


def build_direct(info, cxx_std: str, timeout: int) -> bool:
    """Fallback: the same TU and flags setup.py would use, compiled and linked by one g++ call."""
    cxx = host_cxx()
    out = WORK / 'deep_gemm' / f'_C{info["ext_suffix"]}'
    incs = [f'{CUDA_HOME}/include', f'{CUDA_HOME}/include/cccl', 'deep_gemm/include',
            'third-party/cutlass/include', 'third-party/fmt/include',
            *info['torch_includes'], sysconfig.get_paths()['include']]
    cmd = [cxx, '-shared', '-fPIC', '-O3', f'-std=c++{cxx_std}', '-Wno-psabi', '-Wno-deprecated-declarations',
           f'-D_GLIBCXX_USE_CXX11_ABI={info["cxx11_abi"]}', '-DTORCH_API_INCLUDE_EXTENSION_H',
           '-DTORCH_EXTENSION_NAME=_C', *[f'-I{p}' for p in incs], 'csrc/python_api.cpp', '-o', str(out),
           f'-L{info["torch_lib"]}', f'-L{CUDA_HOME}/lib64',
           '-lc10', '-ltorch', '-ltorch_cpu', '-ltorch_python', '-lc10_cuda', '-ltorch_cuda', '-lcudart', '-lnvrtc',
           f'-Wl,-rpath,{CUDA_HOME}/lib64']
    log('build (fallback, direct g++): ' + ' '.join(cmd[:8]) + ' ...')
    with open(BUILD_LOG, 'a') as f:
        f.write('\n\n$ ' + ' '.join(cmd) + '\n')
        f.flush()
        try:
            r = subprocess.run(cmd, cwd=WORK, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            f.write(f'\n*** build timed out after {timeout}s ***\n')
            return False
    return r.returncode == 0 and out.exists()


def build_deepgemm(args) -> bool:
    """Returns True when a cached build was reused."""
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    info = torch_build_info()
    log(f'torch {info["torch"]} (CUDA {info["torch_cuda"]}, cxx11_abi={info["cxx11_abi"]}), python {info["python"]}')
    stamp = {'src': source_fingerprint(), 'torch': info['torch'], 'python': info['python'],
             'cuda_home': CUDA_HOME, 'cxx': host_cxx(), 'cc': host_cc(), 'cxx_std_override': os.environ.get('DG_BENCH_CXX_STD', '')}
    if (not args.rebuild and STAMP.exists() and glob.glob(str(WORK / 'deep_gemm' / '_C*.so'))
            and json.loads(STAMP.read_text()) == stamp):
        log(f'build: cached build in {WORK} matches the sources and toolchain; skipping the build')
        return True
    if not glob.glob(sysconfig.get_paths()['include'] + '/Python.h'):
        log(f'WARNING: Python.h not found in {sysconfig.get_paths()["include"]} (python3-dev); the build will fail')
    cxx_std = detect_cxx_std(info)
    log(f'build start: C++ standard for the host extension: c++{cxx_std}')
    shim = make_shims(info)
    prepare_work_tree(cxx_std)
    t = time.time()
    ok = build_with_setup_py(info, shim, args.build_timeout)
    if not ok:
        log(f'setup.py build failed after {time.time() - t:.0f}s; log tail:')
        print(tail_text(BUILD_LOG.read_text(errors='replace'), 40), flush=True)
        remaining = max(60, args.build_timeout - int(time.time() - t))
        ok = build_direct(info, cxx_std, remaining)
    if not ok:
        die('DeepGEMM could not be built (both setup.py build_ext and the direct g++ fallback failed).',
            log_path=BUILD_LOG)
    so = glob.glob(str(WORK / 'deep_gemm' / '_C*.so'))[0]
    log(f'build end: {so} ({os.path.getsize(so) / 2**20:.1f} MiB) in {time.time() - t:.0f}s')
    STAMP.write_text(json.dumps(stamp))
    return False


def import_deepgemm(fatal: bool = True):
    if str(WORK) not in sys.path:
        sys.path.insert(0, str(WORK))
    try:
        import deep_gemm
    except Exception:
        print(traceback.format_exc(), flush=True)
        if not fatal:
            return None
        die(f'`import deep_gemm` from {WORK} failed (see traceback above). '
            f'Try --rebuild; build log: {BUILD_LOG}', log_path=BUILD_LOG, tail=30)
    if not str(Path(deep_gemm.__file__).resolve()).startswith(str(WORK.resolve())):
        die(f'imported deep_gemm from {deep_gemm.__file__}, not from {WORK} (another install shadows it)')
    for fn in ('m_grouped_fp8_gemm_nt_contiguous', 'm_grouped_bf16_gemm_nt_contiguous',
               'transform_sf_into_required_layout', 'get_theoretical_mk_alignment_for_contiguous_layout',
               'set_mk_alignment_for_contiguous_layout', 'get_mk_alignment_for_contiguous_layout'):
        if not hasattr(deep_gemm, fn):
            die(f'deep_gemm has no `{fn}` (extension built without CUDA>=12.1 tensor-map support?)')
    return deep_gemm


# ----------------------------------------------------------------------------------------------
# Problem construction
# ----------------------------------------------------------------------------------------------
def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def group_layout(T: int, k: int, E: int, alignment: int):
    """Uniform routing: T*k rows split evenly over E experts; each segment padded to `alignment`."""
    base, rem = divmod(T * k, E)
    ms = [base + (1 if e < rem else 0) for e in range(E)]
    aligned = [align_up(m, alignment) for m in ms]
    return ms, aligned


def make_m_indices(ms, aligned, device='cuda'):
    import torch
    idx = torch.empty(sum(aligned), dtype=torch.int32)
    start = 0
    for e, (m, a) in enumerate(zip(ms, aligned)):
        idx[start:start + m] = e
        idx[start + m:start + a] = -1   # padding rows: DeepGEMM skips blocks whose index is -1
        start += a
    return idx.to(device)


def gemm_dims(shape_name: str, gemm: str):
    H, I, E, k, T = SHAPES[shape_name]
    return (2 * I, H) if gemm == 'gemm1' else (H, I)   # (N, K)


def cast_per_token_fp8(x, chunk: int = 8192):
    """x [M, K] bf16 -> (e4m3 [M, K], fp32 scales [M, K/128]); scale = amax(1x128) / 448."""
    import torch
    M, K = x.shape
    assert K % 128 == 0
    q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    sf = torch.empty((M, K // 128), dtype=torch.float32, device=x.device)
    for s in range(0, M, chunk):
        xv = x[s:s + chunk].float().view(-1, K // 128, 128)
        scale = xv.abs().amax(dim=2).clamp(min=1e-4) / 448.0
        q[s:s + chunk] = (xv / scale.unsqueeze(2)).to(torch.float8_e4m3fn).view(-1, K)
        sf[s:s + chunk] = scale
    return q, sf


def cast_per_block_fp8(w):
    """w [E, N, K] bf16 -> (e4m3 [E, N, K], fp32 scales [E, N/128, K/128]); 128x128 blocks."""
    import torch
    E, N, K = w.shape
    assert N % 128 == 0 and K % 128 == 0
    q = torch.empty((E, N, K), dtype=torch.float8_e4m3fn, device=w.device)
    sf = torch.empty((E, N // 128, K // 128), dtype=torch.float32, device=w.device)
    for e in range(E):
        wv = w[e].float().view(N // 128, 128, K // 128, 128)
        scale = wv.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-4) / 448.0
        q[e] = (wv / scale).to(torch.float8_e4m3fn).view(N, K)
        sf[e] = scale.view(N // 128, K // 128)
    return q, sf


def make_gemm_call(dg, prec: str, a, w, d, m_indices):
    """Returns a zero-arg callable launching exactly one DeepGEMM grouped GEMM.
    fp8: a = (a_fp8, sfa) and w = (w_fp8, sfb); sfa is pre-transformed to DeepGEMM's MN-major,
    TMA-aligned layout here so the timed call launches only the GEMM kernel."""
    if prec == 'bf16':
        return lambda: dg.m_grouped_bf16_gemm_nt_contiguous(a, w, d, m_indices)
    a_fp8, sfa = a
    M, K = a_fp8.shape
    sfa_t = dg.transform_sf_into_required_layout(sfa, M, K, recipe=(1, 128, 128), is_sfa=True,
                                                 disable_ue8m0_cast=True)
    return lambda: dg.m_grouped_fp8_gemm_nt_contiguous((a_fp8, sfa_t), w, d, m_indices,
                                                       disable_ue8m0_cast=True)


def count_jit_kernels() -> int:
    return len(glob.glob(str(JIT_CACHE / 'cache' / 'kernel.*')))


# ----------------------------------------------------------------------------------------------
# Parallel JIT warm-up (NVCC compiles are single-threaded; kernels are keyed by code hash, so
# worker processes filling the shared DG_JIT_CACHE_DIR give the main process cache hits)
# ----------------------------------------------------------------------------------------------
def jit_worker(spec: str) -> None:
    import torch
    shape_name, prec, gemm = spec.split(':')
    dg = import_deepgemm()
    H, I, E, k, T = SHAPES[shape_name]
    alignment = dg.get_theoretical_mk_alignment_for_contiguous_layout()
    dg.set_mk_alignment_for_contiguous_layout(alignment)
    ms, aligned = group_layout(T, k, E, alignment)
    M = sum(aligned)
    N, K = gemm_dims(shape_name, gemm)
    m_indices = make_m_indices(ms, aligned)
    d = torch.empty((M, N), dtype=torch.bfloat16, device='cuda')
    if prec == 'bf16':
        a = torch.zeros((M, K), dtype=torch.bfloat16, device='cuda')
        w = torch.zeros((E, N, K), dtype=torch.bfloat16, device='cuda')
    else:
        a = (torch.zeros((M, K), dtype=torch.float8_e4m3fn, device='cuda'),
             torch.ones((M, K // 128), dtype=torch.float32, device='cuda'))
        w = (torch.zeros((E, N, K), dtype=torch.float8_e4m3fn, device='cuda'),
             torch.ones((E, N // 128, K // 128), dtype=torch.float32, device='cuda'))
    t = time.time()
    make_gemm_call(dg, prec, a, w, d, m_indices)()
    torch.cuda.synchronize()
    print('JITWORKER ' + json.dumps({'spec': spec, 'seconds': time.time() - t}), flush=True)


def worker_mem_estimate(spec: str) -> int:
    shape_name, prec, gemm = spec.split(':')
    H, I, E, k, T = SHAPES[shape_name]
    N, K = gemm_dims(shape_name, gemm)
    M = T * k + E * 128
    el = 1 if prec == 'fp8' else 2
    return M * K * el + E * N * K * el + M * N * 2 + (1 << 30)   # + ~1 GiB context/workspace


def prewarm_jit(specs, max_workers: int, timeout: int) -> None:
    import torch
    if not specs:
        return
    free, _ = torch.cuda.mem_get_info()
    budget = int(free * 0.7)
    log(f'JIT warm-up: {len(specs)} kernels in up to {max_workers} parallel processes '
        f'(cache {JIT_CACHE}, {count_jit_kernels()} kernels cached)')
    pending = sorted(specs, key=worker_mem_estimate, reverse=True)
    running = {}   # spec -> (Popen, start, mem, logfile)
    failed = []
    t_all = time.time()
    while pending or running:
        launched = True
        while pending and len(running) < max_workers and launched:
            launched = False
            for spec in list(pending):
                mem = worker_mem_estimate(spec)
                if not running or sum(r[2] for r in running.values()) + mem <= budget:
                    lf = open(BUILD_ROOT / f'jit_{spec.replace(":", "_")}.log', 'w+')
                    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), '--_jit-worker', spec],
                                         stdout=lf, stderr=subprocess.STDOUT, env=dict(os.environ))
                    running[spec] = (p, time.time(), mem, lf)
                    pending.remove(spec)
                    launched = True
                    break
        time.sleep(0.2)
        for spec, (p, t, mem, lf) in list(running.items()):
            rc = p.poll()
            if rc is None and time.time() - t > timeout:
                p.kill()
                rc = 'timeout'
            if rc is None:
                continue
            del running[spec]
            lf.seek(0)
            out = lf.read()
            lf.close()
            if rc == 0 and 'JITWORKER' in out:
                log(f'  JIT compiled {spec:<26} {time.time() - t:6.1f}s  (cache: {count_jit_kernels()} kernels)')
            else:
                failed.append(spec)
                log(f'  JIT worker {spec} FAILED (rc={rc}); output tail:\n{tail_text(out, 25)}')
    log(f'JIT warm-up done in {time.time() - t_all:.1f}s; {count_jit_kernels()} kernels cached'
        + (f'; {len(failed)} failed (main process will retry them serially)' if failed else ''))


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------
class Timer:
    def __init__(self, iters: int, warmup: int):
        import torch
        self.iters, self.warmup = iters, warmup
        self.scrub = torch.empty(SCRUB_BYTES, dtype=torch.int8, device='cuda')

    def first_call(self, fn) -> float:
        import torch
        torch.cuda.synchronize()
        t = time.time()
        fn()
        torch.cuda.synchronize()
        return time.time() - t

    def median_ms(self, fn) -> float:
        import torch
        for _ in range(self.warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        torch.cuda._sleep(1_000_000)   # let the host run ahead so launch overhead never shows up between events
        for i in range(self.iters):
            self.scrub.fill_(i % 100 + 1)   # 256 MiB write: evicts the GEMM inputs from the 50 MB L2
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def dense_peaks(timer: Timer):
    import torch
    res = {}
    n = 8192
    flops = 2 * n ** 3
    a = torch.randn((n, n), dtype=torch.bfloat16, device='cuda')
    b = torch.randn((n, n), dtype=torch.bfloat16, device='cuda')
    c = torch.empty((n, n), dtype=torch.bfloat16, device='cuda')
    try:
        timer.first_call(lambda: torch.mm(a, b, out=c))
        ms = timer.median_ms(lambda: torch.mm(a, b, out=c))
        res['torch.mm bf16'] = (ms, flops / ms / 1e9)
    except Exception as e:  # noqa
        res['torch.mm bf16'] = (float('nan'), float('nan'))
        log(f'torch.mm bf16 failed: {e}')
    try:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn)          # [N, K] row-major; b8.t() is the column-major mat2
        one = torch.ones((), dtype=torch.float32, device='cuda')
        fn = lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa
        timer.first_call(fn)
        ms = timer.median_ms(fn)
        res['torch._scaled_mm e4m3'] = (ms, flops / ms / 1e9)
    except Exception as e:  # noqa
        res['torch._scaled_mm e4m3'] = (float('nan'), float('nan'))
        log(f'torch._scaled_mm e4m3 (per-tensor scales) failed: {type(e).__name__}: {e}')
    for k_, (ms, tf) in res.items():
        log(f'dense peak {k_:<22} 8192^3: {ms:8.3f} ms  {tf:7.1f} TFLOP/s')
    return res


# ----------------------------------------------------------------------------------------------
# Correctness spot check
# ----------------------------------------------------------------------------------------------
def check_rows(prec, a, w, d, ms, aligned) -> float:
    """Relative L2 error of a few output rows (first/middle/last row of 3 experts) vs a float32
    reference from the (dequantized) operands actually fed to the kernel."""
    import torch
    E = len(ms)
    starts = [0]
    for x in aligned[:-1]:
        starts.append(starts[-1] + x)
    num, den = 0.0, 0.0
    for e in sorted({0, E // 2, E - 1}):
        rows = torch.tensor(sorted({starts[e], starts[e] + ms[e] // 2, starts[e] + ms[e] - 1}), device=d.device)
        if prec == 'bf16':
            ar, we = a.index_select(0, rows).float(), w[e].float()
        else:
            (a8, sfa), (w8, sfb) = a, w
            ar = a8.index_select(0, rows).float() * sfa.index_select(0, rows).repeat_interleave(128, dim=1)
            we = w8[e].float() * sfb[e].repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
        ref = ar @ we.t()
        out = d.index_select(0, rows).float()
        num += (out - ref).pow(2).sum().item()
        den += ref.pow(2).sum().item()
        del we
    return math.sqrt(num / max(den, 1e-30))


# ----------------------------------------------------------------------------------------------
# Main benchmark
# ----------------------------------------------------------------------------------------------
def run_shape(dg, timer, name, precisions, alignment):
    import torch
    H, I, E, k, T = SHAPES[name]
    ms, aligned = group_layout(T, k, E, alignment)
    sum_m, sum_m_pad = T * k, sum(aligned)
    pad_rows = sum_m_pad - sum_m
    flops1, flops2 = 2 * sum_m * (2 * I) * H, 2 * sum_m * I * H
    log(f'shape {name}: H={H} I={I} E={E} k={k} T={T}  M_e={ms[0]}{"(+1 on some)" if len(set(ms)) > 1 else ""} '
        f'-> aligned {aligned[0]} (alignment {alignment}), sumM={sum_m}, padded sumM={sum_m_pad}, '
        f'padding rows={pad_rows}')
    m_indices = make_m_indices(ms, aligned)
    valid = (m_indices >= 0).unsqueeze(1)
    torch.manual_seed(0)
    x1 = torch.randn((sum_m_pad, H), dtype=torch.bfloat16, device='cuda') * valid
    w1 = torch.randn((E, 2 * I, H), dtype=torch.bfloat16, device='cuda')
    x2 = torch.randn((sum_m_pad, I), dtype=torch.bfloat16, device='cuda') * valid
    w2 = torch.randn((E, H, I), dtype=torch.bfloat16, device='cuda')
    d1 = torch.empty((sum_m_pad, 2 * I), dtype=torch.bfloat16, device='cuda')
    d2 = torch.empty((sum_m_pad, H), dtype=torch.bfloat16, device='cuda')
    results = []
    for prec in precisions:
        if prec == 'fp8':
            a1, b1 = cast_per_token_fp8(x1), cast_per_block_fp8(w1)
            a2, b2 = cast_per_token_fp8(x2), cast_per_block_fp8(w2)
        else:
            a1, b1, a2, b2 = x1, w1, x2, w2
        row = {'shape': name, 'prec': prec, 'H': H, 'I': I, 'E': E, 'k': k, 'T': T, 'M_e': ms[0],
               'M_e_aligned': aligned[0], 'alignment': alignment, 'sum_m': sum_m, 'sum_m_padded': sum_m_pad,
               'padding_rows': pad_rows}
        try:
            for g, (a, b, d) in (('gemm1', (a1, b1, d1)), ('gemm2', (a2, b2, d2))):
                fn = make_gemm_call(dg, prec, a, b, d, m_indices)
                before = count_jit_kernels()
                t_first = timer.first_call(fn)
                new = count_jit_kernels() - before
                log(f'  {prec} {g}: first call (JIT) {t_first:6.2f}s '
                    f'({"compiled " + str(new) + " new kernel(s)" if new else "cache hit"})')
                row[f'{g}_ms'] = timer.median_ms(fn)
                row[f'{g}_relerr'] = check_rows(prec, a, b, d, ms, aligned)
                row[f'{g}_jit_s'] = t_first
        except Exception as e:  # noqa
            print(traceback.format_exc(), flush=True)
            log(f'  {prec}: FAILED: {type(e).__name__}: {e}')
            row['error'] = f'{type(e).__name__}: {e}'
            results.append(row)
            continue
        row['sum_ms'] = row['gemm1_ms'] + row['gemm2_ms']
        row['tflops'] = (flops1 + flops2) / row['sum_ms'] / 1e9
        row['gemm1_tflops'] = flops1 / row['gemm1_ms'] / 1e9
        row['gemm2_tflops'] = flops2 / row['gemm2_ms'] / 1e9
        row['ok'] = row['gemm1_relerr'] < REL_ERR_TOL and row['gemm2_relerr'] < REL_ERR_TOL
        log(f'  {prec}: GEMM1 {row["gemm1_ms"]:.3f} ms ({row["gemm1_tflops"]:.0f} TF/s)  '
            f'GEMM2 {row["gemm2_ms"]:.3f} ms ({row["gemm2_tflops"]:.0f} TF/s)  sum {row["sum_ms"]:.3f} ms '
            f'-> {row["tflops"]:.1f} TFLOP/s | rel.err GEMM1 {row["gemm1_relerr"]:.2e} GEMM2 '
            f'{row["gemm2_relerr"]:.2e} {"OK" if row["ok"] else "FAIL (>= %.0e)" % REL_ERR_TOL}')
        results.append(row)
        if prec == 'fp8':
            del a1, b1, a2, b2
    del x1, w1, x2, w2, d1, d2
    torch.cuda.empty_cache()
    return results


def print_table(results, peaks, skipped):
    print('\n' + '=' * 124)
    print('DeepGEMM m-grouped contiguous GEMMs, MoE forward (uniform routing); times = median CUDA-event ms, '
          'L2 scrubbed before each launch')
    print('TFLOP/s = (2*sumM*2I*H + 2*sumM*I*H) / (GEMM1+GEMM2), sumM = T*k (unpadded rows)')
    print('-' * 124)
    hdr = (f'{"shape":<14} {"prec":<5} {"M_e":>5} {"pad":>4} {"sumM":>7} {"GEMM1 ms":>9} {"GEMM2 ms":>9} '
           f'{"sum ms":>8} {"TFLOP/s":>8} {"G1 TF/s":>8} {"G2 TF/s":>8} {"relerr1":>8} {"relerr2":>8} {"check":>6}')
    print(hdr)
    print('-' * 124)
    for r in results:
        if 'error' in r:
            print(f'{r["shape"]:<14} {r["prec"]:<5} {r["M_e"]:>5} {r["padding_rows"]:>4} {r["sum_m"]:>7}  ERROR: {r["error"][:70]}')
            continue
        print(f'{r["shape"]:<14} {r["prec"]:<5} {r["M_e"]:>5} {r["padding_rows"]:>4} {r["sum_m"]:>7} '
              f'{r["gemm1_ms"]:>9.3f} {r["gemm2_ms"]:>9.3f} {r["sum_ms"]:>8.3f} {r["tflops"]:>8.1f} '
              f'{r["gemm1_tflops"]:>8.1f} {r["gemm2_tflops"]:>8.1f} {r["gemm1_relerr"]:>8.1e} '
              f'{r["gemm2_relerr"]:>8.1e} {"OK" if r["ok"] else "FAIL":>6}')
    for s in skipped:
        print(f'{s:<14} SKIPPED (time budget)')
    print('-' * 124)
    for k_, (ms, tf) in peaks.items():
        print(f'dense peak {k_:<24} 8192x8192x8192: {ms:8.3f} ms  {tf:7.1f} TFLOP/s')
    print('=' * 124, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--shapes', default=','.join(SHAPES), help=f'comma list from: {", ".join(SHAPES)}')
    ap.add_argument('--precisions', default='fp8,bf16', help='comma list from: fp8, bf16')
    ap.add_argument('--iters', type=int, default=20)
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--jit-workers', type=int, default=min(16, os.cpu_count() or 8),
                    help='parallel JIT warm-up processes (0: compile serially in the main process)')
    ap.add_argument('--jit-timeout', type=int, default=300, help='seconds per JIT warm-up process')
    ap.add_argument('--build-timeout', type=int, default=360)
    ap.add_argument('--time-budget', type=float, default=450,
                    help='skip remaining shapes once this many seconds have elapsed')
    ap.add_argument('--rebuild', action='store_true', help='ignore a cached build in $DG_BENCH_BUILD_ROOT')
    ap.add_argument('--build-only', action='store_true')
    ap.add_argument('--no-dense', action='store_true', help='skip the torch dense peak measurements')
    ap.add_argument('--json', default='', help='also write the results to this JSON file')
    ap.add_argument('--_jit-worker', dest='jit_worker', default='', help=argparse.SUPPRESS)
    args = ap.parse_args()

    setup_env()
    if args.jit_worker:
        jit_worker(args.jit_worker)
        return

    shapes = [s.strip() for s in args.shapes.split(',') if s.strip()]
    precisions = [p.strip() for p in args.precisions.split(',') if p.strip()]
    bad = [s for s in shapes if s not in SHAPES] + [p for p in precisions if p not in PRECISIONS]
    if bad:
        die(f'unknown shape/precision: {bad}; shapes: {list(SHAPES)}, precisions: {list(PRECISIONS)}', code=1)

    log(f'DeepGEMM baseline: shapes={shapes} precisions={precisions}; source {SRC}; build root {BUILD_ROOT}; '
        f'CUDA_HOME={CUDA_HOME}')
    try:
        import torch
    except Exception as e:  # noqa
        die(f'cannot import torch: {e}')
    preflight_toolchain()
    cached = build_deepgemm(args)
    dg = import_deepgemm(fatal=not cached)
    if dg is None:   # a stale cached build: rebuild once in a fresh process
        log('import of the cached build failed; rebuilding (--rebuild) in a fresh process')
        STAMP.unlink(missing_ok=True)
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:], '--rebuild'])
    log(f'imported deep_gemm {getattr(dg, "__version__", "?")} from {Path(dg.__file__).parent}')
    if args.build_only:
        return

    if not torch.cuda.is_available():
        die('no CUDA device visible to torch')
    cap = torch.cuda.get_device_capability()
    log(f'device: {torch.cuda.get_device_name()} sm_{cap[0]}{cap[1]}, {torch.cuda.get_device_properties(0).multi_processor_count} SMs')
    if cap[0] != 9:
        log('WARNING: this harness targets SM90 (FP32 1x128/128x128 scales, 1D2D kernels); '
            'on SM100 DeepGEMM would add an in-call UE8M0 scale-packing kernel to the timed region')
    torch.backends.cuda.matmul.allow_tf32 = False

    alignment = dg.get_theoretical_mk_alignment_for_contiguous_layout()
    dg.set_mk_alignment_for_contiguous_layout(alignment)
    log(f'contiguous-layout M alignment: {alignment} (get_theoretical_mk_alignment_for_contiguous_layout)')

    if args.jit_workers > 0:
        specs = [f'{s}:{p}:{g}' for s in shapes for p in precisions for g in GEMMS]
        prewarm_jit(specs, args.jit_workers, args.jit_timeout)

    timer = Timer(args.iters, args.warmup)
    peaks = {} if args.no_dense else dense_peaks(timer)

    results, skipped = [], []
    for name in shapes:
        if time.time() - T0 > args.time_budget:
            log(f'time budget of {args.time_budget:.0f}s exceeded: skipping {name}')
            skipped.append(name)
            continue
        results += run_shape(dg, timer, name, precisions, alignment)

    print_table(results, peaks, skipped)
    if args.json:
        Path(args.json).write_text(json.dumps({'results': results, 'dense_peaks': peaks, 'skipped': skipped,
                                               'device': torch.cuda.get_device_name(),
                                               'torch': torch.__version__}, indent=1))
        log(f'wrote {args.json}')
    log('done')
    if any('error' in r for r in results):
        sys.exit(4)
    if any(not r.get('ok', False) for r in results):
        print(f'ERROR: correctness spot check failed (relative error >= {REL_ERR_TOL}) for: '
              + ', '.join(f'{r["shape"]}/{r["prec"]}' for r in results if not r.get('ok', False)), flush=True)
        sys.exit(3)


if __name__ == '__main__':
    main()
