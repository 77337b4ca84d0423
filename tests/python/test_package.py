"""The kjit package without torch and without a GPU: what CI checks on a CPU machine."""

import ctypes
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import kjit
from kjit import _capi

from conftest import HAS_TORCH


def _driver_present() -> bool:
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def test_abi_and_version_match_the_native_library():
    assert kjit.abi_version() == kjit.ABI_VERSION == 6
    assert kjit.version() == kjit.__version__
    assert kjit.full_version().startswith(f"kjit {kjit.__version__} (NVRTC ")


@pytest.mark.parametrize("struct, init", [
    (_capi.RuntimeOptions, "kjit_runtime_options_init"),
    (_capi.RmsNormSpec, "kjit_rms_norm_spec_init"),
    (_capi.RmsNormForwardArgs, "kjit_rms_norm_forward_args_init"),
    (_capi.RmsNormBackwardArgs, "kjit_rms_norm_backward_args_init"),
    (_capi.CrossEntropySpec, "kjit_cross_entropy_spec_init"),
    (_capi.CrossEntropyArgs, "kjit_cross_entropy_args_init"),
    (_capi.CrossEntropyBackwardArgs, "kjit_cross_entropy_backward_args_init"),
    (_capi.CrossEntropyRescaleArgs, "kjit_cross_entropy_rescale_args_init"),
    (_capi.LinearCrossEntropySpec, "kjit_linear_cross_entropy_spec_init"),
    (_capi.LinearCrossEntropyArgs, "kjit_linear_cross_entropy_args_init"),
    (_capi.LinearCrossEntropyRescaleArgs, "kjit_linear_cross_entropy_rescale_args_init"),
])
def test_ctypes_structs_have_the_librarys_layout(struct, init):
    # *_init writes sizeof into struct_size and every default, the last field's included.
    value = _capi.init(struct, init)
    assert value.struct_size == ctypes.sizeof(struct)
    if struct in (_capi.CrossEntropySpec, _capi.LinearCrossEntropySpec):
        # The embedded kjit_loss_options, its first and last fields.
        assert value.loss.target_type == 1 and value.loss.class_weight_dtype == -1
        assert value.loss.ignore_index == -100 and value.config is None
    if struct is _capi.LinearCrossEntropySpec:
        assert value.weight_grad_dtype == -1 and value.weight_grad_accumulation == 0


def _bundle_dirs() -> list:
    # Where the wheel keeps the libraries it bundles: kjit.libs/ beside the package for a wheel
    # made by scripts/package/build-wheel.sh (auditwheel repair), kjit/_native/ for a plain
    # `pip install .`.
    native = _capi.NATIVE_DIR.resolve()
    return [native, native.parent.parent / "kjit.libs"]


def test_native_library_and_its_dependencies_come_from_the_wheel():
    _capi.lib()
    mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
              if line.split()[-1].startswith("/")}
    bundled = [p for p in mapped if any(n in p for n in ("libabsl_", "libfmt", "libxxhash"))]
    assert any("libkjit_c.so" in p for p in mapped)
    assert bundled, "no Abseil/fmt library is mapped: is libkjit_c.so linked against them?"
    outside = [p for p in bundled
               if not any(Path(p).resolve().is_relative_to(d) for d in _bundle_dirs())]
    assert not outside, f"loaded from outside the wheel ({_bundle_dirs()}): {outside}"


def test_each_bundled_library_is_in_the_wheel_once():
    # Under its soname only: a wheel (a zip) would hold a symlink chain as copies of the library;
    # auditwheel's copies are named lib<name>-<hash>.so.<version>.
    libraries = sorted(p.name for d in _bundle_dirs() for p in d.glob("lib*.so*"))
    stems = [re.split(r"-[0-9a-f]{8}\.so|\.so", name)[0] for name in libraries]
    assert len(set(stems)) == len(stems), libraries


def test_the_wheel_carries_its_license_and_the_bundled_libraries_notices():
    files = {f.name for f in importlib.metadata.distribution("kjit").files or []}
    assert {"LICENSE", "NOTICE"} <= files, sorted(files)
    notice = next(f for f in importlib.metadata.distribution("kjit").files if f.name == "NOTICE")
    text = notice.read_text()
    for project in ("Abseil", "{fmt}", "xxHash", "Boost Software License", "CLI11",
                    "JSON for Modern C++"):
        assert project in text, project


