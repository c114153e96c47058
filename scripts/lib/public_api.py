#!/usr/bin/env python3
"""Render a crate's public API from rustdoc JSON as sorted lines (scripts/public-api.sh runs it).

    python3 scripts/lib/public_api.py target/doc/distlock.json > docs/public-api/distlock.txt

One line per public item reachable from the crate root, sorted by path, with no ids, spans or
docs, so that two runs on the same code print the same text and an API change is a small diff:

    pub mod distlock::etcd
    pub struct distlock::ConnectOptions (has private fields)
    impl core::clone::Clone for distlock::ConnectOptions
    pub fn distlock::ConnectOptions::new() -> distlock::ConnectOptions
    pub field distlock::optimistic::Updated::value: T
    pub enum distlock::Error (non_exhaustive)
    variant distlock::Error::Timeout { .. }
    pub trait distlock::DistributedLock: core::marker::Send + core::marker::Sync
    pub use distlock::etcd::etcd_client (re-export of crate etcd_client)

What is listed: modules; structs, unions and enums (generics, `non_exhaustive`, whether fields
or variants are hidden), their public fields and their variants; functions and inherent methods
with their signatures (qualifiers, generics, bounds, where clauses, parameter and return types);
traits (supertraits, required and provided methods, associated types and constants); constants
and statics (with their value when rustdoc gives a short one); type aliases; macros; re-exports:
an item re-exported from a private module is listed at the path users name it by, a re-export
of a public item or of another crate's item is a `pub use` line.

Trait impls: every impl written in the crate or derived for a public type (`impl Clone for X`,
`impl From<E> for Error`, `impl Future for Lock { type Output = ... }`), with its associated
types; not rustdoc's synthetic auto-trait impls (Send, Sync, Unpin, UnwindSafe, ...) nor
blanket impls of other crates (`impl<T> From<T> for T`, `impl<T: Any> Any for T`), which every
type gets and which would drown the rest. Methods of trait impls are not listed: the trait says
what they are.

Types in signatures are named by their public path when the crate exposes them (otherwise by
rustdoc's path, where it was defined); the standard prelude's Option, Result, String, Vec and
Box by their short names.

The JSON format of rustdoc changes between nightlies: FORMAT_VERSION below is the one this
renderer was written for, and another one is refused (exit status 3) rather than rendered
wrongly. A shape it does not know is rendered as a short `?kind` placeholder, never a crash.
"""

import json
import sys

FORMAT_VERSION = 57

# Prelude types, named as users write them.
SHORT_NAMES = {
    ("core", "option", "Option"): "Option",
    ("core", "result", "Result"): "Result",
    ("alloc", "string", "String"): "String",
    ("alloc", "vec", "Vec"): "Vec",
    ("alloc", "boxed", "Box"): "Box",
}

# Impls derived alongside others that say nothing more (`derive(PartialEq)` implies it).
NOISE_TRAITS = [["core", "marker", "StructuralPartialEq"]]

# Sort rank of a line among the lines of the same path: the item, then its impls.
RANK_ITEM, RANK_IMPL = 0, 1


def one(obj):
    """The single (key, value) of an externally tagged enum value, or (None, obj)."""
    if isinstance(obj, dict) and len(obj) == 1:
        return next(iter(obj.items()))
    if isinstance(obj, str):
        return obj, None
    return None, obj


def unknown(what, obj):
    """A readable placeholder for a shape this renderer does not know."""
    key, _ = one(obj)
    return "?%s" % (key if isinstance(key, str) else what)


