"""Follow one value through orsd's calls, statically, and count the rooms it enters (issue 68).

    python scripts/walks.py [--tree DIR] [--out FILE.json]

Walks `groups` from orsd/train/trainer.py:Trainer.step and `resume_from` from orsd/train/build.py:build
in DIR (default: this checkout; an older commit via `git worktree add` or `git archive`), reading
DIR/orsd/**/*.py with the stdlib's `ast`.

- Tainted: the start parameter; in a function, a name bound (`=`, `+=`, `for`, `with .. as`, `:=`, a
  comprehension, a nested def) from an expression using a tainted name (`a, b = x, y` pairwise), and
  `d` of `d[k] = ..`, `d.f = ..`, `d.append(..)` (extend/add/update/insert/setdefault) given one;
  never `self`. Flow-insensitive: tainted anywhere in a function, tainted in all of it.
- Followed call: a call with an argument (positional, keyword, `*`, `**`) using a tainted name, to a
  function or `__init__` under orsd/; the parameters those arguments land on are tainted and the callee
  is walked (again only for new tainted parameters). Lambdas and nested defs are read as part of their
  function. Callees resolve by the imports (module level and the function's own: `from .x import f`,
  `from . import x` then `x.f`, `import orsd.x`; re-exports followed), the module's defs, `self.m`
  (class and bases), `Cls.m`, and `self.a.m` / `x.m` where `self.a` (in the class) / `x` (in the
  function) is assigned `Cls(..)` or `y or Cls(..)`. Counted once per call site and callee, depth
  first in source order.
- Room: a file under orsd/ holding the start or a followed callee; its calls: the followed calls into it.
- Climb: (a) a followed call from room A into room B != A where B holds a function on the current call
  path (start .. caller, as first reached): a helper living upstream; (b) a callback: a lambda or nested
  def using a tainted name, passed to a followed callee in another room: one climb back into the
  caller's room (assumed called). The acyclic import graph (tests/package/test_imports.py) keeps (a) at 0.
- Return: a followed call whose callee's own `return`/`yield` uses a tainted name (an `__init__`: stores
  one on `self`).
- Unresolved: a tainted call whose callee is not found (a method of a parameter or of a value of unknown
  class: `method.advantages`, `engine.generate`, a tensor's `.to`; a callable parameter: `log`).
  External: a builtin, an import from outside orsd/, a module global made by one, or a str/list/dict/set
  method by its name. Built: a class under orsd/ without an `__init__` (a dataclass): no room entered.

Limits: static; no dynamic dispatch (the method object, an engine's class), type annotations, properties,
`getattr` or decorators' wrappers; values stored on `self` are not followed to the methods reading them;
bound methods passed as callables (`self.plain_pass`) and calls tainted only in their receiver (`x.m()`)
are not followed; taint over-approximates (any use taints).
"""
from __future__ import annotations

import argparse
import ast
import builtins
import json
from pathlib import Path

WALKS = [("groups", "orsd/train/trainer.py", "Trainer.step"), ("resume_from", "orsd/train/build.py", "build")]
MUTATORS = {"append", "extend", "add", "update", "insert", "setdefault"}
FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