@pytest.mark.skipif(_driver_present(), reason="a CUDA driver is installed here")
def test_runtime_without_a_driver_is_a_clear_error(cache_dir):
    with pytest.raises(kjit.KjitUnavailable) as e:
        kjit.Runtime()
    assert e.value.status == "UNAVAILABLE"
    assert "driver" in str(e.value).lower()


def test_compile_only_runtime_builds_both_ops(cache_dir):
    rt = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
    assert rt.target == "sm_90" and rt.info()["compile_only"] is True
    ce = rt.cross_entropy(vocab=50257, dtype="bf16")
    first = ce.build()
    assert first["origin"] == "compiled" and first["target"] == "sm_90" and first["bytes"] > 0
    assert ce.build()["origin"] == "memory"
    assert ce.workspace_bytes(1024) >= 16
    assert "threads=" in ce.config_for(1024)
    norm = rt.rms_norm(hidden=4095, dtype="fp16", casting="gemma", weight_offset=1.0)
    assert norm.build()["origin"] == "compiled"
    assert norm.config_for(7).startswith("vec=")
    assert rt.rms_norm(hidden=4096, dtype="bf16", casting="none").build()["origin"] == "compiled"
    with pytest.raises(kjit.KjitError, match="weight_dtype: fp32 must be the dtype"):
        rt.rms_norm(hidden=4096, dtype="bf16", weight_dtype="fp32", casting="none")
    weighted = rt.cross_entropy(vocab=50257, dtype="bf16", class_weight_dtype="bf16").build()
    assert weighted["origin"] == "compiled" and weighted["params"]["class_weight_dtype"] == "bf16"
    assert "class_weight_dtype" not in first["params"]
    # A second runtime finds the disk cache.
    again = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
    assert again.cross_entropy(vocab=50257, dtype="bf16").build()["origin"] == "disk cache"


def test_compile_only_runtime_builds_the_linear_cross_entropy(cache_dir):
    rt = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
    chunk32 = "chunk=32 whole=0 streams=1 logits_algo=0 d_hidden_algo=0 d_weight_algo=0"
    lce = rt.linear_cross_entropy(vocab=1000, hidden=64, dtype="bf16", bias=True, config=chunk32)
    built = lce.build()
    assert built["origin"] == "compiled" and built["params"]["op"] == "linear_cross_entropy"
    assert lce.build()["origin"] == "memory"
    assert lce.accumulator_bytes(100) == 1000 * 64 * 4  # fp32 sums for a bf16 d_weight
    assert lce.accumulator_bytes(32) == 0  # one chunk writes d_weight directly
    assert lce.workspace_bytes(100) >= (32 << 20) + lce.accumulator_bytes(100)
    assert lce.config_for(100).startswith("chunk=")
    config = "chunk=32 whole=0 streams=2 logits_algo=0 d_hidden_algo=1 d_weight_algo=0"
    assert rt.linear_cross_entropy(1000, 64, config=config).config_for(5) == config
    lean = rt.linear_cross_entropy(1000, 64, weight_grad_accumulation="output_dtype", config=chunk32)
    assert lean.accumulator_bytes(100) == 0
    assert lce.workspace_bytes(100) - lean.workspace_bytes(100) >= lce.accumulator_bytes(100)
    fp32_grad = rt.linear_cross_entropy(1000, 64, weight_grad_dtype="fp32", config=chunk32)
    assert fp32_grad.accumulator_bytes(100) == 0


def test_compile_only_runtime_builds_the_rl_heads(cache_dir):
    rt = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
    op = rt.log_probs(vocab=50257, dtype="bf16", temperature=0.7, entropy=True)
    built = op.build()
    assert built["origin"] == "compiled" and built["params"]["op"] == "log_probs"
    assert [p["program"] for p in built["programs"]] == ["log_probs.forward", "log_probs.backward"]
    assert built["params"]["temperature"] == "0.7"
    # The temperature is a launch argument: another one finds the same programs.
    assert rt.log_probs(vocab=50257, dtype="bf16", temperature=1.7, entropy=True).build()[
        "origin"] == "memory"
    assert op.config().endswith("cluster=0 staged=0")
    with pytest.raises(kjit.KjitInvalidArgument, match="temperature: 0 must be"):
        rt.log_probs(vocab=100, temperature=0.0)
    with pytest.raises(kjit.KjitError, match="compile-only"):
        op.forward(None, logits=kjit.tensor(1 << 20, "bf16", 2, 50257),
                   targets=kjit.index(1 << 24, "int64", 2), logprob=kjit.vector(1 << 25, "fp32", 2),
                   entropy=kjit.vector(1 << 26, "fp32", 2))


