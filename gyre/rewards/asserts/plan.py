"""Planning an assert test: which parts the parent evaluates and which leaves the sandbox must."""

from __future__ import annotations

import ast
import builtins
import copy
import math
from dataclasses import dataclass, field

PURE_FUNCTIONS = {name: getattr(builtins, name) for name in (
    "abs", "all", "any", "bool", "bytes", "complex", "dict", "divmod", "enumerate", "float", "frozenset", "int",
    "isinstance", "len", "list", "max", "min", "range", "repr", "reversed", "round", "set", "sorted", "str",
    "sum", "tuple", "type", "zip")}
MATH = {name: getattr(math, name) for name in (
    "isclose", "sqrt", "floor", "ceil", "fabs", "isnan", "isinf", "isfinite", "log", "exp", "pi", "e", "inf", "nan")}
CONSTANT_NAMES = {"True": True, "False": False, "None": None}
_PARENT_NODES = (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.IfExp, ast.Subscript, ast.Slice, ast.Tuple,
                 ast.List, ast.Set, ast.Dict, ast.Constant)
_DECISIONS = (ast.Compare, ast.BoolOp, ast.IfExp)
_DECIDING = {"all", "any", "bool", "isinstance", "isclose", "isnan", "isinf", "isfinite", "type"}
"""Calls that decide (their result is a verdict): always evaluated in the parent."""


class Unsplittable(ValueError):
    """The test cannot be evaluated outside the sandbox; it runs whole inside."""


@dataclass
class HelperCall:
    """A call of a setup function with values the program produced: ``name(*args, **keywords)``, the
    arguments planned like any expression (they become data before the helper runs)."""

    name: str
    args: list[ast.expr]
    keywords: dict[str, ast.expr]


@dataclass
class AssertPlan:
    """One test: its asserts with leaves replaced by names (``__ref_i``, ``__out_i``, ``__help_i``)."""

    checks: list[ast.expr]
    sources: list[str] = field(default_factory=list)
    """Each assert's own source, for failure messages."""
    reference: list[str] = field(default_factory=list)
    """Leaves evaluated after the setup, before the program (names the setup binds and builtins only)."""
    program: list[str] = field(default_factory=list)
    """Leaves evaluated after the program ran."""
    helpers: list[HelperCall] = field(default_factory=list)
    """Setup functions applied to program values, in a second run without the program."""
    constants: dict[str, object] = field(default_factory=dict)
    """The test's own literal assignments (``expected = [1, 2]``): values the parent knows."""
    inputs: dict[str, str] = field(default_factory=dict)
    """Those constants the leaves use (inputs of the program's calls), as source to define in the sandbox."""


def bound_names(source: str) -> set[str]:
    """Names a module's top level binds (imports, defs, classes, assignments)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


_MAX_UNROLLED = 2000
"""Most asserts a test's literal loops may unroll into; a longer test runs isolated instead."""


def _block(stmts: list[ast.stmt], constants: dict[str, ast.expr]) -> list[ast.Assert] | None:
    """The asserts of a block whose other statements are docstrings, literal assignments (recorded in
    ``constants``) and loops over literals (unrolled, see ``_unroll``); None when it holds anything else."""
    asserts = []
    for stmt in stmts:
        if isinstance(stmt, ast.Assert):
            asserts.append(_with_constants(stmt, constants))
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
              and _is_literal(stmt.value)):
            constants[stmt.targets[0].id] = stmt.value
        elif isinstance(stmt, ast.For):
            unrolled = _unroll(stmt, constants)
            if unrolled is None:
                return None
            asserts.extend(unrolled)
        else:
            return None
        if len(asserts) > _MAX_UNROLLED:
            return None
    return asserts


def _with_constants(stmt: ast.Assert, constants: dict[str, ast.expr]) -> ast.Assert:
    """The assert with the constants' values as they are where it stands: a name bound again later (``e = 2;
    assert f(1) == e; e = 4``, or in an unrolled loop's body) must not be judged against its last value.
    Names the assert binds itself (a comprehension's or lambda's) are left alone."""
    own = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    own |= {a.arg for n in ast.walk(stmt) if isinstance(n, ast.Lambda) for a in n.args.args}
    values = {k: v for k, v in constants.items() if k not in own}
    return ast.fix_missing_locations(_Substitute(values).visit(copy.deepcopy(stmt))) if values else stmt