class Tree:
    """The modules under DIR/orsd: their functions, classes and the names they bind."""

    def __init__(self, root: Path):
        self.mods, self.funcs, self.classes = {}, {}, {}
        for path in sorted((root / "orsd").rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            self.mods[name] = {"path": path.relative_to(root).as_posix(), "ast": ast.parse(path.read_text())}
        for mod, info in self.mods.items():  # every module known first: `from . import x` names one
            info["ns"] = self.names(mod, info["ast"].body, top=True)
            for node in info["ast"].body:  # top-level functions, classes and their methods
                cls = node if isinstance(node, ast.ClassDef) else None
                self.classes.update({(mod, node.name): node} if cls else {})
                for f in (f for f in (node.body if cls else [node]) if isinstance(f, FUNCS)):
                    key = (mod, f"{cls.name}.{f.name}" if cls else f.name)
                    self.funcs[key] = {"node": f, "mod": mod, "cls": cls, "key": key}

    def names(self, mod, body, top=False, ns=None):
        """name -> ('from', m, name) | ('module', m) | ('ext',) | ('global', mod, call) | ('shadow',)."""
        ns = {} if ns is None else ns
        package = mod if self.mods[mod]["path"].endswith("__init__.py") else mod.rpartition(".")[0]
        for node in body:
            if top and isinstance(node, FUNCS + (ast.ClassDef,)):
                ns[node.name] = ("from", mod, node.name)
            elif top and isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                ns.update({t.id: ("global", mod, node.value) for t in node.targets if isinstance(t, ast.Name)})
            elif isinstance(node, ast.Import):
                for a in node.names:  # `import orsd.x as y` binds y to orsd.x, `import orsd.x` binds orsd
                    module = ("module", a.asname and a.name or "orsd") if a.name.split(".")[0] == "orsd" else ("ext",)
                    ns[a.asname or a.name.split(".")[0]] = module
            elif isinstance(node, ast.ImportFrom):
                base, parts = node.module or "", package.split(".")
                if node.level:
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                for a in node.names:
                    ns[a.asname or a.name] = ("from", base, a.name) if base.startswith("orsd") else ("ext",)
        return ns

    def lookup(self, entry, depth=0):
        """A namespace entry as ('func', key) | ('class', key) | ('module', m) | ('ext',) | None."""
        if entry is None or entry[0] == "shadow" or depth > 10:
            return None  # unknown, or a parameter or local of the function
        if entry[0] == "global":  # `_TAG = re.compile(..)`: external when what made it is
            made = self.expr(entry[2].func, entry[1], {}, None, {})
            return ("ext",) if made and made[0] == "ext" else None
        if entry[0] != "from":
            return entry if entry[0] == "ext" or entry[1] in self.mods else None
        mod, name = entry[1:]
        for kind, table in (("func", self.funcs), ("class", self.classes)):
            if (mod, name) in table:
                return (kind, (mod, name))
        ns = self.mods.get(mod, {}).get("ns", {})
        if f"{mod}.{name}" in self.mods and ns.get(name, entry) == entry:  # a submodule
            return ("module", f"{mod}.{name}")
        return self.lookup(ns.get(name), depth + 1)  # a re-export

    def method(self, cls_key, name, depth=0):
        """Method `name` of class `cls_key` or of its bases under orsd/."""
        if (cls_key[0], f"{cls_key[1]}.{name}") in self.funcs:
            return cls_key[0], f"{cls_key[1]}.{name}"
        for base in self.classes[cls_key].bases if depth < 10 else []:
            found = self.expr(base, cls_key[0], {}, None, {})
            hit = found and found[0] == "class" and self.method(found[1], name, depth + 1)
            if hit:
                return hit
        return None

    def expr(self, node, mod, local, cls, types):
        """What a callee names: ('func', key, bound) | ('class', key) | ('module', m) | ('ext',) | None."""
        if isinstance(node, ast.Name):
            entry = local.get(node.id) or self.mods[mod]["ns"].get(node.id)
            found = ("ext",) if entry is None and hasattr(builtins, node.id) else self.lookup(entry)
        elif not isinstance(node, ast.Attribute):
            return None
        elif ast.unparse(node.value) == "self" and cls is not None or ast.unparse(node.value) in types:
            key = self.method(types.get(ast.unparse(node.value), (mod, getattr(cls, "name", ""))), node.attr)
            return ("func", key, True) if key else None  # self.m, or self.writer.m / writer.m of a known class
        else:
            found = self.expr(node.value, mod, local, cls, types)
            if found and found[0] == "module":
                found = self.lookup(("from", found[1], node.attr))
            elif found and found[0] == "class":  # Cls.m: a classmethod binds cls
                key = self.method(found[1], node.attr)
                bound = key and "classmethod" in {ast.unparse(d) for d in self.funcs[key]["node"].decorator_list}
                return ("func", key, bound) if key else None
            elif not found or found[0] != "ext":
                return None
        return found + (False,) if found and found[0] == "func" else found


def uses(node, tainted):
    return node is not None and any(isinstance(n, ast.Name) and n.id in tainted for n in ast.walk(node))


def bindings(fn):
    """(target, value) for every binding in `fn`, nested lambdas, defs and comprehensions included."""
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign):  # `a, b = x, y` pairs a with x and b with y
            pairs = all(isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple) and len(t.elts) == len(
                n.value.elts) and not any(isinstance(e, ast.Starred) for e in t.elts) for t in n.targets)
            yield from (p for t in n.targets for p in (zip(t.elts, n.value.elts) if pairs else [(t, n.value)]))
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and n.value is not None:
            yield n.target, n.value
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
            yield n.target, n.iter
        elif isinstance(n, ast.withitem) and n.optional_vars is not None:
            yield n.optional_vars, n.context_expr
        elif isinstance(n, FUNCS) and n is not fn:  # a closure over a tainted name
            yield ast.Name(n.name), n
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS:
            yield n.func.value, ast.Tuple([*n.args, *(k.value for k in n.keywords)])


