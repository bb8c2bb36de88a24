#!/usr/bin/env python3
"""What the docs say about the plugin ABI, checked against plugin_api/include/kiln/plugin_api.h.

  abi_docs.py versions ROOT
      every statement of the *current* ABI version in the docs (docs/**/*.md, README.md,
      samples/**/*.md) and in the header's opening comment says the header's
      KILN_ABI_VERSION_MAJOR/MINOR, and the newest entry of plugin_api/CHANGELOG.md is that version;
      exit 1 naming file:line, what it says and what the header says.
  abi_docs.py capabilities ROOT
      docs/abi.md's capability table lists every KILN_CAPABILITY_* bit of the header, with its bit
      and the minor that introduced it (the header's "since M.m", else M.0), and nothing else;
      docs/writing-a-backend.md's Descriptor table names every bit, with "(M.m)" only for those
      after M.0; exit 1 naming what is missing or wrong.

The version numbers are read from the header's #define lines, as cmake/KilnInstall.cmake reads
them for kilnConfig.cmake. A statement of the current version is one of the phrasings below
(CLAIMS); a version named as history ("since 2.1", "a 2.1 plugin", "(64 in 2.0 and 2.1)", the
CHANGELOG's entries) is none of them and is left alone. Each phrasing has examples that it must and
must not match (EXAMPLES), checked first, so that a change to a pattern cannot quietly stop it from
seeing what it is for. docs/abi.md, docs/writing-a-backend.md and the header's comment must each
hold at least one statement: if a rewording leaves one without, the check says so instead of
passing.
"""
import argparse
import os
import re
import sys

HEADER = "plugin_api/include/kiln/plugin_api.h"
CHANGELOG = "plugin_api/CHANGELOG.md"
MUST_STATE = ["docs/abi.md", "docs/writing-a-backend.md", HEADER]

# Each phrasing gives a major, a minor or both (named groups; absent ones are not stated).
_V = r"(?P<major>\d+)\.(?P<minor>\d+)\b"
_WORD_END = r"(?![A-Za-z])"
CLAIMS = [
    # "kiln plugin ABI, version 2.3", "plugin ABI version 2.3"
    re.compile(r"\bABI,? version " + _V),
    # "`KILN_ABI_VERSION_MINOR`, now 3", "the major, now 2" (and "ahora", "agora")
    re.compile(r"(?<![A-Za-z])(?P<which>MAJOR|MINOR|[Mm]ajor|[Mm]inor)" + _WORD_END +
               r"[^.;\n]{0,40}?\b(?:now|currently|ahora|agora) (?P<n>\d+)\b(?![.\d])"),
    # "`KILN_PLUGIN_ABI_VERSION_MAJOR`/`_MINOR` (2 and 3 for this SDK)"
    re.compile(r"(?<![A-Za-z])(?:MAJOR|[Mm]ajor)" + _WORD_END + r"[^.;\n]{0,40}?(?:MINOR|[Mm]inor)" + _WORD_END +
               r"[^.;\n\d]{0,20}?\b(?P<major>\d+) and (?P<minor>\d+)\b"),
    # "2.3 for this SDK", "2.3 in this kiln"
    re.compile(r"\b" + _V + r"\)?,? (?:for|in|of) this (?:SDK|kiln|header)\b"),
    # "this kiln speaks 2.3", "this SDK speaks plugin ABI 2.3"
    re.compile(r"\b(?:this|the) (?:kiln|SDK|header|host) speaks (?:kiln )?(?:plugin )?(?:ABI )?" + _V),
    # "rebuild it against the kiln 2.x SDK"
    re.compile(r"\bkiln (?P<major>\d+)\.x SDK\b"),
    # "#define KILN_ABI_VERSION_MINOR 3" in a code block
    re.compile(r"#define KILN_ABI_VERSION_(?P<which>MAJOR|MINOR) (?P<n>\d+)\b"),
    # "the current plugin ABI is 2.3", "the ABI is now 2.3"
    re.compile(r"\bcurrent (?:kiln )?(?:plugin )?ABI(?: version)?(?: is|:)? " + _V),
    re.compile(r"\bABI (?:is )?now " + _V),
]

# (text, the version it states as (major, minor) with None for a part it does not state; None
# when it states none).
EXAMPLES = [
    ("/* kiln plugin ABI, version 2.0: the whole contract", (2, 0)),
    ("- **Major** (`KILN_ABI_VERSION_MAJOR`, now 2): must be equal on both sides.", (2, None)),
    ("- **Minor** (`KILN_ABI_VERSION_MINOR`, now 2): features added compatibly.", (None, 2)),
    ("the variables `KILN_PLUGIN_ABI_VERSION_MAJOR`/`_MINOR` (2 and 0 for this SDK).", (2, 0)),
    ("(\"/p/libkiln_old.so: plugin was built for kiln plugin ABI 1.2; this kiln speaks 2.0 —", (2, 0)),
    ("rebuild it against the kiln 2.x SDK\")", (2, None)),
    ("#define KILN_ABI_VERSION_MINOR 2", (None, 2)),
    ("The rules behind each step are in `docs/abi.md`; this SDK speaks plugin ABI 2.0.", (2, 0)),
    ("the current plugin ABI is 2.2", (2, 2)),
    ("The ABI is now 2.2.", (2, 2)),
    ("2.2 for this SDK", (2, 2)),
    ("and since 2.1 `_CONCURRENT_COMPILE`).", None),
    ("| `KilnPluginCompileArgs` | 80 (64 in 2.0 and 2.1) |", None),
    ("A 2.1 plugin is never offered anything; a 2.2 plugin in a 2.1 kiln finds the fields missing", None),
    ("the loader keeps accepting the 2.0 table size.", None),
    ("those copies as nodes whose addresses each launch sets (plugin ABI 2.3, `docs/abi.md`), so", None),
    ("hosts one major above and below the plugin's (3.0 and 1.0) are refused", None),
    ("Since 2.3 a graph may hold copies whose addresses change at every launch", None),
    ("| 4 | `KILN_CAPABILITY_CONCURRENT_COMPILE` | 2.1 | compile may run from several threads |", None),
    ("Skipped for a plugin at minor 0, as every plugin built against the 2.0 SDK is", None),
    ("A major bump is the only way to change or remove anything; a minor adds fields.", None),
]


def claims_in(text):
    """[(column, (major or None, minor or None))] for every statement of a version in one line."""
    found = {}
    for pattern in CLAIMS:
        for m in pattern.finditer(text):
            g = m.groupdict()
            if g.get("which"):
                major = int(g["n"]) if g["which"].lower() == "major" else None
                minor = int(g["n"]) if g["which"].lower() == "minor" else None
                col = m.start("n")
            else:
                major = int(g["major"]) if g.get("major") else None
                minor = int(g["minor"]) if g.get("minor") else None
                col = m.start("major")
            found.setdefault(col, (major, minor))
    return sorted(found.items())


def self_test():
    bad = []
    for text, want in EXAMPLES:
        got = claims_in(text)
        if want is None and got:
            bad.append(f"flags a historical mention as the current version: {text!r} -> {got}")
        elif want is not None and [v for _, v in got] != [want]:
            bad.append(f"misreads {text!r}: {[v for _, v in got]} instead of [{want}]")
    return bad


def header_version(root):
    version = {}
    with open(os.path.join(root, HEADER), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"#define KILN_ABI_VERSION_(MAJOR|MINOR) (\d+)\s*$", line)
            if m:
                version[m.group(1)] = int(m.group(2))
    if set(version) != {"MAJOR", "MINOR"}:
        sys.exit(f"abi_docs.py: cannot read KILN_ABI_VERSION_MAJOR/MINOR from {HEADER}")
    return version["MAJOR"], version["MINOR"]


def opening_comment(root):
    """The header's opening /* ... */ comment as (line number, text) pairs."""
    with open(os.path.join(root, HEADER), encoding="utf-8") as f:
        lines = f.read().split("\n")
    if not lines[0].startswith("/*"):
        sys.exit(f"abi_docs.py: {HEADER} does not begin with a /* comment")
    out = []
    for i, line in enumerate(lines, 1):
        out.append((i, line))
        if "*/" in line:
            break
    return out


def doc_files(root):
    files = ["README.md"]
    for top in ("docs", "samples"):
        for d, subdirs, names in os.walk(os.path.join(root, top)):
            subdirs.sort()
            files += sorted(os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith(".md"))
    return [f for f in files if os.path.isfile(os.path.join(root, f))]


def check_versions(root):
    bad = self_test()
    if bad:
        print("abi_docs.py: the patterns fail their own examples:\n  " + "\n  ".join(bad))
        return 1
    major, minor = header_version(root)
    expected = f"{major}.{minor}"
    sources = [(HEADER, opening_comment(root))]
    for rel in doc_files(root):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            sources.append((rel, list(enumerate(f.read().split("\n"), 1))))
    wrong, stated = [], set()
    for rel, lines in sources:
        for k, (number, text) in enumerate(lines):
            # A statement may wrap onto the next line: it is read with that line joined, and
            # counted on the line it starts on.
            joined = text + (" " + lines[k + 1][1].strip() if k + 1 < len(lines) else "")
            for col, (ma, mi) in claims_in(joined):
                if col >= len(text):
                    continue
                stated.add(rel)
                if (ma is not None and ma != major) or (mi is not None and mi != minor):
                    said = f"{ma}.{mi}" if ma is not None and mi is not None else (
                        f"major {ma}" if ma is not None else f"minor {mi}")
                    wrong.append(f"{rel}:{number}:{col + 1}: says {said}; the header says {expected} "
                                 f"(KILN_ABI_VERSION_MAJOR {major}, KILN_ABI_VERSION_MINOR {minor}): "
                                 f"{text.strip()}")
    for rel in MUST_STATE:
        if rel not in stated:
            wrong.append(f"{rel}: states no current ABI version in a form this check knows (it must: "
                         f"say {expected}, or teach tests/docs/abi_docs.py the new wording)")
    with open(os.path.join(root, CHANGELOG), encoding="utf-8") as f:
        for number, text in enumerate(f.read().split("\n"), 1):
            m = re.match(r"## (\d+)\.(\d+)\b", text)
            if m:
                if (int(m.group(1)), int(m.group(2))) != (major, minor):
                    wrong.append(f"{CHANGELOG}:{number}: the newest entry is {m.group(1)}.{m.group(2)}; "
                                 f"the header says {expected}")
                break
    for w in wrong:
        print(w)
    if wrong:
        print(f"FAIL: {len(wrong)} statement(s) of the plugin ABI version disagree with {HEADER} ({expected})")
        return 1
    print(f"ok: plugin ABI {expected}, stated in {len(stated)} file(s): {', '.join(sorted(stated))}")
    return 0


