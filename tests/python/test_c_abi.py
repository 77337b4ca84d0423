"""The ctypes binding (kjit/_capi.py) against the C header (include/kjit/kjit_c.h): the ABI version,
every declared function bound with its parameters' types, every struct laid out field by field as
the header declares it and, through the library, as large as the library's *_init say; and the ops
by name (kjit_op_*, ABI 6) from Python without a GPU. A function or field added to the header and
not to the binding, or the other way round, fails here, naming it."""

import ctypes
import re
from pathlib import Path

import pytest

from kjit import _capi

HEADER = Path(__file__).resolve().parents[2] / "include" / "kjit" / "kjit_c.h"

_SCALARS = {"uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
            "float": ctypes.c_float, "kjit_status": ctypes.c_int, "CUstream": ctypes.c_void_p,
            "kjit_warning_fn": _capi.WARNING_FN}


def _code() -> str:
    text = HEADER.read_text()
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def _split(decl: str):
    """("const kjit_tensor*", "name") -> (base type, pointer depth, name)."""
    decl = " ".join(decl.replace("*", " * ").split())
    words = decl.split(" ")
    name = words[-1]
    depth = words.count("*")
    base = [w for w in words[:-1] if w not in ("const", "*")]
    return " ".join(base), depth, name


def _structs(code: str) -> dict:
    """C struct name -> [(field, base type, depth)], in order."""
    structs = {}
    for name, body, again in re.findall(r"typedef struct (\w+) \{(.*?)\} (\w+);", code, re.S):
        assert name == again
        structs[name] = [(f, b, d) for b, d, f in
                         (_split(decl) for decl in body.split(";") if decl.strip())]
    return structs


def _functions(code: str) -> dict:
    """Function name -> (return type, [(base type, depth)])."""
    functions = {}
    for ret, name, params in re.findall(r"KJIT_C_EXPORT\s+([^;(]*?)\b(kjit_\w+)\s*\(([^)]*)\)\s*;",
                                        code, re.S):
        params = " ".join(params.split())
        parsed = [] if params == "void" else [_split(p)[:2] for p in params.split(",")]
        functions[name] = (" ".join(ret.replace("*", " * ").split()), parsed)
    return functions


class _Layouts:
    """Which ctypes class stands for which C struct, learned from the binding and checked to be one
    to one."""

    def __init__(self, structs: dict):
        self.structs = structs
        self.classes = {}

    def learn(self, c_name: str, py_class, where: str) -> None:
        known = self.classes.setdefault(c_name, py_class)
        assert known is py_class, f"{where}: {c_name} is bound as {py_class.__name__} here and " \
                                  f"as {known.__name__} elsewhere"

    def expected(self, base: str, depth: int, actual, where: str):
        """The ctypes type that a C type of `base` with `depth` pointers must be bound as; learns a
        struct's class from `actual`."""
        if base in self.structs:
            target = actual._type_ if depth == 1 and hasattr(actual, "_type_") else actual
            if isinstance(target, type) and issubclass(target, ctypes.Structure):
                self.learn(base, target, where)
            cls = self.classes.get(base)
            if depth == 0:
                return cls
            return ctypes.POINTER(cls) if depth == 1 and cls else ctypes.POINTER(ctypes.c_void_p)
        if depth == 0:
            return _SCALARS.get(base)
        if depth >= 2:
            return ctypes.POINTER(ctypes.c_void_p)  # an output pointer, an array of handles
        if base == "char":
            return ctypes.c_char_p
        if base in ("void",) or base.startswith("kjit_"):
            return ctypes.c_void_p  # an address, or an opaque handle
        return ctypes.POINTER(_SCALARS[base])


def test_the_abi_version_is_the_headers():
    version = re.search(r"#define KJIT_C_ABI_VERSION (\d+)", HEADER.read_text())
    assert int(version.group(1)) == _capi.ABI_VERSION


def test_every_declared_function_is_bound_with_its_parameters():
    code = _code()
    functions = _functions(code)
    assert len(functions) > 60
    assert set(functions) == set(_capi._PROTOTYPES), (
        f"declared, not bound: {sorted(set(functions) - set(_capi._PROTOTYPES))}; "
        f"bound, not declared: {sorted(set(_capi._PROTOTYPES) - set(functions))}")
    layouts = _Layouts(_structs(code))
    returns = {"void": None, "kjit_status": ctypes.c_int, "uint32_t": ctypes.c_uint32,
               "const char *": ctypes.c_char_p}
    for name, (ret, params) in sorted(functions.items()):
        restype, argtypes = _capi._PROTOTYPES[name]
        assert restype is returns[ret], f"{name} returns {ret}"
        assert len(argtypes) == len(params), f"{name}: {len(params)} parameters in the header"
        for i, ((base, depth), actual) in enumerate(zip(params, argtypes)):
            expected = layouts.expected(base, depth, actual, name)
            assert actual == expected, f"{name}: parameter {i} ({base}{'*' * depth}) is bound " \
                                       f"as {actual}, expected {expected}"