def roots(target):
    """The names a target binds or fills: `a, (b, c)`; `d` of `d[k]` and `d.f` (never `self`)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return {name for t in target.elts for name in roots(t)}
    while isinstance(target, (ast.Subscript, ast.Starred, ast.Attribute)):
        target = target.value
    return {target.id} if isinstance(target, ast.Name) and target.id != "self" else set()


def taint(fn, params):
    tainted, grew = set(params), True
    while grew:
        new = {name for target, value in bindings(fn) if uses(value, tainted) for name in roots(target)}
        grew, tainted = bool(new - tainted), tainted | new
    return tainted


def hands_back(fn, tainted):
    """Whether `fn`'s own nodes (not a nested def's) return or yield a tainted value (an __init__: store it on self)."""
    todo = list(fn.body)
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom)) and uses(n.value, tainted) or fn.name == "__init__" \
                and isinstance(n, ast.Assign) and uses(n.value, tainted) and "self." in ast.unparse(n.targets[0]):
            return True
        todo.extend(c for c in ast.iter_child_nodes(n) if not isinstance(c, FUNCS + (ast.Lambda,)))
    return False


def landing(fn, call, tainted, bound):
    """The parameters of `fn` that the call's tainted arguments land on."""
    a = fn.args
    positional = [p.arg for p in a.posonlyargs + a.args][1 if bound else 0:]
    named, extra, hit = set(positional) | {p.arg for p in a.kwonlyargs}, [a.vararg.arg] if a.vararg else [], set()
    for i, arg in enumerate(call.args):
        if uses(arg, tainted):
            hit.update(positional[i:] + extra if isinstance(arg, ast.Starred) else positional[i:i + 1] or extra)
    for k in (k for k in call.keywords if uses(k.value, tainted)):
        if k.arg is None:  # **kwargs
            hit |= named - set(positional[:len(call.args)]) | ({a.kwarg.arg} if a.kwarg else set())
        else:
            hit |= {k.arg} if k.arg in named else {a.kwarg.arg} if a.kwarg else set()
    return hit


def types_in(tree, f, local):
    """`x` (in the function) and `self.a` (in its class) assigned `Cls(..)` or `y or Cls(..)`."""
    types = {}
    for scope, on_self in ((f["node"], False), (f["cls"], True)):
        for node in (n for n in ast.walk(scope or ast.Pass()) if isinstance(n, ast.Assign)):
            for option in node.value.values if isinstance(node.value, ast.BoolOp) else [node.value]:
                made = tree.expr(option.func, f["mod"], local, f["cls"], {}) if isinstance(option, ast.Call) else None
                for t in node.targets if made and made[0] == "class" else []:
                    if ast.unparse(t).startswith("self.") if on_self else isinstance(t, ast.Name):
                        types.setdefault(ast.unparse(t), made[1])
    return types