def test_linear_cross_entropy_launches_check_their_arguments(cache_dir):
    rt = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
    lce = rt.linear_cross_entropy(vocab=64, hidden=32, dtype="bf16")
    ws = lce.workspace_bytes(2)
    fields = dict(hidden_states=kjit.tensor(0x100000, "bf16", 2, 32),
                  weight=kjit.tensor(0x200000, "bf16", 64, 32),
                  targets=kjit.index(0x300000, "int64", 2), loss=kjit.vector(0x400000, "fp32", 1),
                  workspace=0x1000000, workspace_bytes=ws)
    with pytest.raises(kjit.KjitError) as e:
        lce.forward(None, **fields)
    assert e.value.status == "FAILED_PRECONDITION"
    with pytest.raises(kjit.KjitError) as e:
        lce.forward_backward(None, **fields, d_hidden=kjit.tensor(0x500000, "bf16", 2, 32),
                             d_weight=kjit.tensor(0x600000, "bf16", 64, 32), accumulate=1)
    assert e.value.status == "FAILED_PRECONDITION"
    with pytest.raises(kjit.KjitInvalidArgument, match="d_hidden: given to Forward"):
        lce.forward(None, **fields, d_hidden=kjit.tensor(0x500000, "bf16", 2, 32))
    with pytest.raises(kjit.KjitInvalidArgument, match="weight: cols is 31, expected 32"):
        lce.forward(None, **dict(fields, weight=kjit.tensor(0x200000, "bf16", 64, 31)))
    with pytest.raises(kjit.KjitInvalidArgument, match="bias: given, but the op was created "
                       "without a bias"):
        lce.forward(None, **fields, bias=kjit.vector(0x700000, "bf16", 64))
    with pytest.raises(kjit.KjitInvalidArgument, match="accumulate: 2 is out of range"):
        lce.forward_backward(None, **fields, accumulate=2)


def test_launch_on_a_compile_only_runtime_is_refused(cache_dir):
    rt = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
    norm = rt.rms_norm(hidden=64)
    with pytest.raises(kjit.KjitError) as e:
        norm.forward(None, x=kjit.tensor(0x10000, "bf16", 1, 64),
                     weight=kjit.vector(0x20000, "bf16", 64), y=kjit.tensor(0x30000, "bf16", 1, 64))
    assert e.value.status == "FAILED_PRECONDITION"


def test_class_weights_reach_the_launches(cache_dir):
    # The arguments are checked before a compile-only runtime refuses the launch.
    rt = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
    fields = dict(logits=kjit.tensor(0x100000, "bf16", 2, 64), targets=kjit.index(0x200000,
                  "int64", 2), loss=kjit.vector(0x300000, "fp32", 1), workspace=0x400000,
                  workspace_bytes=4096)
    weighted = rt.cross_entropy(vocab=64, class_weight_dtype="fp32")
    with pytest.raises(kjit.KjitInvalidArgument, match="class_weight: null"):
        weighted.forward(None, **fields)
    with pytest.raises(kjit.KjitInvalidArgument,
                       match="class_weight: dtype is bf16, expected fp32"):
        weighted.forward(None, **fields, class_weight=kjit.vector(0x500000, "bf16", 64))
    with pytest.raises(kjit.KjitError) as e:
        weighted.forward(None, **fields, class_weight=kjit.vector(0x500000, "fp32", 64))
    assert e.value.status == "FAILED_PRECONDITION"
    with pytest.raises(kjit.KjitError) as e:
        weighted.backward(None, logits=fields["logits"], targets=fields["targets"],
                          lse=kjit.vector(0x600000, "fp32", 2),
                          grad=kjit.tensor(0x700000, "bf16", 2, 64), workspace=0x400000,
                          workspace_bytes=4096, class_weight=kjit.vector(0x500000, "fp32", 64))
    assert e.value.status == "FAILED_PRECONDITION"
    with pytest.raises(kjit.KjitInvalidArgument, match="class_weight: given, but the op was "
                       "created without class weights"):
        rt.cross_entropy(vocab=64).forward(None, **fields,
                                           class_weight=kjit.vector(0x500000, "fp32", 64))


