# kiln-sandbox harness: runs ONE LiveCodeBench test of one program, inside the sandbox.
# Imported as the module `kiln_lcb` (so its bytecode is cached): importing it runs the test.
#
# It mirrors lcb_runner/evaluation/testing_util.py of LiveCodeBench (commit 28fef95):
# `run_test`'s `reliability_guard`, `grade_stdio` (clean_if_name, make_function, call_method's
# stdin patches, Capturing) and `grade_call_based` (import_string + exec, `Solution()`,
# getattr(fn_name), one json.loads per input line, tuple -> list), plus
# `sys.set_int_max_str_digits(50000)` from compute_code_generation_metrics.py.
# The functions marked "LCB" are copied from there with only the changes noted.
#
# The COMPARISON is not done here: this file reports what the program printed (stdin tests) or
# returned (call-based tests) and the Rust side compares, so nothing inside the sandbox ever sees
# the expected output.
#
# Protocol. stdin: one JSON header line {"mode": "stdin"|"call", "fn_name": str|null,
# "check_only": bool, "code_len": bytes, "cap": bytes}, then the program (code_len bytes), then
# the test input.
# Result: on the original stdout (fd 1 is pointed at /dev/null before user code runs, as LCB's
# captured output never includes writes that bypass sys.stdout), b"\0KILN-RESULT\0", one JSON
# line {"status", "exc", "msg", "time", "len"} and `len` bytes of payload (the captured output,
# or the returned value in the tagged encoding of `encode` below). Before the timed call,
# b"\0KILN-RUN\0" on the same channel starts the host's clock; the frame's "time" is informative
# only (the program could forge it).
import sys
import os
import json
import time
from io import StringIO
from types import ModuleType

RESULT_MAGIC = b"\0KILN-RESULT\0"
RUN_MAGIC = b"\0KILN-RUN\0"
_out_fd = -1
_cap = 1 << 25

# LCB: testing_util.import_string
import_string = "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\nfrom heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\nimport string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\nimport math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\nimport io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"


def report(status, payload=b"", exc=None, msg="", elapsed=None):
    """Writes the result frame and ends the process (nothing the program left running matters)."""
    head = json.dumps(
        {"status": status, "exc": exc, "msg": msg[:300], "time": elapsed, "len": len(payload)}
    ).encode()
    data = RESULT_MAGIC + head + b"\n" + payload
    while data:
        try:
            n = os.write(_out_fd, data)
        except InterruptedError:
            continue
        except OSError:
            break
        data = data[n:]
    os._exit(0)


def report_exception(e, elapsed=None):
    if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno == 12):
        report("memory", exc=type(e).__name__, msg=repr(e), elapsed=elapsed)
    report("error", exc=type(e).__name__, msg=repr(e), elapsed=elapsed)


class CappedStringIO(StringIO):
    """LCB captures into a StringIO; kiln stops the program once it printed more than the cap."""

    def write(self, s):
        n = StringIO.write(self, s)
        if self.tell() > _cap:
            report("overflow", msg="stdout over %d bytes" % _cap)
        return n


# LCB: testing_util.Capturing (StringIO -> CappedStringIO)
class Capturing(list):
    def __enter__(self):
        self._stdout = sys.stdout
        sys.stdout = self._stringio = CappedStringIO()
        # Make closing the StringIO a no-op
        self._stringio.close = lambda x: 1
        return self

    def __exit__(self, *args):
        self.append(self._stringio.getvalue())
        del self._stringio  # free up some memory
        sys.stdout = self._stdout


# LCB: testing_util.MockStdinWithBuffer
class MockStdinWithBuffer:
    def __init__(self, inputs: str):
        self.inputs = inputs
        self._stringio = StringIO(inputs)
        self.buffer = MockBuffer(inputs)

    def read(self, *args):
        return self.inputs

    def readline(self, *args):
        return self._stringio.readline(*args)

    def readlines(self, *args):
        return self.inputs.split("\n")

    def __getattr__(self, name):
        # Delegate other attributes to StringIO
        return getattr(self._stringio, name)


# LCB: testing_util.MockBuffer
class MockBuffer:
    def __init__(self, inputs: str):
        self.inputs = inputs.encode("utf-8")  # Convert to bytes

    def read(self, *args):
        # Return as byte strings that can be split
        return self.inputs

    def readline(self, *args):
        return self.inputs.split(b"\n")[0] + b"\n"


# LCB: testing_util.clean_if_name
def clean_if_name(code: str) -> str:
    try:
        astree = ast.parse(code)
        last_block = astree.body[-1]
        if isinstance(last_block, ast.If):
            condition = last_block.test
            if ast.unparse(condition).strip() == "__name__ == '__main__'":
                code = (
                    ast.unparse(astree.body[:-1]) + "\n" + ast.unparse(last_block.body)  # type: ignore
                )
    except:
        pass

    return code


# LCB: testing_util.make_function
def make_function(code: str) -> str:
    try:
        import_stmts = []
        all_other_stmts = []
        astree = ast.parse(code)
        for stmt in astree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                import_stmts.append(stmt)
            else:
                all_other_stmts.append(stmt)

        function_ast = ast.FunctionDef(
            name="wrapped_function",
            args=ast.arguments(
                posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]
            ),
            body=all_other_stmts,
            decorator_list=[],
            lineno=-1,
        )
        main_code = (
            import_string
            + "\n"
            + ast.unparse(import_stmts)  # type: ignore
            + "\n"
            + ast.unparse(function_ast)  # type: ignore
        )
        return main_code
    except Exception as e:
        return code


class _Patch:
    """The effect of one `unittest.mock.patch(target, new)`: set now, undo on `restore`
    (unittest.mock itself costs ~45 ms to import, more than everything else here)."""

    def __init__(self, obj, name, new):
        self.obj, self.name = obj, name
        self.had = name in getattr(obj, "__dict__", {})
        self.old = getattr(obj, name, None)
        setattr(obj, name, new)

    def restore(self):
        if self.had:
            setattr(self.obj, self.name, self.old)
        else:
            try:
                delattr(self.obj, self.name)
            except AttributeError:
                pass


# LCB: testing_util.call_method. The decorators there are entered bottom-up, so the three
# `sys.stdin.*` patches land on the ORIGINAL sys.stdin object (what `from sys import stdin` in the
# program sees), then `sys.stdin` itself and `builtins.open` are replaced; the same order here.
def call_method(method, inputs):
    import builtins

    if isinstance(inputs, list):
        inputs = "\n".join(inputs)

    inputs_line_iterator = iter(inputs.split("\n"))

    mock_stdin = MockStdinWithBuffer(inputs)
    patches = []
    try:
        patches.append(_Patch(sys.stdin, "read", lambda *args: inputs))
        patches.append(_Patch(sys.stdin, "readlines", lambda *args: inputs.split("\n")))
        patches.append(_Patch(sys.stdin, "readline", lambda *args: next(inputs_line_iterator)))
        patches.append(_Patch(sys, "stdin", mock_stdin))
        # mock_open(read_data=inputs): every open() gives a fresh file whose content is the input.
        patches.append(_Patch(builtins, "open", lambda *args, **kwargs: StringIO(inputs)))
        try:
            return method()
        except SystemExit as e:
            pass
    finally:
        for p in reversed(patches):
            p.restore()


# LCB: testing_util.compile_code, with the compile step split off (kiln reports compile_error for
# code that does not compile; LCB counts it as a runtime error) and the alarm left to the host.
def compile_code(code_obj, code: str):
    tmp_sol = ModuleType("tmp_sol", "")
    exec(code_obj, tmp_sol.__dict__)
    if "class Solution" in code:
        compiled_sol = tmp_sol.Solution()
    else:
        compiled_sol = tmp_sol
    assert compiled_sol is not None
    return compiled_sol


# LCB: testing_util.get_function
def get_function(compiled_sol, fn_name: str):  # type: ignore
    try:
        assert hasattr(compiled_sol, fn_name)
        return getattr(compiled_sol, fn_name)
    except Exception as e:
        return


# reliability_guard nulls shutil.rmtree/move/chown and subprocess.Popen after importing both; here
# the nulling happens when the program first imports them (the same values, without ~4 ms of
# imports per test): a finder ahead of the others wraps their loaders.
_NULLED_ON_IMPORT = {"shutil": ("rmtree", "move", "chown"), "subprocess": ("Popen",)}


class _NullingLoader:
    def __init__(self, loader, names):
        self._loader, self._names = loader, names

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        for name in self._names:
            setattr(module, name, None)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _NullOnImport:
    def find_spec(self, name, path=None, target=None):
        names = _NULLED_ON_IMPORT.get(name)
        if names is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _NullingLoader(spec.loader, names)
                return spec
        return None


# LCB: testing_util.reliability_guard (shutil and subprocess: see _NullOnImport).
def reliability_guard():
    import faulthandler
    import builtins

    faulthandler.disable()
    builtins.quit = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in (
        "kill system putenv remove removedirs rmdir fchdir setuid fork forkpty killpg rename "
        "renames truncate replace unlink fchmod fchown chmod chown chroot fchdir lchflags lchmod "
        "lchown getcwd chdir"
    ).split():
        setattr(os, name, None)
    for module, names in _NULLED_ON_IMPORT.items():
        if module in sys.modules:
            for name in names:
                setattr(sys.modules[module], name, None)
    sys.meta_path.insert(0, _NullOnImport())
    builtins.help = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def start_clock():
    """Tells the host that the program's timed run starts now (its first byte on the harness's
    channel; the host measures the run from it to the process's exit, so no frame the program
    writes can make it shorter)."""
    os.write(_out_fd, RUN_MAGIC)