def _unroll(loop: ast.For, constants: dict[str, ast.expr]) -> list[ast.Assert] | None:
    """``for a, b in [(1, 2), (3, 4)]: assert f(a) == b`` as ``assert f(1) == 2`` and ``assert f(3) == 4``:
    a loop over a literal list or tuple (or a name bound to one) whose body is asserts, literal
    assignments and such loops, each loop variable replaced by its literal value. None otherwise."""
    iterable = constants.get(loop.iter.id) if isinstance(loop.iter, ast.Name) else loop.iter
    targets = loop.target.elts if isinstance(loop.target, (ast.Tuple, ast.List)) else [loop.target]
    names = [t.id for t in targets if isinstance(t, ast.Name)]
    if (not isinstance(iterable, (ast.List, ast.Tuple)) or not _is_literal(iterable) or loop.orelse
            or len(names) != len(targets) or len(set(names)) != len(names)):
        return None
    rebound = {n.id for s in loop.body for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    rebound |= {n.arg for s in loop.body for n in ast.walk(s) if isinstance(n, ast.arg)}
    if rebound & set(names):
        return None  # the body rebinds a loop variable: substituting it would change the meaning
    out: list[ast.Assert] = []
    for element in iterable.elts:
        if isinstance(loop.target, ast.Name):
            values = [element]
        elif isinstance(element, (ast.Tuple, ast.List)) and len(element.elts) == len(names):
            values = element.elts
        else:
            return None  # e.g. unpacking a string or a nested shape: leave it to the isolated run
        body = [_Substitute(dict(zip(names, values))).visit(copy.deepcopy(s)) for s in loop.body]
        inner = _block([ast.fix_missing_locations(s) for s in body], constants)
        if inner is None or len(out) + len(inner) > _MAX_UNROLLED:
            return None
        out.extend(inner)
    if iterable.elts:  # after the loop its variables keep the last element's values, as in Python
        constants.update(dict(zip(names, values)))
    return out


class _Substitute(ast.NodeTransformer):
    """Loop variables (read only) replaced by copies of their literal values."""

    def __init__(self, values: dict[str, ast.expr]):
        self.values = values

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if isinstance(node.ctx, ast.Load) and node.id in self.values:
            return ast.copy_location(copy.deepcopy(self.values[node.id]), node)
        return node


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _asserts_of(test: str, constants: dict[str, ast.expr]) -> list[ast.Assert]:
    """The asserts of a test: top-level asserts (and literal assignments), or HumanEval's form (literal
    assignments, ``def check(candidate)`` of asserts, ``check(entry_point)``) with ``candidate`` renamed."""
    body = ast.parse(test).body
    flat = _block(body, constants)
    if flat:
        return flat
    defs = [s for s in body if isinstance(s, ast.FunctionDef)]
    calls = [s for s in body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    rest = [s for s in body if s not in defs and s not in calls]
    if len(defs) == 1 and len(calls) == 1 and len(defs[0].args.args) == 1 and _block(rest, constants) == []:
        fn, call = defs[0], calls[0].value
        inner = _block(fn.body, constants)
        if (inner and isinstance(call.func, ast.Name) and call.func.id == fn.name and len(call.args) == 1
                and isinstance(call.args[0], ast.Name)):
            param, entry = fn.args.args[0].arg, call.args[0].id
            return [ast.fix_missing_locations(_Rename(param, entry).visit(s)) for s in inner]
    raise Unsplittable("the test is not a sequence of asserts")


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def free_names(node: ast.AST) -> set[str]:
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {a.arg for n in ast.walk(node) if isinstance(n, ast.Lambda) for a in n.args.args}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def is_math(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math"
            and node.attr in MATH)


class _Planner:
    """Replaces every subtree the parent cannot evaluate with a leaf name (see ``plan_test``)."""

    def __init__(self, setup_names: set[str], constants: dict[str, ast.expr]):
        self.setup_names = setup_names
        self.constants = constants
        # The setup (trusted) may rebind a builtin; the program may not change what the parent calls.
        self.pure = {n for n in PURE_FUNCTIONS if n not in setup_names}
        self.reference_names = setup_names | set(dir(builtins)) | set(constants)
        self.plan = AssertPlan([], constants={k: ast.literal_eval(v) for k, v in constants.items()})

    def leaf(self, node: ast.expr) -> ast.Name:
        if any(isinstance(n, _DECISIONS) for n in ast.walk(node)):
            raise Unsplittable("a comparison inside an expression the sandbox must evaluate")
        names = free_names(node)
        for name in names & set(self.constants):
            self.plan.inputs[name] = ast.unparse(self.constants[name])
        source = ast.unparse(node)
        if names <= self.reference_names:
            self.plan.reference.append(source)
            return ast.Name(f"__ref_{len(self.plan.reference) - 1}", ast.Load())
        self.plan.program.append(source)
        return ast.Name(f"__out_{len(self.plan.program) - 1}", ast.Load())

    def visit(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.Name):
            parent_side = node.id in CONSTANT_NAMES or node.id in self.pure or node.id in self.constants
            return node if parent_side else self.leaf(node)
        if is_math(node):
            return node
        if isinstance(node, ast.Call):
            return self._call(node)
        displays = (ast.Tuple, ast.List, ast.Set)
        starred = isinstance(node, displays) and any(isinstance(e, ast.Starred) for e in node.elts)
        if isinstance(node, _PARENT_NODES) and not starred and not (isinstance(node, ast.Dict) and None in node.keys):
            for name, value in ast.iter_fields(node):
                if isinstance(value, ast.expr):
                    setattr(node, name, self.visit(value))
                elif isinstance(value, list):
                    setattr(node, name, [self.visit(v) if isinstance(v, ast.expr) else v for v in value])
            return node
        return self.leaf(node)

    def _call(self, node: ast.Call) -> ast.expr:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        unpacked = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
        if name in self.setup_names and not unpacked and not free_names(node) <= self.reference_names:
            return self._helper(node, name)
        if not (name in self.pure or is_math(node.func)) or unpacked:
            return self.leaf(node)
        original = copy.deepcopy(node)
        marks = len(self.plan.reference), len(self.plan.program)
        node.args = [self.visit(a) for a in node.args]
        node.keywords = [ast.keyword(k.arg, self.visit(k.value)) for k in node.keywords]
        planned = [*node.args, *(k.value for k in node.keywords)]
        leaves = [a for a in planned if isinstance(a, ast.Name) and a.id.startswith(("__ref_", "__out_"))]
        if planned and len(leaves) == len(planned) and name not in _DECIDING:
            # e.g. list(f(x)) or sorted(f(x), key=len): no expected value inside, nothing decided;
            # materialise it in the sandbox (f may return an iterator)
            del self.plan.reference[marks[0]:], self.plan.program[marks[1]:]
            return self.leaf(original)
        return node

    def _helper(self, node: ast.Call, name: str) -> ast.Name:
        """A setup function applied to program values: its arguments are planned here, and it runs in a
        second sandbox run without the program (the program cannot rebind it there)."""
        count = len(self.plan.helpers)
        args = [self.visit(a) for a in node.args]
        keywords = {k.arg: self.visit(k.value) for k in node.keywords}
        if len(self.plan.helpers) != count:
            raise Unsplittable("a setup helper applied to another helper's result")
        self.plan.helpers.append(HelperCall(name, args, keywords))
        return ast.Name(f"__help_{count}", ast.Load())


def plan_test(test: str, setup: str) -> AssertPlan:
    """Split ``test`` (see the package docstring); raises ``Unsplittable`` when it cannot be."""
    constants: dict[str, ast.expr] = {}
    try:
        asserts = _asserts_of(test, constants)
        setup_names = bound_names(setup) if setup.strip() else set()
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Unsplittable(str(exc)) from None
    planner = _Planner(setup_names, constants)
    for statement in asserts:
        planner.plan.sources.append(ast.unparse(statement))
        planner.plan.checks.append(planner.visit(statement.test))
    return planner.plan