@pytest.mark.parametrize("make, field", [
    (lambda rt: rt.cross_entropy(vocab=0), "vocab"),
    (lambda rt: rt.cross_entropy(vocab=100, label_smoothing=1.5), "label_smoothing"),
    (lambda rt: rt.cross_entropy(vocab=100, dtype="bf16", class_weight_dtype="fp16"),
     "class_weight_dtype: fp16 must be fp32 or the logits' dtype (bf16)"),
    (lambda rt: rt.rms_norm(hidden=0), "hidden"),
    (lambda rt: rt.linear_cross_entropy(vocab=1000, hidden=0), "hidden: 0 is out of range"),
    (lambda rt: rt.linear_cross_entropy(vocab=1, hidden=64), "vocab"),
    (lambda rt: rt.linear_cross_entropy(vocab=1000, hidden=64, weight_grad_dtype="fp16"),
     "weight_grad_dtype: fp16 must be bf16 or fp32"),
    (lambda rt: rt.linear_cross_entropy(vocab=1000, hidden=64, softcap=-1.0), "softcap"),
    (lambda rt: rt.linear_cross_entropy(vocab=1000, hidden=64, config="chunk=0 whole=0 streams=1 "
                                        "logits_algo=0 d_hidden_algo=0 d_weight_algo=0"),
     "config: "),
    (lambda rt: rt.rms_norm(hidden=64, config="vec=3 fwd=32x1 bwd=32x1"), "vec"),
])
def test_invalid_specs_name_the_field(cache_dir, make, field):
    rt = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
    with pytest.raises(kjit.KjitInvalidArgument) as e:
        make(rt)
    assert field in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype="fp8"), "dtype: expected one of"),
    (dict(reduction="avg"), "reduction: expected one of"),
    (dict(target_type="uint8"), "target_type: expected one of"),
    (dict(class_weight_dtype="fp8"), "class_weight_dtype: expected one of"),
])
def test_bad_enum_names_are_python_errors(cache_dir, kwargs, message):
    rt = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
    with pytest.raises(ValueError, match=message):
        rt.cross_entropy(vocab=100, **kwargs)
    if "class_weight_dtype" not in kwargs:
        with pytest.raises(ValueError, match=message):
            rt.linear_cross_entropy(vocab=100, hidden=64, **kwargs)


def test_bad_linear_cross_entropy_enum_names_are_python_errors(cache_dir):
    rt = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
    with pytest.raises(ValueError, match="weight_grad_accumulation: expected one of 'fp32', "
                       "'output_dtype', got str 'bf16'"):
        rt.linear_cross_entropy(100, 64, weight_grad_accumulation="bf16")
    with pytest.raises(ValueError, match="weight_grad_dtype: expected one of"):
        rt.linear_cross_entropy(100, 64, weight_grad_dtype="fp64")


@pytest.mark.skipif(not _driver_present(), reason="no CUDA driver here: a compile-only runtime "
                    "reads no tuning database")
def test_warnings_reach_python(cache_dir, tmp_path):
    db = tmp_path / "tuning.json"
    db.write_text("{ not json")
    with pytest.warns(kjit.KjitWarning, match="ignoring the tuning database"):
        kjit.Runtime(tuning_db=str(db))
    seen = []
    kjit.Runtime(tuning_db=str(db), warnings=seen.append)
    assert len(seen) == 1 and "ignoring the tuning database" in seen[0]


def test_a_warning_sink_that_raises_raises_from_the_call(cache_dir):
    # Issue 34: an exception from the warning sink (pytest -W error, warnings as errors) was
    # printed and dropped by ctypes ("Exception ignored on calling ctypes callback"), and the call
    # succeeded. /proc/self/fdinfo refuses new files even to root: the runtime warns as it is made.
    unwritable = dict(target="sm_90", compile_only=True, cache_dir="/proc/self/fdinfo")
    with warnings.catch_warnings():
        warnings.simplefilter("error", kjit.KjitWarning)
        with pytest.raises(kjit.KjitWarning, match="/proc/self/fdinfo is not writable"):
            kjit.Runtime(**unwritable)

    def refuse(message):
        raise ValueError(f"refused: {message}")

    with pytest.raises(ValueError, match="refused: disk cache /proc/self/fdinfo"):
        kjit.Runtime(**unwritable, warnings=refuse)
    seen = []
    rt = kjit.Runtime(**unwritable, warnings=seen.append)
    assert len(seen) == 1 and "is not writable" in seen[0]
    assert rt.rms_norm(256, "fp32").build()["origin"] == "compiled"


