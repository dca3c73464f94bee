"""Rewrite rules as egglog text, with the metadata users and tests need (level, side condition).

A rule is egglog source plus an `example`: a function from a random generator to a concrete
term that the left-hand side matches. The property tests use the example to check, with the
reference interpreter, that every term the rule adds to the e-graph means the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from egraph_rules.ir import SCHEMA, Term

LEVELS = ("dsl", "algorithmic", "hardware")
Example = Callable[[np.random.Generator], Term]


@dataclass(frozen=True, init=False)
class Rule:
    """One named rewrite (possibly several egglog commands: its variants)."""

    name: str
    level: str
    egglog: tuple[str, ...]
    condition: str
    doc: str
    examples: tuple[Example, ...] = field(default=(), compare=False)

    def __init__(self, name: str, level: str, egglog: tuple[str, ...], condition: str, doc: str, *examples: Example):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "egglog", egglog)
        object.__setattr__(self, "condition", condition)
        object.__setattr__(self, "doc", doc)
        object.__setattr__(self, "examples", examples)

    def union(self, other: Rule) -> Rule:
        """This rule with the other's variants and side condition added (the same rule
        instantiated for another target's sizes); unchanged when they are the same."""
        extra = tuple(t for t in other.egglog if t not in self.egglog)
        if not extra:
            return self
        return Rule(self.name, self.level, self.egglog + extra, f"{self.condition}; or {other.condition}", self.doc,
                    *self.examples, *other.examples)

    def commands(self, without: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """The egglog commands but those in `without`, each named `rule-name#i` so that run
        reports count by rule."""
        return [t[:-1] + f' :name "{self.name}#{i}")' for i, t in enumerate(self.egglog) if t not in without]


def chain(parts: list[str], rest: str | None) -> str:
    """Right-nested composition text of parts, ending in `rest` when given."""
    out = rest
    for p in reversed(parts):
        out = p if out is None else f"(Comp {p} {out})"
    assert out is not None
    return out


def tail_walk(rel: str, depth: int) -> str:
    """The analysis rule extending (rel f k), f's chain reaches a marked tail after k stages, up
    the chains to `depth` stages."""
    return f"(rule (({rel} r k) (< k {depth}) (= f (Comp p r))) (({rel} f (+ k 1))) :ruleset analysis)"


def tail_chain(root: str, parts: list[str], tail: str, rel: str) -> str:
    """Query atoms matching `root` as the composition of parts ending in `tail`, every stage on
    a chain that reaches a marked tail (see tail_walk) at its depth: a rule matching long chains
    then only walks those, where matching bare chains tries every combination of stages."""
    names = [root] + [f"{root}__{i}" for i in range(1, len(parts) + 1)]
    stages = [f"({rel} {name} {len(parts) - i})" for i, name in enumerate(names)]
    stages += [f"(= {names[i]} (Comp {p} {names[i + 1]}))" for i, p in enumerate(parts)]
    stages.append(f"(= {names[-1]} {tail})")
    return " ".join(stages)


def rewrite(lhs: str, rhs: str, level: str, when: list[str] | None = None, subsume: bool = False) -> str:
    """An egglog rewrite in the ruleset of its level; a subsuming one hides its left-hand side
    from further matching (for rewrites to a canonical form). Extraction still sees it: egglog
    serializes subsumed e-nodes, and some e-classes hold only those (two Comp classes of a GRU
    on systolic), so dropping them would leave e-classes with nothing to extract."""
    cond = f" :when ({' '.join(when)})" if when else ""
    sub = " :subsume" if subsume else ""
    return f"(rewrite {lhs} {rhs}{cond}{sub} :ruleset {level})"


_TOKEN = re.compile(r'"[^"]*"|[()]|[^\s()]+')


def _tree(tokens: list[str], i: int = 0) -> tuple[str | tuple, int]:
    """The s-expression starting at tokens[i] as nested tuples, and the index after it."""
    if tokens[i] != "(":
        return tokens[i], i + 1
    items, i = [], i + 1
    while tokens[i] != ")":
        item, i = _tree(tokens, i)
        items.append(item)
    return tuple(items), i + 1


def _text(t: str | tuple) -> str:
    return t if isinstance(t, str) else f"({' '.join(_text(x) for x in t)})"


def shared_rewrite(lhs: str, rhs: str, level: str, when: list[str] | None = None) -> str:
    """A rewrite whose right-hand side reaches egglog with each repeated sub-term bound once by
    a `let` (an egglog rule with the same query and a union): egglog's cost to add a rule grows
    with its text, and lstmcell-hidden-blocks' 22 KB right-hand side took 0.15 s and 300 MB to
    add per variant, its 5 KB shared form 0.006 s."""
    tree, _ = _tree(_TOKEN.findall(rhs))
    seen: dict[tuple, int] = {}

    def count(t: str | tuple) -> None:
        if isinstance(t, tuple):
            seen[t] = seen.get(t, 0) + 1
            if seen[t] == 1:
                for x in t[1:]:
                    count(x)

    count(tree)
    names: dict[tuple, str] = {}
    lets: list[str] = []

    def bind(t: str | tuple) -> str | tuple:
        if not isinstance(t, tuple):
            return t
        if t in names:
            return names[t]
        out = (t[0], *(bind(x) for x in t[1:]))
        if seen[t] > 1:
            names[t] = f"shared{len(names)}__"
            lets.append(f"(let {names[t]} {_text(out)})")
            return names[t]
        return out

    top = _text(bind(tree))
    query = " ".join([f"(= lhs__ {lhs})", *(when or [])])
    return f"(rule ({query}) ({' '.join(lets)} (union lhs__ {top})) :ruleset {level})"


def chain_rewrites(lhs: list[str], rhs: list[str], level: str, when: list[str] | None = None) -> tuple[str, ...]:
    """A rewrite of a composition chain, at the end of a chain and in the middle of one."""
    return (
        rewrite(chain(lhs, None), chain(rhs, None), level, when),
        rewrite(chain(lhs, "rest__"), chain(rhs, "rest__"), level, when),
    )


# ---------------------------------------------------------------- analyses

LEAF_FOUT = {
    "Id": ("(Id t)", "t"),
    "Fst": ("(Fst (TP a b))", "a"),
    "Snd": ("(Snd (TP a b))", "b"),
    "Split": ("(Split k (TA e m))", "(TA (TA e k) (/ m k))"),
    "Join": ("(Join (TA (TA e k) m))", "(TA e (* k m))"),
    "Transpose": ("(Transpose (TA (TA e m) n))", "(TA (TA e n) m)"),
    "Zip": ("(Zip (TP (TA a n) (TA b n)))", "(TA (TP a b) n)"),
    "DistR": ("(DistR (TP (TA a n) c))", "(TA (TP a c) n)"),
    "Pad": ("(Pad l r (TA e n))", "(TA e (+ l (+ n r)))"),
    "PadWith": ("(PadWith l r x (TA e n))", "(TA e (+ l (+ n r)))"),
    "Slice": ("(Slice s k (TA e n))", "(TA e k)"),
    "Slide": ("(Slide k st (TA e n))", "(TA (TA e k) (+ 1 (/ (- n k) st)))"),
    "VVAdd": ("(VVAdd (TP t t))", "t"),
    "VVMul": ("(VVMul (TP t t))", "t"),
    "VVSub": ("(VVSub (TP t t))", "t"),
    "VVMax": ("(VVMax (TP t t))", "t"),
    "Concat": ("(Concat (TP (TA a n) (TA a m)))", "(TA a (+ n m))"),
    "GRUCell": ("(GRUCell wi wh bi bh (TP x h))", "h"),
    "LSTMCell": ("(LSTMCell wi wh bi bh (TP x s))", "s"),
    "RNNCell": ("(RNNCell wi wh bi bh act (TP x h))", "h"),
    "VVRelu": ("(VVRelu t)", "t"),
    "VVTanh": ("(VVTanh t)", "t"),
    "VVSigm": ("(VVSigm t)", "t"),
    "MVMul": ("(MVMul (TP (TA (TA s k) n) v))", "(TA s n)"),
    "MMMul": ("(MMMul (TP (TA (TA s k) n) (TA (TA s2 m) k2)))", "(TA (TA s m) n)"),
    "ToChip": ("(ToChip sp t)", "t"),
    "Restage": ("(Restage sp t)", "t"),
    "ToDram": ("(ToDram t)", "t"),
    "ToOutput": ("(ToOutput t)", "t"),
    "Dev": ("(Dev name t u)", "u"),
    "DevOut": ("(DevOut name t u)", "u"),
}


def analysis_program() -> str:
    """egglog functions and rules giving every function its input and output type, every value
    its type, and every function whose output sits in a named on-chip memory that memory."""
    lines = [
        "(constructor fout (F) Ty)",
        "(constructor fin (F) Ty)",
        "(constructor ty (E) Ty)",
        "(relation isview (F))",
        "(relation reindex (F))",
        "(relation islayout (F))",
        "(relation rowview (F))",
        "(relation ismove (F))",
        "(relation readsfst (F))",
        "(relation readssnd (F))",
        "(relation inspace (F String))",
        # chains ending in the operand moves tochip-hoist-from-reduce takes out (see tail_walk)
        "(relation reducetail (F i64))",
        # (leftcomp fg h p): p is the e-class of the composition fg . h whose first stage fg is a
        # composition too, which compose-assoc re-associated (and hid)
        "(relation leftcomp (F F F))",
        # the stages of Fold steps, where tochip-hoist-from-fold looks for state moves
        "(relation foldstage (F i64))",
        # the move of one part of a pair that tochip-hoist-from-map puts before a loop
        "(constructor PairMove (F String) F)",
        "(ruleset analysis)",
    ]

    def rule(query: str, action: str) -> None:
        lines.append(f"(rule ({query}) ({action}) :ruleset analysis)")

    for pat, out in LEAF_FOUT.values():
        rule(f"(= f {pat})", f"(union (fout f) {out})")
    rule("(= f (Comp g h)) (= t (fout g))", "(union (fout f) t)")
    rule("(= f (Fork g h)) (= a (fout g)) (= b (fout h))", "(union (fout f) (TP a b))")
    rule("(= f (Const c t)) (= u (ty c))", "(union (fout f) u)")
    rule("(= f (Map g n)) (= u (fout g))", "(union (fout f) (TA u n))")
    rule("(= f (Reduce g t)) (= u (fout g))", "(union (fout f) u)")
    rule("(= f (Fold g (TP a xs)))", "(union (fout f) a)")
    rule("(= f (Linear w b t)) (= u (ty b))", "(union (fout f) u)")
    rule("(= f (LinearNB w t)) (= (TA (TA s k) n) (ty w))", "(union (fout f) (TA s n))")
    # input types: the first Ty argument of a leaf, derived for the combinators
    for name, (sort, args) in SCHEMA.items():
        if sort != "F" or name in ("Comp", "Fork", "Map"):
            continue
        vars_ = [f"x{i}" for i in range(len(args))]
        first_ty = vars_[args.index("Ty")]
        rule(f"(= f ({name} {' '.join(vars_)}))", f"(union (fin f) {first_ty})")
    rule("(= f (Comp g h)) (= t (fin h))", "(union (fin f) t)")
    rule("(= f (Fork g h)) (= t (fin g))", "(union (fin f) t)")
    rule("(= f (Map g n)) (= t (fin g))", "(union (fin f) (TA t n))")
    rule("(= e (Var s t))", "(union (ty e) t)")
    rule("(= e (App f x)) (= t (fout f))", "(union (ty e) t)")
    rule("(= e (Pair a b)) (= t (ty a)) (= u (ty b))", "(union (ty e) (TP t u))")
    rule("(= e (Mask k t))", "(union (ty e) t)")
    rule("(= e (Fill v t))", "(union (ty e) t)")
    # views: functions that only re-index their input
    # re-indexings a move commutes with without changing the on-chip layout the device reads
    # (a Transpose does change it, so moves do not pass it)
    for name in ("Split", "Join", "Zip", "DistR", "Slice"):
        vars_ = " ".join(f"x{i}" for i in range(len(SCHEMA[name][1])))
        rule(f"(= f ({name} {vars_}))", "(reindex f)")
    rule("(= f (Transpose t))", "(isview f)")
    rule("(= f (Slide k st t))", "(isview f)")
    rule("(= f (Map g n)) (reindex g)", "(reindex f)")
    # layouts: re-indexings of one array (what codegen turns into strided views or host layouts)
    for name in ("Split", "Join", "Slice", "Transpose", "Slide"):
        vars_ = " ".join(f"x{i}" for i in range(len(SCHEMA[name][1])))
        rule(f"(= f ({name} {vars_}))", "(islayout f)")
    rule("(= f (Map g n)) (islayout g)", "(islayout f)")
    rule("(= f (Comp g h)) (islayout g) (islayout h)", "(islayout f)")
    rule("(= f (Comp g h)) (reindex g) (reindex h)", "(reindex f)")
    for name in ("Fst", "Snd", "Id"):
        rule(f"(= f ({name} t))", "(isview f)")
    rule("(reindex f)", "(isview f)")
    # views that read only the first / second part of a pair, re-indexed without changing the
    # layout of the rows a device reads (so a move hoisted before them still gives native
    # operands): re-indexings, and transposes of outer dimensions (rows stay whole)
    rule("(= f (Fst t))", "(readsfst f)")
    rule("(= f (Snd t))", "(readssnd f)")
    rule("(reindex f)", "(rowview f)")
    rule("(= f (Transpose (TA (TA (TA e k) m) n)))", "(rowview f)")
    rule("(= f (Map g n)) (rowview g)", "(rowview f)")
    rule("(= f (Comp g h)) (rowview g) (rowview h)", "(rowview f)")
    rule("(= f (Comp v g)) (rowview v) (readsfst g)", "(readsfst f)")
    rule("(= f (Comp v g)) (rowview v) (readssnd g)", "(readssnd f)")
    # stages that only move one part of a pair on chip
    rule("(= f (Fork (Comp (ToChip sp a) (Fst t)) (Snd t)))", "(ismove f)")
    rule("(= f (Fork (Fst t) (Comp (ToChip sp b) (Snd t))))", "(ismove f)")
    rule("(= f (Map g n)) (isview g)", "(isview f)")
    rule("(= f (Comp g h)) (isview g) (isview h)", "(isview f)")
    # where outputs live
    rule("(= f (ToChip sp t))", "(inspace f sp)")
    rule("(= f (Restage sp t))", "(inspace f sp)")
    rule("(= f (Const (App (ToChip sp t) c) u))", "(inspace f sp)")
    rule("(= f (Comp g h)) (isview g) (inspace h sp)", "(inspace f sp)")
    rule("(= f (Comp g h)) (inspace g sp)", "(inspace f sp)")
    rule("(= f (Comp (Pad l r t) h)) (inspace h sp)", "(inspace f sp)")  # codegen pads on chip in place
    rule("(= f (Map g n)) (inspace g sp)", "(inspace f sp)")
    rule("(= f (Reduce g t)) (inspace g sp)", "(inspace f sp)")
    rule("(= f (Fold g t)) (inspace g sp)", "(inspace f sp)")
    rule("(= f (Fork g h)) (inspace g sp) (inspace h sp)", "(inspace f sp)")
    return "\n".join(lines)


def rulesets_program() -> str:
    """Declarations of the rulesets of the three levels."""
    return "\n".join(f"(ruleset {level})" for level in LEVELS)
