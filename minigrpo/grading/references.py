"""Is the learner's function the package's own solution? Three looks: the live object, the source, and run time.

Each check lists its `references` (`@cases("check_x", references=[...])`): the
package's functions that solve the exercise. A learner's function that is one
of them, wraps one (`functools.wraps`, `functools.partial`, a bound method) or
calls one (a `lambda *a: clipped_surrogate(*a)`, a helper that does, a module
attribute such as `losses.clipped_surrogate`) earns 0 for that check, with a
message that names the reference.

- `reference_reason(obj, references)` looks at the live function object: its
  identity, its `__code__`, its `__wrapped__` / `.func` chain, its closure, its
  defaults and the globals its code names (following the learner's own helper
  functions, not the package's). It runs where the function lives: in the
  kernel, which the learner controls, so it is only the first look.
- `source_reference_reason(cells, cell_index, argument, references)` reads the
  notebook's code cells, in the grader's judge, which no learner code reaches:
  from the expression passed to the check it follows the top-level bindings
  (def, assignment, import) that the function needs and resolves every import
  from the package. It sees imports and attribute chains, not names built from
  strings at run time; nothing can tell a reference whose source was pasted
  into the notebook from the learner's own work.
- `ReferenceWatch` watches the learner's function while the judge grades it:
  `remote.serve` runs each call under a profile hook (`sys.setprofile`; in the
  threads the call starts, through `threading` or `_thread`; on Python 3.12 and
  later in every thread) that notes when code of a reference starts, whatever
  route reached it: a name built from strings
  (`importlib.import_module("minigrpo." + "losses")`), `sys.modules`, an object
  hidden in a container, a copy of the function or of its code, `importlib.reload`
  (a code object is known by its file, first line and name), and the reference's
  code object under another file name (known by its name, first line and
  `code_digest`: its bytecode, names and constants). An audit hook (which no code
  can remove) notes a process started during the call, whose code no hook sees,
  and a profile hook set by anyone else in any thread. The judge sends what to
  watch (`watch_list`, computed from its own registry) and a check whose function
  ran a reference, started a process or switched the hook off scores 0 with the
  reason. It cannot see: the reference's source pasted into the notebook (the same
  code as a learner's own can be), a code object copied with another name and
  first line, on Python 3.10 and 3.11 a thread started before the call, a thread
  started through a `_thread.start_new_thread` kept from before the call, a process
  or thread started by native code (ctypes), an answer key that is data (read, not
  run), or a kernel whose grading code (`serve`) the learner rewrote: it runs in
  the kernel, which the learner controls, like the live-object look. (The runner
  kills the processes the notebook's cells left before the judge calls anything:
  `processes.kill_strays`.)
"""

from __future__ import annotations

import ast
import contextlib
import dis
import functools
import hashlib
import importlib
import inspect
import sys
import sysconfig
import threading
import types
from collections.abc import Sequence
from pathlib import Path

_MAX_DEPTH = 6
"""How many levels of helpers, wrappers and modules to follow: enough for real code, bounded for cycles."""


def _name(reference) -> str:
    module, qualname = getattr(reference, "__module__", None), getattr(reference, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else f"answer key {type(reference).__name__}"


def _message(reference, how: str) -> str:
    return (
        f"your function {how} the package's own {_name(reference)}: write your own implementation "
        "(the reference earns no points)."
    )


# --- the live object ------------------------------------------------------------------------
def reference_reason(obj, references: Sequence) -> str | None:
    """A message when `obj` is, wraps or calls one of `references`; None when it is the learner's own."""
    if not references:
        return None
    found = _find(obj, tuple(references), 0, set())
    return _message(*found) if found else None


def _matches(obj, references: tuple):
    for reference in references:
        if obj is reference:
            return reference
        code = getattr(reference, "__code__", None)
        if code is not None and getattr(obj, "__code__", None) is code:
            return reference
    return None


def _unwrapped(obj) -> list:
    """What `obj` delegates to: a partial's function, a bound method's function, __wrapped__, an instance's __call__."""
    inner = []
    if isinstance(obj, functools.partial):
        inner += [obj.func, *obj.args, *obj.keywords.values()]
    inner += [getattr(obj, attr) for attr in ("__wrapped__", "__func__") if hasattr(obj, attr)]
    if not isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type)) and callable(obj):
        call = type(obj).__dict__.get("__call__")  # a class the notebook defined
        if isinstance(call, types.FunctionType) and _is_learners(call):
            inner.append(call)
    return inner


def _code_names(code: types.CodeType) -> set[str]:
    """Every global or attribute name the code (and the functions and lambdas defined in it) mentions."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _find(obj, references: tuple, depth: int, seen: set):
    if depth > _MAX_DEPTH or id(obj) in seen:
        return None
    seen.add(id(obj))
    reference = _matches(obj, references)
    if reference is not None:
        return reference, "is" if depth == 0 else "calls"
    for inner in _unwrapped(obj):
        found = _find(inner, references, depth + 1, seen)
        if found:
            return found[0], "wraps"
    if not isinstance(obj, types.FunctionType) or not _is_learners(obj):
        return None  # the package's functions may call references of other exercises; libraries call none
    names = _code_names(obj.__code__)
    values = [cell.cell_contents for cell in obj.__closure__ or () if _has_contents(cell)]
    values += list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
    values += [obj.__globals__[name] for name in names if name in obj.__globals__]
    for value in values:
        if isinstance(value, types.ModuleType):
            found = _find_in_module(value, names, references, depth + 1)
        else:
            found = _find(value, references, depth + 1, seen)
        if found:
            return found[0], "calls"
    return None


def _find_in_module(module: types.ModuleType, names: set[str], references: tuple, depth: int):
    """`losses.clipped_surrogate` or `minigrpo.losses.clipped_surrogate`: a module's attributes the code names."""
    if depth > _MAX_DEPTH:
        return None
    for name in names:
        value = getattr(module, name, None)
        reference = _matches(value, references)
        if reference is not None:
            return reference, "calls"
        if isinstance(value, types.ModuleType) and value is not module:
            found = _find_in_module(value, names, references, depth + 1)
            if found:
                return found
    return None


def _is_learners(function: types.FunctionType) -> bool:
    """Defined in the notebook or a file of the learner's, not in the package, the standard library or a library."""
    file = function.__globals__.get("__file__")
    if not isinstance(file, str):
        return True  # a notebook cell, or exec
    if (function.__module__ or "").split(".")[0] == "minigrpo":
        return False
    return not any(file.startswith(root) for root in _library_roots())


@functools.cache
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({str(Path(paths[key]).resolve()) for key in ("stdlib", "platstdlib", "purelib", "platlib")})


def _has_contents(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # an empty cell: a name the closure binds later
        return False
    return True


# --- the notebook's source --------------------------------------------------------------------
def source_reference_reason(cells: Sequence[str], cell_index: int, argument: str, references: Sequence) -> str | None:
    """A message when the expression `argument`, passed to a check in code cell `cell_index`, uses a reference.

    cells: the notebook's code cells (IPython source) by index; earlier cells and this one bind the names.
    Only imports from the package itself are resolved (importing them here runs no learner code).
    """
    references = tuple(references)
    if not references:
        return None
    bindings = _bindings([c for i, c in sorted(_parsed(cells).items()) if i <= cell_index])
    try:
        start = ast.parse(argument, mode="eval")
    except SyntaxError:
        return None
    pending, done, chains = [start], set(), []
    while pending:
        node = pending.pop()
        names, node_chains = _loads(node)
        chains += node_chains
        for name in names - done:
            done.add(name)
            binding = bindings.get(name)
            if isinstance(binding, _Import):
                reference = _matches(binding.resolve(), references)
                if reference is not None:
                    return _message(reference, f"uses (through `{name}`)")
            elif binding is not None:
                pending.append(binding)
    for chain in chains:
        binding = bindings.get(chain[0])
        if isinstance(binding, _Import):
            value = binding.resolve()
            for attribute in chain[1:]:
                value = getattr(value, attribute, None)
                reference = _matches(value, references)
                if reference is not None:
                    return _message(reference, f"uses (through `{'.'.join(chain)}`)")
    return None


class _Import:
    """`from module import attribute` (attribute None: `import module`), resolved only inside the package."""

    def __init__(self, module: str, attribute: str | None):
        self.module, self.attribute = module, attribute

    def resolve(self):
        if self.module.split(".")[0] != "minigrpo":
            return None
        try:
            module = importlib.import_module(self.module)
        except ImportError:
            return None
        return module if self.attribute is None else getattr(module, self.attribute, None)


def _parsed(cells: Sequence[str]) -> dict[int, ast.Module]:
    from IPython.core.inputtransformer2 import TransformerManager  # turns %magics into plain Python

    transformer, trees = TransformerManager(), {}
    for index, source in enumerate(cells):
        try:
            trees[index] = ast.parse(transformer.transform_cell(source))
        except (SyntaxError, ValueError):
            continue  # a cell that does not parse defines nothing
    return trees


def _bindings(trees: list[ast.Module]) -> dict[str, object]:
    """name -> what bound it last at the top level: an _Import, or the statement (def, class, assignment, ...)."""
    bindings: dict[str, object] = {}
    for tree in trees:
        for statement in tree.body:
            if isinstance(statement, ast.Import):
                for alias in statement.names:
                    if alias.asname:
                        bindings[alias.asname] = _Import(alias.name, None)
                    else:  # `import minigrpo.losses` binds `minigrpo`
                        top = alias.name.split(".")[0]
                        bindings[top] = _Import(top, None)
            elif isinstance(statement, ast.ImportFrom) and statement.level == 0:
                for alias in statement.names:
                    bindings[alias.asname or alias.name] = _Import(statement.module or "", alias.name)
            else:
                for name in _bound_names(statement):
                    bindings[name] = statement
    return bindings


def _bound_names(statement: ast.stmt) -> set[str]:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    targets = []
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        targets = [statement.target]
    elif isinstance(statement, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in statement.items if item.optional_vars is not None]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _loads(node: ast.AST) -> tuple[set[str], list[list[str]]]:
    """Names a statement or expression reads (its own parameters left out), and its dotted chains `a.b.c`."""
    parameters = set()
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = inner.args
            every = arguments.posonlyargs + arguments.args + arguments.kwonlyargs
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            parameters |= {a.arg for a in every}
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    chains = []
    for inner in ast.walk(node):
        if isinstance(inner, ast.Attribute):
            chain, value = [inner.attr], inner.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                chains.append([value.id, *chain])
    return names - parameters, chains


# --- run time -----------------------------------------------------------------------------------
def watch_list(references: Sequence) -> list[dict]:
    """What to watch for while a check grades: {"name", "module", "qualname", "codes"} of each function in `references`.

    A function is watched by its code: [co_filename, co_firstlineno, co_name]; a class by the functions it defines
    (methods, static and class methods, properties). A decorated function by its own code, not its wrapper's: every
    function under @torch.no_grad() runs torch's one wrapper, which a learner's code runs too (the package's
    batched_per_token_logps is one). References that are data are not run, so not watched.
    """
    watched = []
    for reference in references:
        functions = [reference] if isinstance(reference, types.FunctionType) else []
        if isinstance(reference, type):
            functions = [f for value in vars(reference).values() for f in _functions_of(value)]
        functions = [inspect.unwrap(f) for f in functions]  # functools.wraps keeps the decorated one in __wrapped__
        codes = [_code_key(f.__code__) for f in functions]
        if codes:
            module, qualname = getattr(reference, "__module__", None), getattr(reference, "__qualname__", None)
            digests = [[code_digest(f.__code__), f.__code__.co_name, f.__code__.co_firstlineno] for f in functions]
            watched.append(
                {"name": _name(reference), "module": module, "qualname": qualname, "codes": codes, "digests": digests}
            )
    return watched


def _functions_of(value) -> list[types.FunctionType]:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if isinstance(f, types.FunctionType)]
    return [value] if isinstance(value, types.FunctionType) else []


def _code_key(code: types.CodeType) -> tuple[str, int, str]:
    return code.co_filename, code.co_firstlineno, code.co_name


def code_digest(code: types.CodeType) -> str:
    """What a function's code does, not where it lives: a digest of its instructions (with the names and constants
    they use; nested functions by their own digest) and its arguments and locals, leaving out its file, its line
    numbers, its name and its docstring. A copy of a function (its code object under another file name, or its source
    pasted elsewhere, comments and docstring changed or not) has the digest of the original."""
    digest = hashlib.sha256(repr((code.co_varnames, code.co_argcount, code.co_kwonlyargcount)).encode())
    instructions = list(dis.get_instructions(code))
    position = {instruction.offset: number for number, instruction in enumerate(instructions)}
    for instruction in instructions:
        # `m.f(x)` compiles to LOAD_ATTR where `m` is imported in the same file, to LOAD_METHOD elsewhere
        name = "LOAD_ATTR" if instruction.opname == "LOAD_METHOD" else instruction.opname
        if instruction.opcode in dis.hasjrel or instruction.opcode in dis.hasjabs:
            argument = str(position.get(instruction.argval))  # a jump, by the instruction it lands on
        else:
            argument = _normalised(instruction.argval)
        digest.update(f"{name} {argument}\n".encode())
    return digest.hexdigest()


def _normalised(value) -> str:
    """A repr of constants that is the same in every process: code by its digest, sets sorted."""
    if isinstance(value, types.CodeType):
        return code_digest(value)
    if isinstance(value, tuple):
        return "(" + ",".join(_normalised(v) for v in value) + ")"
    if isinstance(value, frozenset):  # its order follows string hashes, which differ between processes
        return "{" + ",".join(sorted(_normalised(v) for v in value)) + "}"
    return repr(value)


PROCESS_EVENTS = frozenset(
    {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile", "subprocess.Popen"}
)
"""The audit events of a new process: the watch cannot look into one, so a graded function may start none."""
_WATCHES: list[ReferenceWatch] = []
"""The watches in force, told by the audit hook of a process started or a profile hook set while they watch."""
_OURS = threading.local()
"""Set while a watch sets its own profile hook: the audit hook then does not count it against the function."""


def _audit(event: str, args: tuple) -> None:
    if not _WATCHES:
        return
    if event in PROCESS_EVENTS:
        for watch in _WATCHES:
            watch.process = watch.process or event
    elif event == "sys.setprofile" and not getattr(_OURS, "setting", False) and not _threading_sets_ours():
        for watch in _WATCHES:  # in any thread: a thread that drops the hook would run the reference unseen
            watch.intact = False


def _threading_sets_ours() -> bool:
    """Is the sys.setprofile being audited threading's own, at a thread's start, setting a watch's hook?"""
    caller = sys._getframe(2).f_code  # 0: this function, 1: _audit, 2: who called sys.setprofile
    ours = any(threading.getprofile() is watch._hook_fn for watch in _WATCHES)
    return ours and caller.co_filename == threading.__file__ and caller.co_name == "_bootstrap_inner"


@functools.cache
def _install_audit_hook() -> None:
    """Once per process: an audit hook cannot be removed (by the learner's code either), so it is installed for good
    and does nothing while no watch is in force."""
    sys.addaudithook(_audit)


@contextlib.contextmanager
def _ours():
    """Within the block, the profile hooks this thread sets are a watch's own (the audit hook lets them be)."""
    _OURS.setting = True
    try:
        yield
    finally:
        _OURS.setting = False


def _set_profile(hook, every_thread: bool = False) -> None:
    """`hook` as this thread's profile hook, and with `every_thread` (Python 3.12 and later) every other thread's."""
    with _ours():
        if every_thread and hasattr(threading, "setprofile_all_threads"):
            threading.setprofile_all_threads(hook)
        sys.setprofile(hook)


_THREAD_STARTERS = (
    ("_thread", "start_new_thread"),
    ("_thread", "start_new"),
    ("_thread", "start_joinable_thread"),  # Python 3.13's threading starts its threads with it
    ("threading", "_start_new_thread"),
    ("threading", "_start_joinable_thread"),
)
"""What starts a thread in Python: while a watch is in force, each one starts its function under the watch's hook."""


class ReferenceWatch:
    """Notes the first watched function that starts while in the block: in this thread, in every thread started in
    the block (through `threading` or `_thread`), and on Python 3.12 and later in every thread already running.

    watched: `watch_list(...)` as the judge sent it. The references are also looked up by module and name in
    this process, in case its copy of the package lives in another folder than the judge's.
    After the block: `ran` is the name of the reference that ran (None: none did), `intact` says whether the
    hook stayed in place (no code in any thread set another profile hook), and `process` names the audit event of
    a process started in the block (None: none was), whose code the watch cannot see.
    """

    def __init__(self, watched: list[dict]):
        self.names: dict[tuple, str] = {}
        # (code_digest, name, first line) of a reference's function -> the reference's name: its code object moved
        # to another file keeps all three; the same code written in a cell (a solution can be) has another first line
        self.copies: dict[tuple, str] = {}
        for entry in watched:
            keys = [tuple(code) for code in entry["codes"]]
            local = _resolve(entry.get("module"), entry.get("qualname"))
            keys += [key for item in watch_list([local]) for key in map(tuple, item["codes"])] if local else []
            self.names.update((key, entry["name"]) for key in keys)
            self.copies.update(((d, n, line), entry["name"]) for d, n, line in entry.get("digests", ()))
        self.files = {key[0] for key in self.names}
        self.ran: str | None = None
        self.intact = True
        self.process: str | None = None
        self._seen: dict[int, tuple[types.CodeType, str | None]] = {}  # id(code) -> (code, the reference it copies)

    def _hook(self, frame, event, arg):
        if event == "call" and self.ran is None:
            code = frame.f_code
            if code.co_filename in self.files:
                self.ran = self.names.get(_code_key(code))
            if self.ran is None and self.copies:  # a copy of a reference, under another file name
                seen = self._seen.get(id(code))
                if seen is None or seen[0] is not code:  # the code kept alive, so that its id is not reused
                    key = (code_digest(code), code.co_name, code.co_firstlineno)
                    seen = self._seen[id(code)] = (code, self.copies.get(key))
                self.ran = seen[1]

    def __enter__(self) -> ReferenceWatch:
        _install_audit_hook()
        self._previous, self._previous_threads = sys.getprofile(), threading.getprofile()
        self._hook_fn = self._hook  # one bound method, so that `is` can find it again
        self._starters = {
            (module, name): getattr(sys.modules[module], name)
            for module, name in _THREAD_STARTERS
            if module in sys.modules and hasattr(sys.modules[module], name)
        }
        for (module, name), start in self._starters.items():
            setattr(sys.modules[module], name, self._watched_start(start))
        _WATCHES.append(self)
        threading.setprofile(self._hook_fn)
        _set_profile(self._hook_fn, every_thread=True)  # Python 3.12: the threads already running too
        return self

    def __exit__(self, *exc) -> None:
        self.intact = self.intact and sys.getprofile() is self._hook_fn
        _WATCHES.remove(self)
        _set_profile(None, every_thread=True)  # no thread keeps the hook past the call
        _set_profile(self._previous)
        threading.setprofile(self._previous_threads)
        for (module, name), start in self._starters.items():
            setattr(sys.modules[module], name, start)

    def _watched_start(self, start):
        """`start` (a function that starts a thread), starting its thread's function under the watch's hook."""
        hook = self._hook_fn

        def watched_start(function, *args, **kwargs):
            def run(*inner, **named):
                _set_profile(hook)
                return function(*inner, **named)

            return start(run, *args, **kwargs)

        return watched_start


def _resolve(module: str | None, qualname: str | None):
    """The object `module.qualname` in this process (None when it is not there, or not the package's)."""
    if not module or not qualname or module.split(".")[0] != "minigrpo":
        return None
    value = sys.modules.get(module)
    for part in qualname.split("."):
        value = getattr(value, part, None)
    return value


def runtime_message(name: str) -> str:
    """The refusal for a function that ran the reference `name` (module.qualname) while it was graded."""
    return (
        f"your function ran the package's own {name} while it was graded: write your own implementation "
        "(the reference earns no points)."
    )


def process_message(event: str) -> str:
    """The refusal for a function that started a process (the audit event `event`) while it was graded."""
    return (
        f"your function started a process ({event}) while it was graded: the grader cannot see whether it runs the "
        "package's own solution there, so a function that does earns no points; compute in the function itself."
    )


WATCH_OFF_MESSAGE = (
    "your function switched off the grader's watch for the package's own solution (sys.setprofile) while it was "
    "graded: a function that does earns no points."
)