def _run_module(*args):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "kjit", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_python_m_kjit_runs_the_cli(cache_dir):
    out = _run_module("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("kjit 0.1.0")
    doctor = _run_module("doctor", "--json")
    report = json.loads(doctor.stdout)
    assert report["kjit"] == kjit.__version__
    assert {"driver", "nvrtc"} <= {f["check"] for f in report["findings"]}
    tune = _run_module("tune", "--help")
    assert tune.returncode == 0 and "--model" in tune.stdout


def _console_script(name: str) -> Path:
    # pip puts a wheel's console scripts beside the interpreter of the environment it installs to.
    return Path(sys.executable).parent / name


def _tuning_hint(command) -> str:
    doctor = subprocess.run(command, capture_output=True, text=True, timeout=120)
    findings = {f["check"]: f for f in json.loads(doctor.stdout)["findings"]}
    return findings["tuning"]["message"]


def test_the_console_scripts_run_the_wheels_programs(cache_dir):
    kjit_cli, kjit_tune = _console_script("kjit"), _console_script("kjit-tune")
    assert kjit_cli.exists() and kjit_tune.exists(), "the wheel installs both console scripts"
    out = subprocess.run([str(kjit_cli), "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("kjit 0.1.0"), out.stderr
    tune = subprocess.run([str(kjit_tune), "--help"], capture_output=True, text=True, timeout=120)
    assert tune.returncode == 0 and "--model" in tune.stdout, tune.stderr


def test_doctors_fixes_name_the_commands_kjit_was_started_with(cache_dir):
    # The console scripts' names exist wherever the wheel is installed; `python -m kjit` users get
    # its spelling.
    assert "run `kjit-tune --model <name>`" in _tuning_hint(
        [str(_console_script("kjit")), "doctor", "--json"])
    assert "run `python -m kjit tune --model <name>`" in _tuning_hint(
        [sys.executable, "-m", "kjit", "doctor", "--json"])


@pytest.mark.skipif(HAS_TORCH, reason="torch is installed here")
def test_kjit_torch_without_torch_says_what_to_install():
    with pytest.raises(ImportError, match="pip install torch"):
        import kjit.torch  # noqa: F401


def test_pip_nvrtc_is_found_on_sys_path(tmp_path, monkeypatch):
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvrtc.so.13").write_bytes(b"")
    (lib / "libnvrtc-builtins.so.13.0").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert _capi._find_pip_nvrtc() == str(lib / "libnvrtc.so.13")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere")])
    assert _capi._find_pip_nvrtc() is None


def test_pip_cublaslt_is_found_on_sys_path(tmp_path, monkeypatch):
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcublasLt.so.13").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert _capi._find_pip_cublaslt() == str(lib / "libcublasLt.so.13")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere")])
    assert _capi._find_pip_cublaslt() is None


def test_bf16_below_sm80_is_refused_as_the_op_is_made(cache_dir):
    # Issue 34 (5): an INTERNAL error with 13.6 KB of ptxas output, cut at a NUL in it.
    rt = kjit.Runtime(target="sm_75", compile_only=True, tuning_db="off")
    with pytest.raises(kjit.KjitInvalidArgument, match=r"^dtype: bf16 needs sm_80 or newer, the "
                       r"target is sm_75; use fp16 or fp32$"):
        rt.rms_norm(4096)
    assert rt.rms_norm(4096, dtype="fp16").build()["target"] == "sm_75"