def compile_or_report(code):
    try:
        return compile(code, "<string>", "exec")
    except MemoryError as e:
        report_exception(e)
    except Exception as e:
        report("compile_error", exc=type(e).__name__, msg=str(e))


def encode(v, depth=0):
    """Tagged JSON of a returned value, exact enough for Python's `==` against json.loads output:
    ints as digit strings, floats as repr, tuples and dicts marked (json.dumps would lose both)."""
    if depth > 200:
        return {"o": "nesting"}
    if v is None or v is True or v is False:
        return v
    if isinstance(v, int):
        try:
            return {"i": int.__repr__(v)}
        except ValueError:
            return {"o": "int beyond the digit limit"}
    if isinstance(v, float):
        return {"f": float.__repr__(v)}
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, list):
        return [encode(x, depth + 1) for x in v]
    if isinstance(v, tuple):
        return {"t": [encode(x, depth + 1) for x in v]}
    if isinstance(v, dict):
        return {"d": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    kind = type(v).__name__
    if kind in ("Fraction", "Decimal"):
        # equal to a json int or float only if it is exactly that int or float
        try:
            if v == int(v):
                return {"i": int.__repr__(int(v))}
            f = float(v)
            if v == f:
                return {"f": float.__repr__(f)}
        except (ValueError, OverflowError, ArithmeticError):
            pass
    return {"o": kind}


def main():
    global _out_fd, _cap
    data = sys.stdin.buffer.read()
    # The harness's own channel; the program's fd 1 goes to /dev/null (see the header).
    _out_fd = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    nl = data.index(b"\n")
    head = json.loads(data[:nl])
    start = nl + 1 + head["code_len"]
    code = data[nl + 1 : start].decode("utf-8")
    inputs = data[start:].decode("utf-8")
    _cap = head["cap"]
    mode = head["mode"]

    if hasattr(sys, "set_int_max_str_digits"):  # Python 3.11+ (and late 3.9/3.10 releases)
        sys.set_int_max_str_digits(50000)
    reliability_guard()

    check_only = head["check_only"]

    if mode == "call":
        code = import_string + "\n\n" + code
        code_obj = compile_or_report(code)
        if check_only:
            report("ok")
        try:
            compiled_sol = compile_code(code_obj, code)
        except BaseException as e:
            report_exception(e)
        method = get_function(compiled_sol, head["fn_name"])
        if method is None:
            report("error", exc="AttributeError", msg="no function %r" % head["fn_name"])
        try:
            args = [json.loads(line) for line in inputs.split("\n")]
        except Exception as e:
            report("error", exc=type(e).__name__, msg="test input is not JSON lines: %r" % e)
        start_clock()
        try:
            t0 = time.perf_counter()
            prediction = method(*args)
            elapsed = time.perf_counter() - t0
        except BaseException as e:
            report_exception(e, time.perf_counter() - t0)
        # don't penalize model if it produces tuples instead of lists (LCB)
        if isinstance(prediction, tuple):
            prediction = list(prediction)
        try:
            payload = json.dumps(encode(prediction)).encode("utf-8", "surrogatepass")
        except BaseException as e:
            report_exception(e, elapsed)
        if len(payload) > _cap:
            report("overflow", msg="returned value over %d bytes" % _cap)
        report("ok", payload, elapsed=elapsed)

    # stdin mode (LCB grade_stdio); `ast` only here (call-based tests do not need it)
    global ast
    import ast

    code = clean_if_name(code)
    code = make_function(code)
    code_obj = compile_or_report(code)
    if check_only:
        report("ok")
    try:
        compiled_sol = compile_code(code_obj, code)
    except BaseException as e:
        report_exception(e)
    method = get_function(compiled_sol, "wrapped_function")
    if method is None:
        report("error", exc="AttributeError", msg="no wrapped_function")
    start_clock()
    t0 = time.perf_counter()
    with Capturing() as captured_output:
        try:
            call_method(method, inputs)
            elapsed = time.perf_counter() - t0
        except BaseException as e:
            report_exception(e, time.perf_counter() - t0)
    out = captured_output[0].encode("utf-8", "surrogatepass")
    report("ok", out, elapsed=elapsed)


ast = None
main()