def header_capabilities(root, major):
    """{name: (bit, (major, minor) that introduced it)} from the header's KILN_CAPABILITY_* defines."""
    with open(os.path.join(root, HEADER), encoding="utf-8") as f:
        lines = f.read().split("\n")
    caps = {}
    for i, line in enumerate(lines):
        m = re.match(r"#define KILN_CAPABILITY_(\w+)\b", line)
        if not m:
            continue
        block = line
        j = i
        while lines[j].rstrip().endswith("\\"):
            j += 1
            block += " " + lines[j]
        bit = re.search(r"\(1ull << (\d+)\)", block)
        if not bit:
            sys.exit(f"abi_docs.py: {HEADER}:{i + 1}: cannot read the bit of KILN_CAPABILITY_{m.group(1)}")
        since = re.search(r"\bsince (\d+)\.(\d+)\b", " ".join(block.replace("\\", " ").split()))
        caps[m.group(1)] = (int(bit.group(1)), (int(since.group(1)), int(since.group(2))) if since else (major, 0))
    return caps


def check_capabilities(root):
    major, _ = header_version(root)
    caps = header_capabilities(root, major)
    wrong = []
    # docs/abi.md: | bit | `KILN_CAPABILITY_NAME` | M.m | meaning |
    rel = "docs/abi.md"
    listed = {}
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        for number, text in enumerate(f.read().split("\n"), 1):
            m = re.match(r"\|\s*(\d+)\s*\|\s*`KILN_CAPABILITY_(\w+)`\s*\|\s*(\d+)\.(\d+)\b", text)
            if m:
                listed[m.group(2)] = (number, int(m.group(1)), (int(m.group(3)), int(m.group(4))))
    for name, (bit, since) in sorted(caps.items(), key=lambda c: c[1][0]):
        if name not in listed:
            wrong.append(f"{rel}: the capability table lacks KILN_CAPABILITY_{name} (bit {bit}, since "
                         f"{since[0]}.{since[1]})")
            continue
        number, doc_bit, doc_since = listed[name]
        if (doc_bit, doc_since) != (bit, since):
            wrong.append(f"{rel}:{number}: KILN_CAPABILITY_{name} is bit {doc_bit} since {doc_since[0]}.{doc_since[1]} "
                         f"there; the header says bit {bit} since {since[0]}.{since[1]}")
    for name, (number, _, _) in sorted(listed.items()):
        if name not in caps:
            wrong.append(f"{rel}:{number}: KILN_CAPABILITY_{name} is not in {HEADER}")
    # docs/writing-a-backend.md: | `field` | `KILN_CAPABILITY_NAME` (M.m) | meaning |
    rel = "docs/writing-a-backend.md"
    named = {}
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        for number, text in enumerate(f.read().split("\n"), 1):
            m = re.match(r"\|[^|]*\|\s*`KILN_CAPABILITY_(\w+)`(?:\s*\((\d+)\.(\d+)\))?\s*\|", text)
            if m:
                named[m.group(1)] = (number, (int(m.group(2)), int(m.group(3))) if m.group(2) else (major, 0))
    for name, (bit, since) in sorted(caps.items(), key=lambda c: c[1][0]):
        if name not in named:
            wrong.append(f"{rel}: the Descriptor table lacks KILN_CAPABILITY_{name}")
        elif named[name][1] != since:
            wrong.append(f"{rel}:{named[name][0]}: KILN_CAPABILITY_{name} is marked "
                         f"{named[name][1][0]}.{named[name][1][1]}; the header says since {since[0]}.{since[1]}")
    for name, (number, _) in sorted(named.items()):
        if name not in caps:
            wrong.append(f"{rel}:{number}: KILN_CAPABILITY_{name} is not in {HEADER}")
    for w in wrong:
        print(w)
    if wrong:
        print(f"FAIL: the docs' capability lists disagree with {HEADER}")
        return 1
    print("ok: " + ", ".join(f"{n} (bit {b}, {s[0]}.{s[1]})" for n, (b, s) in sorted(caps.items(), key=lambda c: c[1][0])))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["versions", "capabilities"])
    parser.add_argument("root", help="the kiln source tree")
    a = parser.parse_args()
    return check_versions(a.root) if a.what == "versions" else check_capabilities(a.root)


if __name__ == "__main__":
    sys.exit(main())