@pytest.mark.parametrize("library, message", [
    # Issue 34 ("Also"): both ended in a raw traceback (AttributeError, OSError).
    (lambda tmp: _ctypes_file(), "is not kjit's C library (it has no kjit_abi_version); set "
     "KJIT_C_LIBRARY to a libkjit_c.so"),
    (lambda tmp: _text_file(tmp), "cannot load "),
])
def test_kjit_c_library_naming_another_file_is_an_import_error(tmp_path, monkeypatch, library,
                                                                message):
    monkeypatch.setattr(_capi, "_lib", None)
    monkeypatch.setenv("KJIT_C_LIBRARY", library(tmp_path))
    with pytest.raises(ImportError, match=re.escape(message)):
        _capi.lib()


def _ctypes_file() -> str:
    """A shared library that is not kjit's: the _ctypes extension module."""
    import _ctypes
    return _ctypes.__file__


def _text_file(tmp) -> str:
    path = tmp / "libkjit_c.so"
    path.write_text("not a library")
    return str(path)


@pytest.mark.skipif(HAS_TORCH, reason="torch is installed here")
def test_python_m_kjit_bench_without_torch_says_what_to_install():
    # Issue 34 ("Also"): a ModuleNotFoundError traceback.
    out = subprocess.run([sys.executable, "-m", "kjit.bench"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1
    assert out.stderr == "python -m kjit.bench needs PyTorch: pip install torch\n"


_EXIT_WHILE_BUILDING = """
import sys, threading, time
import kjit
building = threading.Semaphore(0)
def build_forever(seed):
    rt = kjit.Runtime(target="sm_90", compile_only=True, disk_cache=False)
    for i in range(1000):
        op = rt.cross_entropy(1000 + 16 * i + seed)  # a new program each time: each compiles
        building.release()
        op.build()
for seed in range(2):
    threading.Thread(target=build_forever, args=(seed,), daemon=True).start()
building.acquire()
building.acquire()
time.sleep(float(sys.argv[1]))
sys.exit(0)
"""


@pytest.mark.parametrize("delay", [0.1, 0.3, 0.5, 0.7])
def test_exit_while_daemon_threads_build_does_not_crash(cache_dir, delay):
    # Issue 34, defect 2: sys.exit(0) while two daemon threads compile. Before the fix NVRTC's
    # static destructors ran under the compiles: most runs died (exit 134 "LLVM ERROR: out of memory", or
    # SIGSEGV).
    start = time.monotonic()
    # (PYTHONFAULTHANDLER: a death by a signal prints every thread's Python stack to stderr;
    # the GPU machine's Python 3.12 runs died of SIGSEGV with nothing written)
    out = subprocess.run([sys.executable, "-c", _EXIT_WHILE_BUILDING, str(delay)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert out.returncode == 0, out.stderr
    # Exit waits for the builds in flight (a build's length), never for the gate's 60 s limit.
    assert time.monotonic() - start < 30


_EXIT_WHILE_WARNING = """
import sys, threading, time
import kjit
started = threading.Event()
def warn_forever():
    while True:  # /proc/self/fdinfo refuses new files: each runtime warns as it is made
        kjit.Runtime(target="sm_90", compile_only=True, cache_dir="/proc/self/fdinfo",
                     warnings=lambda message: None)
        started.set()
for _ in range(4):
    threading.Thread(target=warn_forever, daemon=True).start()
started.wait()
time.sleep(float(sys.argv[1]))
sys.exit(0)
"""


@pytest.mark.parametrize("delay", [0.01, 0.03, 0.05])
def test_exit_while_daemon_threads_get_warnings_does_not_abort(delay):
    # A daemon thread whose kjit call calls the warning sink while Python shuts down is ended by
    # pthread_exit() (Python 3.11 cannot give it the interpreter back); the C API's catch-all
    # swallowed that unwinding: 7 runs in 8 aborted with "FATAL: exception not rethrown" (134).
    out = subprocess.run([sys.executable, "-c", _EXIT_WHILE_WARNING, str(delay)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "exception not rethrown" not in out.stderr


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_interpreter_exit_destroys_the_handles_quietly(tmp_path):
    """Issue 45, defect 15: with torch imported, the handles alive at exit were destroyed after
    the module's globals were cleared: "Exception ignored in: <function _Handle.__del__ ...>
    TypeError: 'NoneType' object is not callable"."""
    script = ("import torch, kjit\n"
              "rt = kjit.Runtime(target='sm_90', compile_only=True, tuning_db='off')\n"
              "ops = [rt.rms_norm(64), rt.cross_entropy(vocab=64)]\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "KJIT_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr
