#!/usr/bin/env python3
"""The code of the user guide (docs/guide.md, docs/es/guide.md, docs/pt/guide.md), checked.

  guide_code.py compile GUIDE --commands COMPILE_COMMANDS_JSON --out DIR
      compiles every ```cpp block of GUIDE against kiln; exit 1 when one does not compile.
  guide_code.py compare GUIDE OTHER...
      checks that the guides have the same code blocks; exit 1 when they differ.

How a ```cpp block is compiled:
  - A block whose first line that is not blank or a // comment is an #include is a whole program:
    it is compiled on its own, as it stands.
  - Any other block is a fragment: the body of a function of its own, in a scope of its own, after
    tests/docs/guide_preamble.h. The preamble includes LibTorch, kiln and the usual standard
    headers and gives every fragment the names of the guide's quick start program (model,
    optimizer, loss_fn, args, x, y, data, eval_data); a fragment may declare them again. A fragment
    has no #include: a block that needs another header starts with its #include lines and is a
    whole program.
  The fragments of a guide are compiled together, in one translation unit; each whole program is
  one more. #line directives make the compiler's messages name the guide and its line.

The compile command is the one CMake gives tests/docs/project/guide_code.cpp in a program that finds
kiln with find_package(kiln) and links kiln::kiln, as the guide's readers do
(Docs.GuideProjectConfigures configures it against the build tree), with -fsyntax-only: every
block is parsed and type-checked against kiln's and LibTorch's headers, templates instantiated;
nothing is linked or run.

Across languages the guides have the same fenced blocks in the same order, with the same info
string. Code is language-neutral, so only comments may be translated: // and /* */ comments in cpp
blocks, # comments in sh, cmake and toml blocks. Every other block (program output, kiln's
messages) is the same text. Blank lines and trailing spaces do not count.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

CPP = {"cpp", "c++", "cxx", "cc"}
HASH_COMMENTS = {"sh", "bash", "console", "cmake", "toml"}
INCLUDE = re.compile(r"^\s*#\s*include\b")


class Block:
    def __init__(self, lang, line, lines):
        self.lang = lang  # the info string's first word, lower case ("" when none)
        self.line = line  # the guide's line number of the block's first line of code
        self.lines = lines

    def is_whole_program(self):
        for text in self.lines:
            stripped = text.strip()
            if not stripped or stripped.startswith("//"):
                continue
            return bool(INCLUDE.match(text))
        return False


def read_blocks(path):
    """Every fenced block (``` or ~~~, not indented) of a Markdown file, in order."""
    blocks = []
    fence = None
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f.read().split("\n"), start=1):
            if fence is None:
                # Indented too: a block inside a list item is code like any other.
                m = re.match(r"^(\s*)(```+|~~~+)\s*([^`\s]*)", text)
                if m:
                    indent, fence = len(m.group(1)), m.group(2)
                    current = Block(m.group(3).lower(), number + 1, [])
                continue
            if text.strip().startswith(fence) and text.strip().strip(fence[0]) == "":
                blocks.append(current)
                fence = None
            else:
                # The fence's indentation is not part of the code.
                current.lines.append(text[indent:] if text[:indent].strip() == "" else text.lstrip())
    if fence is not None:
        sys.exit(f"{path}:{current.line - 1}: a code block is not closed")
    return blocks


# ---- compile ----


def probe_command(commands_path):
    """The compiler's arguments for guide_code.cpp, without its source, output and dependency file."""
    with open(commands_path, encoding="utf-8") as f:
        entries = json.load(f)
    for e in entries:
        if os.path.basename(e["file"]) == "guide_code.cpp":
            args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
            break
    else:
        sys.exit(f"{commands_path} has no entry for guide_code.cpp")
    kept = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-c", "-MF", "-MT", "-MQ"):
            skip = True
        elif a in ("-MD", "-MMD") or a == e["file"]:
            pass
        else:
            kept.append(a)
    return kept, e["directory"]


def line_directive(line, guide):
    return f'#line {line} "{guide}"\n'


def write_units(guide, blocks, out_dir):
    """The translation units to compile: (path, what it holds)."""
    os.makedirs(out_dir, exist_ok=True)
    units = []
    fragments = [b for b in blocks if not b.is_whole_program()]
    for b in fragments:
        for k, text in enumerate(b.lines):
            if INCLUDE.match(text):
                sys.exit(
                    f"{guide}:{b.line + k}: a fragment cannot #include; start the block with its #include "
                    "lines to make it a whole program (tests/docs/guide_code.py)")
    if fragments:
        path = os.path.join(out_dir, "fragments.cpp")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"// Generated by tests/docs/guide_code.py from {guide}: every fragment of the guide, "
                    "each the body of a function of its own.\n")
            f.write('#include "guide_preamble.h"\n')
            for b in fragments:
                f.write(f"\nvoid guide_fragment_at_line_{b.line}(KILN_GUIDE_GIVEN_NAMES) {{\n  {{\n")
                f.write(line_directive(b.line, guide))
                f.write("\n".join(b.lines) + "\n")
                f.write("  }\n}\n")
        units.append((path, "the fragments at lines " + ", ".join(str(b.line) for b in fragments)))
    for b in blocks:
        if b.is_whole_program():
            path = os.path.join(out_dir, f"program_at_line_{b.line}.cpp")
            with open(path, "w", encoding="utf-8") as f:
                f.write(line_directive(b.line, guide))
                f.write("\n".join(b.lines) + "\n")
            units.append((path, f"the whole program at line {b.line}"))
    return units


def compile_guide(args):
    guide = os.path.abspath(args.guide)
    blocks = [b for b in read_blocks(guide) if b.lang in CPP]
    if not blocks:
        sys.exit(f"{guide} has no ```cpp block: nothing to compile (is it the guide?)")
    command, directory = probe_command(args.commands)
    units = write_units(guide, blocks, os.path.abspath(args.out))
    failed = 0
    for path, what in units:
        start = time.monotonic()
        r = subprocess.run(command + ["-fsyntax-only", path], cwd=directory, capture_output=True, text=True)
        seconds = time.monotonic() - start
        status = "ok" if r.returncode == 0 else "FAILED"
        print(f"{status}: {what} ({os.path.basename(path)}, {seconds:.1f} s)", flush=True)
        if r.returncode != 0:
            failed += 1
            sys.stdout.write(r.stdout + r.stderr)
    print(f"{guide}: {len(blocks)} C++ blocks in {len(units)} translation units, {failed} failed")
    return 1 if failed else 0


# ---- compare ----


def strip_cpp_comments(lines):
    """The lines without // and /* */ comments (string and character literals kept)."""
    out = []
    in_block = False
    for text in lines:
        kept = []
        i, n = 0, len(text)
        quote = None
        while i < n:
            c = text[i]
            if in_block:
                if text.startswith("*/", i):
                    in_block = False
                    i += 2
                else:
                    i += 1
                continue
            if quote:
                kept.append(c)
                if c == "\\" and i + 1 < n:
                    kept.append(text[i + 1])
                    i += 2
                    continue
                if c == quote:
                    quote = None
                i += 1
                continue
            if text.startswith("//", i):
                break
            if text.startswith("/*", i):
                in_block = True
                i += 2
                continue
            # A ' after a digit or letter is a digit separator (1'000), not a character literal.
            if c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):
                quote = c
            kept.append(c)
            i += 1
        out.append("".join(kept))
    return out


def strip_hash_comments(lines):
    """The lines without # comments: a # at the start of a line or after a space, outside quotes."""
    out = []
    for text in lines:
        quote = None
        cut = len(text)
        for i, c in enumerate(text):
            if quote:
                if c == quote:
                    quote = None
            elif c in "'\"":
                quote = c
            elif c == "#" and (i == 0 or text[i - 1] in " \t"):
                cut = i
                break
        out.append(text[:cut])
    return out


def normalized(block):
    lines = block.lines
    if block.lang in CPP:
        lines = strip_cpp_comments(lines)
    elif block.lang in HASH_COMMENTS:
        lines = strip_hash_comments(lines)
    return [(k, t.rstrip()) for k, t in enumerate(lines) if t.strip()]


def compare_guides(args):
    reference = args.guides[0]
    ref_blocks = read_blocks(reference)
    if not ref_blocks:
        sys.exit(f"{reference} has no code block")
    problems = 0
    for other in args.guides[1:]:
        blocks = read_blocks(other)
        if len(blocks) != len(ref_blocks):
            print(f"{other} has {len(blocks)} code blocks, {reference} has {len(ref_blocks)}:")
            for k in range(max(len(blocks), len(ref_blocks))):
                a = f"line {ref_blocks[k].line} ({ref_blocks[k].lang or 'text'})" if k < len(ref_blocks) else "-"
                b = f"line {blocks[k].line} ({blocks[k].lang or 'text'})" if k < len(blocks) else "-"
                print(f"  block {k + 1}: {a} / {b}")
            problems += 1
            continue
        for k, (a, b) in enumerate(zip(ref_blocks, blocks)):
            where = f"block {k + 1}: {reference}:{a.line} and {other}:{b.line}"
            if a.lang != b.lang:
                print(f"{where}: ```{a.lang} and ```{b.lang}")
                problems += 1
                continue
            na, nb = normalized(a), normalized(b)
            for (ka, ta), (kb, tb) in zip(na, nb):
                if ta != tb:
                    print(f"{where} differ besides comments:\n  {reference}:{a.line + ka}: {ta.strip()}\n"
                          f"  {other}:{b.line + kb}: {tb.strip()}")
                    problems += 1
                    break
            else:
                if len(na) != len(nb):
                    longer, extra = (reference, a.line + na[len(nb)][0]) if len(na) > len(nb) else \
                        (other, b.line + nb[len(na)][0])
                    print(f"{where} differ besides comments: {longer}:{extra} has more code")
                    problems += 1
    if problems:
        print(f"{problems} difference(s): code is the same in every language; only comments are translated "
              "(tests/docs/guide_code.py)")
        return 1
    print(f"{len(ref_blocks)} code blocks, the same in {', '.join(args.guides)}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile every ```cpp block of a guide against kiln")
    c.add_argument("guide")
    c.add_argument("--commands", required=True, help="compile_commands.json of tests/docs/project")
    c.add_argument("--out", required=True, help="folder for the generated translation units")
    c.set_defaults(run=compile_guide)
    m = sub.add_parser("compare", help="check that the guides have the same code blocks")
    m.add_argument("guides", nargs="+")
    m.set_defaults(run=compare_guides)
    args = p.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