def walk(tree, path, qualname, param):
    start = tree.funcs[(next(m for m, i in tree.mods.items() if i["path"] == path), qualname)]
    done, edges, other, unresolved = {}, {}, {}, set()
    room = lambda f: tree.mods[f["mod"]]["path"]  # noqa: E731

    def visit(f, params, stack):
        if params <= done.get(f["key"], set()):
            return
        node, done[f["key"]] = f["node"], done.get(f["key"], set()) | params
        tainted, a, every = taint(node, done[f["key"]]), node.args, list(ast.walk(node))
        local = {n: ("shadow",) for n in [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs] + [
            n.id for n in every if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]}
        tree.names(f["mod"], [n for n in every if isinstance(n, (ast.Import, ast.ImportFrom))], ns=local)
        types, closures = types_in(tree, f, local), {n.name for n in every if isinstance(n, FUNCS) and n is not node}
        for call in sorted((n for n in every if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)):
            args, site = call.args + [k.value for k in call.keywords], (f["key"], call.lineno, call.col_offset)
            if not any(uses(x, tainted) for x in args) or isinstance(call.func, ast.Name) and call.func.id in closures:
                continue  # untainted, or a nested def's: its body is read as its function's
            found = tree.expr(call.func, f["mod"], local, f["cls"], types) or ("?",)
            if found[0] == "class":
                init = tree.method(found[1], "__init__")
                found = ("func", init, True) if init else ("built",)
            if found[0] in ("?", "module") and isinstance(call.func, ast.Attribute) and (isinstance(
                    call.func.value, ast.Constant) or any(hasattr(t, call.func.attr) for t in (str, list, dict, set))):
                found = ("ext",)  # ", ".join, rows.append: by the method's name
            params_in = landing(tree.funcs[found[1]]["node"], call, tainted, found[2]) if found[0] == "func" else set()
            if found[0] in ("ext", "built"):
                other[site] = found[0]
            elif not params_in:
                unresolved.add(f"{room(f)}:{call.lineno} {ast.unparse(call.func)}"
                               + (" (no parameter takes it)" if found[0] == "func" else ""))
            else:
                callee = tree.funcs[found[1]]
                callbacks = sum(uses(x, tainted) and (isinstance(x, ast.Lambda) or ast.unparse(x) in closures)
                                for x in args) if callee["mod"] != f["mod"] else 0
                edges.setdefault(site + (callee["key"],), {
                    "caller": ":".join(f["key"]), "line": call.lineno, "callee": ":".join(callee["key"]),
                    "into": room(callee), "params": sorted(params_in),
                    "returns": hands_back(callee["node"], taint(callee["node"], params_in)),
                    "climb": callee["mod"] != f["mod"] and callee["mod"] in {s["mod"] for s in stack},
                    "callbacks_into": [room(f)] * callbacks})
                visit(callee, params_in, stack + [callee])

    visit(start, {param}, [start])
    calls = list(edges.values())
    climbs = [c["into"] for c in calls if c["climb"]] + [r for c in calls for r in c["callbacks_into"]]
    per_room = {r: {"calls": sum(c["into"] == r for c in calls), "climbs": climbs.count(r),
                    "returns": sum(c["into"] == r and c["returns"] for c in calls)}
                for r in sorted({room(tree.funcs[k]) for k in done})}
    return {"start": f"{path}:{qualname}", "value": param, "rooms": len(per_room), "calls": len(calls),
            "climbs": len(climbs), "returns": sum(c["returns"] for c in calls), "unresolved": len(unresolved),
            "external": list(other.values()).count("ext"), "built": list(other.values()).count("built"),
            "per_room": per_room, "edges": calls, "unresolved_calls": sorted(unresolved)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent, help="a checkout")
    parser.add_argument("--out", type=Path, help="write each walk with its calls and unresolved calls as JSON")
    args = parser.parse_args(argv)
    tree = Tree(args.tree.resolve())
    walks = {value: walk(tree, path, qualname, value) for value, path, qualname in WALKS}
    for value, w in walks.items():
        print(f"\n{value} from {w['start']}: {w['rooms']} rooms, {w['calls']} calls, {w['climbs']} climbs, "
              f"{w['returns']} returns; {w['unresolved']} unresolved, {w['external']} external, {w['built']} built")
        print(f"  {'room':<36}{'calls':>6}{'climbs':>7}{'returns':>8}")
        for name, c in sorted(w["per_room"].items(), key=lambda kv: (-kv[1]["calls"], kv[0])):
            print(f"  {name:<36}{c['calls']:>6}{c['climbs']:>7}{c['returns']:>8}")
    if args.out:
        args.out.write_text(json.dumps({"tree": str(args.tree), "walks": walks}, indent=1) + "\n")


if __name__ == "__main__":
    main()