class Renderer:
    def __init__(self, doc):
        self.doc = doc
        self.index = doc.get("index", {})
        self.paths = doc.get("paths", {})
        self.crates = doc.get("external_crates", {})
        self.public = {}  # id -> public path (list of names) where this crate exposes it
        self.lines = []  # (sort key, rank, text)
        self.seen_impls = set()
        self.inlined = {}  # id -> the path where a re-export from a private module lists it
        self.candidates = {}  # id -> the paths of its re-exports from a private module
        self.glob_of = {}  # (module, private module) of glob re-exports listed in place
        self.problems = []

    # ----- items by id

    def item(self, id_):
        if id_ is None or isinstance(id_, (dict, list)):
            return None
        found = self.index.get(str(id_))
        return found if isinstance(found, dict) else None

    def use_name(self, use):
        name = use.get("name")
        return name if isinstance(name, str) else str(use.get("source") or "?").split("::")[-1]

    def ids(self, value):
        """A list of ids (module items, impls, fields), whatever the JSON holds instead."""
        return [i for i in value if isinstance(i, (int, str))] if isinstance(value, list) else []

    def name(self, item):
        name = item.get("name")
        return name if isinstance(name, str) else None

    def kind(self, item):
        key, _ = one(item.get("inner"))
        return key if isinstance(key, str) else "?"

    def inner(self, item):
        _, value = one(item.get("inner"))
        return value if isinstance(value, dict) else {}

    def path_of(self, id_, fallback=None):
        """The path users name an item by: its public path, else rustdoc's, else fallback."""
        if id_ is not None and id_ in self.public:
            return "::".join(self.public[id_])
        summary = self.paths.get(str(id_)) if id_ is not None else None
        if summary and summary.get("path"):
            names = tuple(summary["path"])
            return SHORT_NAMES.get(names, "::".join(names))
        return fallback if fallback is not None else "?"

    # ----- types

    def ty(self, t):
        key, v = one(t)
        try:
            if key == "resolved_path":
                return self.resolved(v)
            if key == "generic" or key == "primitive":
                return str(v)
            if key == "borrowed_ref":
                lifetime = v.get("lifetime")
                return "&%s%s%s" % (
                    lifetime + " " if lifetime else "",
                    "mut " if v.get("is_mutable") else "",
                    self.ty(v.get("type")),
                )
            if key == "raw_pointer":
                return "*%s %s" % ("mut" if v.get("is_mutable") else "const", self.ty(v.get("type")))
            if key == "slice":
                return "[%s]" % self.ty(v)
            if key == "array":
                return "[%s; %s]" % (self.ty(v.get("type")), v.get("len"))
            if key == "tuple":
                parts = [self.ty(x) for x in v]
                return "(%s%s)" % (", ".join(parts), "," if len(parts) == 1 else "")
            if key == "impl_trait":
                return "impl " + self.bounds(v)
            if key == "dyn_trait":
                parts = [self.poly_trait(p) for p in v.get("traits", [])]
                if v.get("lifetime"):
                    parts.append(v["lifetime"])
                return "dyn " + " + ".join(parts)
            if key == "infer":
                return "_"
            if key == "function_pointer":
                return self.fn_pointer(v)
            if key == "qualified_path":
                name = v.get("name", "?") + self.generic_args(v.get("args"))
                self_type = self.ty(v.get("self_type"))
                if v.get("trait"):
                    return "<%s as %s>::%s" % (self_type, self.resolved(v["trait"]), name)
                return "%s::%s" % (self_type, name)
            if key == "pat":
                return self.ty(v.get("type"))
        except (AttributeError, TypeError, KeyError):
            pass
        return unknown("type", t)

    def resolved(self, p):
        """A path to a type or trait, with its generic arguments."""
        if not isinstance(p, dict):
            return unknown("path", p)
        return self.path_of(p.get("id"), p.get("path")) + self.generic_args(p.get("args"))

    def generic_args(self, args):
        if args is None:
            return ""
        key, v = one(args)
        if key == "angle_bracketed":
            parts = [self.generic_arg(a) for a in v.get("args", [])]
            parts += [self.constraint(c) for c in v.get("constraints", [])]
            return "<%s>" % ", ".join(parts) if parts else ""
        if key == "parenthesized":
            out = v.get("output")
            return "(%s)%s" % (", ".join(self.ty(x) for x in v.get("inputs", [])), " -> " + self.ty(out) if out else "")
        if key == "return_type_notation":
            return "(..)"
        return "<%s>" % unknown("args", args)

    def generic_arg(self, a):
        key, v = one(a)
        if key == "lifetime":
            return str(v)
        if key == "type":
            return self.ty(v)
        if key == "const":
            return self.const_expr(v)
        if key == "infer":
            return "_"
        return unknown("arg", a)

    def const_expr(self, c):
        if isinstance(c, dict):
            value = c.get("value")
            return value if value is not None else str(c.get("expr", "_"))
        return unknown("const", c)

    def constraint(self, c):
        name = c.get("name", "?") + self.generic_args(c.get("args"))
        key, v = one(c.get("binding"))
        if key == "equality":
            tkey, tv = one(v)
            term = self.ty(tv) if tkey == "type" else self.const_expr(tv) if tkey == "constant" else unknown("term", v)
            return "%s = %s" % (name, term)
        if key == "constraint":
            return "%s: %s" % (name, self.bounds(v))
        return "%s: %s" % (name, unknown("binding", c.get("binding")))

    def bounds(self, bounds):
        return " + ".join(self.bound(b) for b in bounds or [])

    def bound(self, b):
        key, v = one(b)
        if key == "trait_bound":
            modifier = {"maybe": "?", "maybe_const": "[const] "}.get(v.get("modifier"), "")
            return self.hrtb(v.get("generic_params")) + modifier + self.resolved(v.get("trait"))
        if key == "outlives":
            return str(v)
        if key == "use":
            names = []
            for arg in v:
                akey, av = one(arg)
                names.append(str(av) if av is not None else str(akey))
            return "use<%s>" % ", ".join(names)
        return unknown("bound", b)

    def poly_trait(self, p):
        return self.hrtb(p.get("generic_params")) + self.resolved(p.get("trait"))

    def hrtb(self, params):
        return "for<%s> " % ", ".join(self.generic_param(p) for p in params) if params else ""

    def fn_pointer(self, v):
        sig = v.get("sig", {})
        inputs = ", ".join(self.ty(t) for _, t in sig.get("inputs", []))
        out = sig.get("output")
        return "%s%sfn(%s)%s" % (
            self.hrtb(v.get("generic_params")),
            self.qualifiers(v.get("header", {})),
            inputs,
            " -> " + self.ty(out) if out else "",
        )

    # ----- generics

    def generic_param(self, p):
        name = p.get("name", "?")
        key, v = one(p.get("kind"))
        if key == "lifetime":
            outlives = v.get("outlives") or []
            return name + (": " + " + ".join(outlives) if outlives else "")
        if key == "type":
            text = name
            if v.get("bounds"):
                text += ": " + self.bounds(v["bounds"])
            if v.get("default") is not None:
                text += " = " + self.ty(v["default"])
            return text
        if key == "const":
            text = "const %s: %s" % (name, self.ty(v.get("type")))
            if v.get("default") is not None:
                text += " = " + str(v["default"])
            return text
        return unknown("param", p)

    def generics(self, g):
        """`<...>` of a declaration; impl-Trait arguments' synthetic parameters left out."""
        params = []
        for p in (g or {}).get("params", []):
            key, v = one(p.get("kind"))
            if key == "type" and v.get("is_synthetic"):
                continue
            params.append(self.generic_param(p))
        return "<%s>" % ", ".join(params) if params else ""

    def where_clause(self, *generics):
        preds = []
        for g in generics:
            for w in (g or {}).get("where_predicates", []):
                preds.append(self.where_predicate(w))
        return " where " + ", ".join(preds) if preds else ""

    def where_predicate(self, w):
        key, v = one(w)
        if key == "bound_predicate":
            return "%s%s: %s" % (self.hrtb(v.get("generic_params")), self.ty(v.get("type")), self.bounds(v.get("bounds")))
        if key == "lifetime_predicate":
            return "%s: %s" % (v.get("lifetime"), " + ".join(v.get("outlives", [])))
        if key == "eq_predicate":
            rkey, rv = one(v.get("rhs"))
            rhs = self.ty(rv) if rkey == "type" else self.const_expr(rv) if rkey == "constant" else unknown("term", v.get("rhs"))
            return "%s = %s" % (self.ty(v.get("lhs")), rhs)
        return unknown("predicate", w)

    def args_of(self, g):
        """The parameters of an impl as arguments (`<T, 'a>`), for the path of its methods."""
        names = []
        for p in (g or {}).get("params", []):
            key, v = one(p.get("kind"))
            if key == "type" and v.get("is_synthetic"):
                continue
            names.append(p.get("name", "?"))
        return "<%s>" % ", ".join(names) if names else ""

    # ----- functions

    def qualifiers(self, header):
        text = ""
        if header.get("is_const"):
            text += "const "
        if header.get("is_async"):
            text += "async "
        if header.get("is_unsafe"):
            text += "unsafe "
        abi = header.get("abi", "Rust")
        if abi != "Rust":
            key, _ = one(abi)
            text += 'extern "%s" ' % (key if isinstance(key, str) else "?")
        return text

    def receiver(self, t):
        key, v = one(t)
        if key == "generic" and v == "Self":
            return "self"
        if key == "borrowed_ref" and one(v.get("type")) == ("generic", "Self"):
            lifetime = v.get("lifetime")
            return "&%s%sself" % (lifetime + " " if lifetime else "", "mut " if v.get("is_mutable") else "")
        return "self: " + self.ty(t)

    def signature(self, name, f, outer_generics=None):
        sig = f.get("sig", {})
        params = []
        for pair in sig.get("inputs", []):
            pname, ptype = pair[0], pair[1]
            params.append(self.receiver(ptype) if pname == "self" else "%s: %s" % (pname, self.ty(ptype)))
        if sig.get("is_c_variadic"):
            params.append("...")
        out = sig.get("output")
        return "%sfn %s%s(%s)%s%s" % (
            self.qualifiers(f.get("header", {})),
            name,
            self.generics(f.get("generics")),
            ", ".join(params),
            " -> " + self.ty(out) if out is not None else "",
            self.where_clause(outer_generics, f.get("generics")),
        )

    # ----- output

    def emit(self, path, text, rank=RANK_ITEM):
        self.lines.append(([str(name) for name in path], rank, str(text)))

    def marks(self, item):
        """Attributes that change what users may do with an item."""
        marks = []
        attrs = item.get("attrs") or []
        if "non_exhaustive" in attrs or any(isinstance(a, str) and "non_exhaustive" in a for a in attrs):
            marks.append("non_exhaustive")
        if item.get("deprecation") is not None:
            marks.append("deprecated")
        return " (%s)" % ", ".join(marks) if marks else ""

    # ----- the walk

    def collect(self, module_id, prefix, visiting):
        """Record the public path of every item reachable through public modules (not re-exports)."""
        module = self.item(module_id)
        if module is None or module_id in visiting:
            return
        visiting = visiting | {module_id}
        for child_id in self.ids(self.inner(module).get("items")):
            child = self.item(child_id)
            if child is None or self.kind(child) == "use" or self.name(child) is None:
                continue
            path = prefix + [self.name(child)]
            self.public.setdefault(child_id, path)
            if self.kind(child) == "module":
                self.collect(child_id, path, visiting)

    def collect_reexports(self, module_id, prefix, visiting):
        """Then the candidate paths of each item re-exported from a private module (each `pub
        use` of it); choose_reexports lists it at the shortest, so signatures name it as users
        do and the rest of its re-exports are `pub use` lines."""
        module = self.item(module_id)
        if module is None or module_id in visiting:
            return
        visiting = visiting | {module_id}
        for child_id in self.ids(self.inner(module).get("items")):
            child = self.item(child_id)
            if child is None:
                continue
            if self.kind(child) != "use":
                if self.kind(child) == "module" and self.name(child) is not None:
                    self.collect_reexports(child_id, prefix + [self.name(child)], visiting)
                continue
            use = self.inner(child)
            target_id = use.get("id")
            target = self.item(target_id)
            if target is None or target_id in self.public:
                continue
            if use.get("is_glob"):
                if self.kind(target) == "module":
                    self.glob_of[(module_id, target_id)] = True
                    self.collect_reexports(target_id, prefix, visiting)
                    for item_id in self.ids(self.inner(target).get("items")):
                        item = self.item(item_id)
                        if item is not None and self.kind(item) != "use" and self.name(item) is not None:
                            self.candidates.setdefault(item_id, []).append(prefix + [self.name(item)])
                continue
            name = self.use_name(use)
            path = prefix + [name]
            self.candidates.setdefault(target_id, []).append(path)
            if self.kind(target) == "module":
                self.collect_reexports(target_id, path, visiting)

    def choose_reexports(self):
        for target_id, paths in self.candidates.items():
            best = min(paths, key=lambda p: (len(p), p))
            self.public[target_id] = best
            self.inlined[target_id] = best
        # Items inside a private module re-exported whole: under the module's chosen path.
        for target_id, path in list(self.inlined.items()):
            if self.kind(self.item(target_id)) == "module":
                self.collect(target_id, path, frozenset())

    def module(self, module_id, prefix, visiting):
        module = self.item(module_id)
        if module is None or module_id in visiting:
            return
        visiting = visiting | {module_id}
        for child_id in self.ids(self.inner(module).get("items")):
            child = self.item(child_id)
            if child is None:
                continue
            if self.kind(child) == "use":
                try:
                    self.reexport(child, module_id, prefix, visiting)
                except Exception as error:  # as in render
                    self.problems.append("a re-export in %s: %s" % ("::".join(prefix), error))
                    self.emit(prefix + ["?"], "pub use %s::? (not rendered: %s)" % ("::".join(prefix), type(error).__name__))
            elif self.name(child) is not None:
                self.render(child_id, child, prefix + [self.name(child)], visiting)

    def reexport(self, item, module_id, prefix, visiting):
        use = self.inner(item)
        target_id = use.get("id")
        target = self.item(target_id)
        source = str(use.get("source") or "?")
        if use.get("is_glob"):
            if (module_id, target_id) in self.glob_of:
                self.module(target_id, prefix, visiting)  # a private module's items, here
            else:
                self.emit(prefix + ["*"], "pub use %s::* (re-export of %s::*)" % ("::".join(prefix), self.path_of(target_id, source)))
            return
        name = self.use_name(use)
        path = prefix + [name]
        if target is not None and self.inlined.get(target_id) == path:
            # From a private module: listed where users find it.
            self.render(target_id, target, path, visiting)
            return
        summary = self.paths.get(str(target_id)) or {}
        what = summary.get("kind", "item")
        origin = self.path_of(target_id, source)
        if summary.get("crate_id", 0) != 0 and what == "module" and len(summary.get("path", [])) == 1:
            text = "pub use %s (re-export of crate %s)" % ("::".join(path), origin)
        elif target_id is None:
            text = "pub use %s (re-export of %s, not documented)" % ("::".join(path), source)
        else:
            text = "pub use %s (re-export of %s %s)" % ("::".join(path), what, origin)
        self.emit(path, text)

    def render(self, id_, item, path, visiting):
        kind = self.kind(item)
        path = [str(name) for name in path]
        name = "::".join(path)
        try:
            self.render_kind(id_, item, kind, path, name, visiting)
        except Exception as error:  # a shape not foreseen: one line says so, the rest renders
            self.problems.append("%s (%s): %s" % (name, kind, error))
            self.emit(path, "%s %s (not rendered: %s)" % (kind, name, type(error).__name__))

    def render_kind(self, id_, item, kind, path, name, visiting):
        v = self.inner(item)
        marks = self.marks(item)
        if kind == "module":
            self.emit(path, "pub mod %s%s" % (name, marks))
            self.module(id_, path, visiting)
        elif kind in ("struct", "union"):
            self.struct(kind, v, path, name, marks)
            self.impls(v.get("impls", []), path, name + self.args_of(v.get("generics")))
        elif kind == "enum":
            hidden = " (has private variants)" if v.get("has_stripped_variants") else ""
            self.emit(path, "pub enum %s%s%s%s%s" % (name, self.generics(v.get("generics")), self.where_clause(v.get("generics")), marks, hidden))
            for variant_id in v.get("variants", []):
                self.variant(variant_id, path)
            self.impls(v.get("impls", []), path, name + self.args_of(v.get("generics")))
        elif kind == "function":
            self.emit(path, "pub " + self.signature(name, v) + marks)
        elif kind == "trait":
            self.trait(id_, v, path, name, marks)
        elif kind == "trait_alias":
            self.emit(path, "pub trait %s%s = %s%s" % (name, self.generics(v.get("generics")), self.bounds(v.get("params")), marks))
        elif kind == "type_alias":
            g = v.get("generics")
            self.emit(path, "pub type %s%s%s = %s%s" % (name, self.generics(g), self.where_clause(g), self.ty(v.get("type")), marks))
        elif kind == "constant":
            self.emit(path, "pub const %s: %s%s%s" % (name, self.ty(v.get("type")), self.value(v.get("const")), marks))
        elif kind == "static":
            quals = ("unsafe " if v.get("is_unsafe") else "") + ("mut " if v.get("is_mutable") else "")
            self.emit(path, "pub %sstatic %s%s: %s%s" % (quals, "", name, self.ty(v.get("type")), marks))
        elif kind == "macro":
            self.emit(path, "pub macro %s!%s" % (name, marks))
        elif kind == "proc_macro":
            self.emit(path, "pub proc_macro %s (%s)%s" % (name, v.get("kind", "?"), marks))
        elif kind == "extern_crate":
            self.emit(path, "pub extern crate %s%s" % (name, marks))
        elif kind == "extern_type":
            self.emit(path, "pub extern type %s%s" % (name, marks))
        else:
            self.emit(path, "%s %s%s" % (kind, name, marks))

    def value(self, c):
        if not isinstance(c, dict):
            return ""
        value = c.get("value")
        if value is None:
            value = c.get("expr")
        if value is None or value == "_" or len(value) > 80 or "\n" in value:
            return ""
        return " = " + value

    def struct(self, kind, v, path, name, marks):
        g = v.get("generics")
        head = "pub %s %s%s" % (kind, name, self.generics(g))
        skey, sv = one(v.get("kind")) if kind == "struct" else ("plain", {"fields": v.get("fields", []), "has_stripped_fields": v.get("has_stripped_fields")})
        if skey == "unit":
            self.emit(path, head + self.where_clause(g) + marks)
        elif skey == "tuple":
            fields = []
            for field_id in sv or []:
                field = self.item(field_id)
                fields.append("pub " + self.ty(self.inner_field(field)) if field is not None else "_")
            self.emit(path, "%s(%s)%s%s" % (head, ", ".join(fields), self.where_clause(g), marks))
        elif skey == "plain":
            hidden = " (has private fields)" if sv.get("has_stripped_fields") else ""
            self.emit(path, head + self.where_clause(g) + marks + hidden)
            for field_id in sv.get("fields", []):
                field = self.item(field_id)
                if field is not None and field.get("name") is not None:
                    fpath = path + [field["name"]]
                    self.emit(fpath, "pub field %s: %s%s" % ("::".join(fpath), self.ty(self.inner_field(field)), self.marks(field)))
        else:
            self.emit(path, head + " " + unknown("struct kind", v.get("kind")) + marks)

    def inner_field(self, field):
        key, value = one(field.get("inner"))
        return value if key == "struct_field" else field.get("inner")

    def variant(self, variant_id, enum_path):
        variant = self.item(variant_id)
        if variant is None or variant.get("name") is None:
            return
        path = enum_path + [variant["name"]]
        v = self.inner(variant)
        key, kv = one(v.get("kind"))
        if key == "plain":
            shape = ""
        elif key == "tuple":
            shape = "(%s)" % ", ".join(self.ty(self.inner_field(self.item(f))) if self.item(f) is not None else "_" for f in kv or [])
        elif key == "struct":
            fields = []
            for field_id in kv.get("fields", []):
                field = self.item(field_id)
                if field is not None:
                    fields.append("%s: %s" % (field.get("name"), self.ty(self.inner_field(field))))
            if kv.get("has_stripped_fields"):
                fields.append("..")
            shape = " { %s }" % ", ".join(fields) if fields else " {}"
        else:
            shape = " " + unknown("variant", v.get("kind"))
        discriminant = v.get("discriminant")
        if isinstance(discriminant, dict):
            shape += " = " + str(discriminant.get("value") or discriminant.get("expr"))
        self.emit(path, "variant %s%s%s" % ("::".join(path), shape, self.marks(variant)))

    def trait(self, id_, v, path, name, marks):
        g = v.get("generics")
        supertraits = ": " + self.bounds(v["bounds"]) if v.get("bounds") else ""
        quals = ("unsafe " if v.get("is_unsafe") else "") + ("auto " if v.get("is_auto") else "")
        dyn = "" if v.get("is_dyn_compatible", True) else " (not dyn-compatible)"
        self.emit(path, "pub %strait %s%s%s%s%s%s" % (quals, name, self.generics(g), supertraits, self.where_clause(g), marks, dyn))
        for member_id in v.get("items", []):
            member = self.item(member_id)
            if member is None or member.get("name") is None:
                continue
            mpath = path + [member["name"]]
            mname = "::".join(mpath)
            mkind, mv = self.kind(member), self.inner(member)
            if mkind == "function":
                provided = " (provided)" if mv.get("has_body") else ""
                self.emit(mpath, "pub " + self.signature(mname, mv) + provided + self.marks(member))
            elif mkind == "assoc_type":
                bounds = ": " + self.bounds(mv["bounds"]) if mv.get("bounds") else ""
                default = " = " + self.ty(mv["type"]) if mv.get("type") is not None else ""
                self.emit(mpath, "pub type %s%s%s%s" % (mname, self.generics(mv.get("generics")), bounds, default))
            elif mkind == "assoc_const":
                default = " = " + str(mv["value"]) if mv.get("value") is not None else ""
                self.emit(mpath, "pub const %s: %s%s" % (mname, self.ty(mv.get("type")), default))
            else:
                self.emit(mpath, "%s %s" % (mkind, mname))
        # Impls of this trait for types of other crates (those for our types are listed there).
        for impl_id in v.get("implementations", []):
            impl = self.item(impl_id)
            if impl is None:
                continue
            for_path = self.type_key(self.inner(impl).get("for"))
            self.impl(impl_id, impl, for_path, None)

    def type_key(self, t):
        """The sort path of an impl's self type: the path of the type it is for."""
        key, v = one(t)
        if key == "resolved_path" and isinstance(v, dict):
            return self.path_of(v.get("id"), v.get("path")).split("::")
        if key == "borrowed_ref" and isinstance(v, dict):
            return self.type_key(v.get("type"))
        return [self.ty(t)]

    def impls(self, impl_ids, path, self_name):
        for impl_id in impl_ids:
            impl = self.item(impl_id)
            if impl is not None:
                self.impl(impl_id, impl, path, self_name)

    def impl(self, impl_id, impl, path, self_name):
        if impl_id in self.seen_impls:
            return
        self.seen_impls.add(impl_id)
        v = self.inner(impl)
        if v.get("is_synthetic") or v.get("blanket_impl") is not None:
            return
        trait_path = self.paths.get(str((v.get("trait") or {}).get("id")), {}).get("path")
        if trait_path in NOISE_TRAITS:
            return
        g = v.get("generics")
        if v.get("trait") is None:
            # Inherent: its public methods and constants, under the type's path.
            for member_id in v.get("items", []):
                member = self.item(member_id)
                if member is None or member.get("name") is None or member.get("visibility") != "public":
                    continue
                mpath = path + [member["name"]]
                mname = "%s::%s" % (self_name or self.ty(v.get("for")), member["name"])
                mkind, mv = self.kind(member), self.inner(member)
                if mkind == "function":
                    self.emit(mpath, "pub " + self.signature(mname, mv, g) + self.marks(member))
                elif mkind == "assoc_const":
                    self.emit(mpath, "pub const %s: %s%s" % (mname, self.ty(mv.get("type")), self.value({"value": mv.get("value")})))
                else:
                    self.emit(mpath, "%s %s" % (mkind, mname))
            return
        text = "%simpl%s %s%s for %s%s" % (
            "unsafe " if v.get("is_unsafe") else "",
            self.generics(g),
            "!" if v.get("is_negative") else "",
            self.resolved(v.get("trait")),
            self.ty(v.get("for")),
            self.where_clause(g),
        )
        assoc = []
        for member_id in v.get("items", []):
            member = self.item(member_id)
            if member is None:
                continue
            mkind, mv = self.kind(member), self.inner(member)
            if mkind == "assoc_type" and mv.get("type") is not None:
                assoc.append("type %s%s = %s;" % (member.get("name"), self.generics(mv.get("generics")), self.ty(mv["type"])))
            elif mkind == "assoc_const":
                assoc.append("const %s: %s;" % (member.get("name"), self.ty(mv.get("type"))))
        if assoc:
            text += " { %s }" % " ".join(sorted(assoc))
        self.emit(path, text, RANK_IMPL)

    def run(self):
        root = self.doc.get("root")
        root_item = self.item(root)
        if root_item is None:
            raise SystemExit("public_api.py: the JSON has no root module")
        prefix = [self.name(root_item) or "crate"]
        self.collect(root, prefix, frozenset())
        self.collect_reexports(root, prefix, frozenset())
        self.choose_reexports()
        self.module(root, prefix, frozenset())
        # Sorted by path (compared name by name), then the item before its impls; one line each.
        unique = sorted(set((tuple(p), r, t) for p, r, t in self.lines))
        return [t for _, _, t in unique]


def main(argv):
    if len(argv) != 2:
        print("usage: public_api.py RUSTDOC.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        doc = json.load(f)
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        print(
            "public_api.py: %s is rustdoc JSON format %s; this renderer reads format %s only. "
            "Use the nightly scripts/public-api.sh pins, or update the renderer (and FORMAT_VERSION) "
            "to the new format." % (argv[1], version, FORMAT_VERSION),
            file=sys.stderr,
        )
        return 3
    renderer = Renderer(doc)
    lines = renderer.run()
    for problem in renderer.problems:
        print("public_api.py: not rendered: " + problem, file=sys.stderr)
    header = "# The public API of crate %s, rendered from rustdoc JSON by scripts/public-api.sh: do not edit, regenerate." % (
        renderer.item(doc.get("root")) or {}
    ).get("name", "?")
    sys.stdout.write(header + "\n" + "".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