def test_every_struct_is_laid_out_as_the_header_declares():
    code = _code()
    structs = _structs(code)
    layouts = _Layouts(structs)
    for name, (_, params) in _functions(code).items():  # the classes the functions take
        for (base, depth), actual in zip(params, _capi._PROTOTYPES[name][1]):
            layouts.expected(base, depth, actual, name)
    checked = set()
    pending = list(layouts.classes)
    while pending:
        c_name = pending.pop()
        if c_name in checked:
            continue
        checked.add(c_name)
        py_class = layouts.classes[c_name]
        fields = py_class._fields_
        assert [f for f, *_ in fields] == [f for f, _, _ in structs[c_name]], \
            f"{c_name}'s fields, in order, are not {py_class.__name__}'s"
        for (field, base, depth), (_, actual) in zip(structs[c_name], fields):
            if base in structs and depth == 0:
                layouts.learn(base, actual, f"{c_name}.{field}")
                pending.append(base)
            elif base in structs:  # an array of structs: kjit_op_args.tensors
                layouts.learn(base, actual._type_, f"{c_name}.{field}")
                pending.append(base)
            expected = layouts.expected(base, depth, actual, f"{c_name}.{field}")
            assert actual == expected, f"{c_name}.{field} is bound as {actual}, expected {expected}"
    assert checked == set(structs), f"structs no binding reaches: {sorted(set(structs) - checked)}"


def test_each_struct_is_as_large_as_the_librarys_init_says():
    lib = _capi.lib()
    for name, (_, argtypes) in _capi._PROTOTYPES.items():
        if not name.endswith("_init"):
            continue
        (pointer,) = argtypes
        buffer = (ctypes.c_uint8 * 4096)()
        getattr(lib, name)(ctypes.cast(buffer, pointer))
        size = ctypes.c_uint32.from_buffer(buffer).value
        assert size == ctypes.sizeof(pointer._type_), f"{name}: the library's struct is {size} " \
                                                      f"bytes, the binding's " \
                                                      f"{ctypes.sizeof(pointer._type_)}"


# ---- the ops by name from Python, compile-only ---------------------------------------------------

@pytest.fixture
def rt(tmp_path):
    import kjit
    return kjit.Runtime(target="sm_90", compile_only=True, cache_dir=tmp_path)


def test_the_schema_lists_rms_norm():
    import kjit
    schema = kjit.op_schema()
    assert schema["abi_version"] == kjit.ABI_VERSION
    norm = next(op for op in schema["ops"] if op["op"] == "rms_norm")
    assert [p["pass"] for p in norm["passes"]] == ["forward", "backward"]


def test_an_op_by_name_builds_and_answers_its_queries(rt):
    norm = rt.op("rms_norm", hidden=4096, casting="gemma", config="vec=8 fwd=256x1 bwd=512x1r2")
    assert norm.spec()["casting"] == "gemma"
    assert norm.build()["origin"] == "compiled"
    assert norm.config_for(1024) == "vec=8 fwd=256x1 bwd=512x1r2"
    assert norm.workspace_bytes("backward", 1000) == \
        rt.rms_norm(4096).backward_workspace_bytes(1000)
    assert norm.workspace_bytes("forward", 1000) == 0


def test_an_op_by_name_refuses_bad_input_clearly(rt):
    import kjit
    with pytest.raises(kjit.KjitInvalidArgument, match='op: "rms_nrom" is not an op'):
        rt.op("rms_nrom", hidden=4096)
    with pytest.raises(kjit.KjitInvalidArgument, match="^hiden: "):
        rt.op("rms_norm", hidden=4096, hiden=1)
    with pytest.raises(TypeError, match="not a JSON value"):
        rt.op("rms_norm", hidden=object())
    norm = rt.op("rms_norm", hidden=4096)
    x = kjit.tensor(0x10000, "bf16", 2, 4096)
    with pytest.raises(kjit.KjitInvalidArgument, match='tensors: "z" is not a tensor of the '
                                                       'forward pass; it takes "x"'):
        norm.launch("forward", None, x=x, z=x)
    with pytest.raises(TypeError, match="z: expected a kjit.tensor"):
        norm.launch("forward", None, x=x, z=3)
    with pytest.raises(kjit.KjitError, match="compile-only"):
        norm.launch("forward", None, x=x, weight=kjit.vector(0x20000, "bf16", 4096), y=x)
