#!/usr/bin/env python3
"""Checks that library modules include only modules below them (and themselves).

The module order comes from one place: the table "Layers of the library" in docs/architecture.md
(bottom up: core, ops, comm, ...). Every file under include/megadlm/<module>/ and src/<module>/
(any depth; .h .hpp .cpp .cc .cu .cuh .inc) is read, and each `#include "megadlm/<m>/..."` or
src-relative `#include "<m>/..."` is resolved to module <m> (a path relative to the including
file, "../model/x.h", to the folder it reaches); including a module that comes later in the
order is a violation. A library file including the umbrella megadlm/megadlm.h is one too
(it pulls in every module). Folders under include/megadlm/ or src/ that the table does not name
are reported, so a new module cannot appear without a row in the table.

Not restricted: the umbrella include/megadlm/megadlm.h itself, other top-level files of
include/megadlm/ and src/, and everything outside the library (apps/, tests/, examples/): those
sit above every module and may include any of them.

Usage:  scripts/check_layering.py [--root DIR]   exit 0 clean, 1 violations, 2 unreadable table
        scripts/check_layering.py --self-test    checks this script on a small temporary tree
Python 3 standard library only (CI runs it before building).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

TABLE_HEADING = "Layers of the library"
ARCH_DOC = os.path.join("docs", "architecture.md")
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")
UMBRELLA = "megadlm/megadlm.h"
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


class TableError(Exception):
    """docs/architecture.md has no module table this script can read."""


def read_module_order(root):
    """Returns the module names of the "Layers of the library" table, bottom layer first."""
    path = os.path.join(root, ARCH_DOC)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise TableError(f"cannot read {ARCH_DOC}: {e.strerror}")
    heading = next((i for i, line in enumerate(lines)
                    if line.lstrip().startswith("#") and TABLE_HEADING in line), None)
    if heading is None:
        raise TableError(f"{ARCH_DOC} has no heading containing '{TABLE_HEADING}'")
    # The table is the first run of '|' lines after the heading, before the next heading.
    rows = []
    for line in lines[heading + 1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            break
        if stripped.startswith("|"):
            rows.append(stripped)
        elif rows:
            break
    if len(rows) < 3:
        raise TableError(f"{ARCH_DOC}: no markdown table (header, separator, rows) under "
                         f"'{TABLE_HEADING}'")
    if not re.fullmatch(r"\|[\s:|-]+\|?", rows[1]):
        raise TableError(f"{ARCH_DOC}: the second line of the '{TABLE_HEADING}' table is not a "
                         f"separator row: {rows[1]}")
    modules = []
    for row in rows[2:]:
        first_cell = row.strip("|").split("|")[0].strip()
        name = re.fullmatch(r"`([a-z_][a-z0-9_]*)`", first_cell)
        if not name:
            raise TableError(f"{ARCH_DOC}: the first cell of every row of the '{TABLE_HEADING}' "
                             f"table must be a module name in backticks, got: {first_cell!r}")
        if name.group(1) in modules:
            raise TableError(f"{ARCH_DOC}: module '{name.group(1)}' is listed twice in the "
                             f"'{TABLE_HEADING}' table")
        modules.append(name.group(1))
    return modules


def module_of_path(root, path):
    """The module folder a file lies in (include/megadlm/<m>/... or src/<m>/...), or None."""
    rel = os.path.relpath(os.path.normpath(path), root).split(os.sep)
    if len(rel) >= 4 and rel[0] == "include" and rel[1] == "megadlm":
        return rel[2]
    if len(rel) >= 3 and rel[0] == "src":
        return rel[1]
    return None


def included_module(root, includer, delimiter, target, modules):
    """The module an include names, or None for a path that is no module's (a system or
    third-party header)."""
    parts = target.split("/")
    if parts[0] == "megadlm" and len(parts) >= 3:
        return parts[1]
    if delimiter != '"':
        return None
    # src-relative includes ("ops/dispatch.h") are written with quotes...
    if len(parts) >= 2 and parts[0] in modules:
        return parts[0]
    # ...and so are paths relative to the includer ("flag_value.h", "../model/x.h").
    beside = os.path.join(root, os.path.dirname(includer), target)
    if os.path.isfile(beside):
        return module_of_path(root, beside)
    return None


def include_lines(path):
    """Yields (line number, '<' or '"', include target) for each #include outside block comments."""
    in_comment = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if in_comment:
                end = line.find("*/")
                if end < 0:
                    continue
                line = line[end + 2:]
                in_comment = False
            match = INCLUDE_RE.match(line)
            if match:
                yield number, match.group(1), match.group(2)
            # A block comment opened on this line (and not closed on it) hides the next ones.
            code = re.sub(r"/\*.*?\*/", "", line.split("//")[0])
            if "/*" in code:
                in_comment = True


def library_files(root):
    """Yields (folder name, path relative to root) for every source file under a folder of
    include/megadlm/ or src/; the folder name is the module it belongs to."""
    for base in (os.path.join("include", "megadlm"), "src"):
        base_dir = os.path.join(root, base)
        if not os.path.isdir(base_dir):
            continue
        for entry in sorted(os.listdir(base_dir)):
            folder = os.path.join(base_dir, entry)
            if not os.path.isdir(folder):
                continue  # top-level files (the umbrella, src/CMakeLists.txt) are not restricted
            for dirpath, dirnames, filenames in os.walk(folder):
                dirnames.sort()
                for name in sorted(filenames):
                    if name.endswith(SOURCE_SUFFIXES):
                        yield entry, os.path.relpath(os.path.join(dirpath, name), root)


def check(root):
    """Returns the list of violation lines for the tree at root (empty when clean)."""
    modules = read_module_order(root)
    rank = {m: i for i, m in enumerate(modules)}
    order = " -> ".join(modules)
    problems = []
    unknown_folders = set()
    for module, rel in library_files(root):
        if module not in rank:
            folder = os.path.dirname(rel).split(os.sep)
            top = os.path.join(*folder[:3]) if folder[0] == "include" else os.path.join(*folder[:2])
            if top not in unknown_folders:
                unknown_folders.add(top)
                problems.append(f"{top}/: folder '{module}' is not a module of {ARCH_DOC}'s "
                                f"'{TABLE_HEADING}' table ({order}); add a row there or move "
                                f"the code into a module")
            continue
        for line, delimiter, target in include_lines(os.path.join(root, rel)):
            if target == UMBRELLA:
                problems.append(f"{rel}:{line}: module '{module}' includes the umbrella header "
                                f"{UMBRELLA}, which is for users only; include the precise "
                                f"headers of modules at or below '{module}' ({order})")
                continue
            used = included_module(root, rel, delimiter, target, modules)
            if used is None:
                continue
            if used not in rank:
                problems.append(f"{rel}:{line}: module '{module}' includes '{target}', and "
                                f"'{used}' is not a module of {ARCH_DOC}'s order ({order})")
            elif rank[used] > rank[module]:
                problems.append(f"{rel}:{line}: module '{module}' includes '{used}' ({target}), "
                                f"which is above it in {ARCH_DOC}'s module order ({order})")
    return problems


def run_check(root):
    try:
        problems = check(root)
    except TableError as e:
        print(f"check_layering: {e}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem)
    if problems:
        print(f"check_layering: {len(problems)} layering violation(s); each module may include "
              f"only itself and the modules before it in {ARCH_DOC}", file=sys.stderr)
        return 1
    print(f"check_layering: OK ({os.path.abspath(root)})")
    return 0


# ---- self-test ---------------------------------------------------------------------------------

SELF_TEST_DOC = """# fake architecture
## Layers of the library (bottom up)

| module | owns | notes |
|---|---|---|
| `core` | tensors | |
| `ops` | math | |
| `parallel` | layouts | |
| `model` | layers | |

## Next section
"""

SELF_TEST_FILES = {
    "include/megadlm/core/tensor.h": "#pragma once\n#include <vector>\n",
    "include/megadlm/ops/gemm.h": "#pragma once\n#include \"megadlm/core/tensor.h\"\n",
    "src/ops/cuda/gemm.cu": "#include \"core/cuda/cuda_utils.h\"\n#include \"ops/dispatch.h\"\n",
    "src/core/cuda/cuda_utils.h": "#pragma once\n",
    # Comments and text after the include are not includes of the model module.
    "src/parallel/tensor_parallel/linear.cpp": (
        "// #include \"megadlm/model/gpt_model.h\" is what we must not do\n"
        "/* also not:\n#include \"model/layer.h\"\n*/\n"
        "#include \"megadlm/parallel/linear.h\"\n#include \"megadlm/ops/gemm.h\"\n"
        "#include \"local_helper.h\"\n"),
    "src/model/layer.inc": "#include \"parallel/linear.h\"\n",
    # Not restricted: the umbrella and everything outside the library.
    "include/megadlm/megadlm.h": "#include \"megadlm/model/gpt_model.h\"\n",
    "tests/unit/core/test_tensor.cpp": "#include \"megadlm/model/gpt_model.h\"\n",
    "apps/main.cpp": "#include \"megadlm/model/gpt_model.h\"\n",
}

# The one wrong include: a parallel file (line 3) reaching up into model.
SELF_TEST_BAD_FILE = "src/parallel/data_parallel/buckets.cpp"
SELF_TEST_BAD_TEXT = ("// owns buckets\n#include \"megadlm/ops/gemm.h\"\n"
                      "#include \"megadlm/model/param_hooks.h\"\n")
SELF_TEST_EXPECTED = (f"{SELF_TEST_BAD_FILE}:3: module 'parallel' includes 'model' "
                      "(megadlm/model/param_hooks.h), which is above it in docs/architecture.md's "
                      "module order (core -> ops -> parallel -> model)")


def self_test():
    def write(root, rel, text):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    def run(root):
        result = subprocess.run([sys.executable, os.path.abspath(__file__), "--root", root],
                                capture_output=True, text=True)
        return result.returncode, result.stdout.splitlines(), result.stderr

    failures = []
    with tempfile.TemporaryDirectory(prefix="check_layering_") as root:
        write(root, ARCH_DOC, SELF_TEST_DOC)
        for rel, text in SELF_TEST_FILES.items():
            write(root, rel, text)

        rc, out, err = run(root)
        if rc != 0:
            failures.append(f"clean tree: expected exit 0, got {rc}: {out} {err}")

        write(root, SELF_TEST_BAD_FILE, SELF_TEST_BAD_TEXT)
        rc, out, err = run(root)
        if rc != 1:
            failures.append(f"tree with one wrong include: expected exit 1, got {rc}")
        if out != [SELF_TEST_EXPECTED]:
            failures.append("tree with one wrong include: expected exactly\n  "
                            f"{SELF_TEST_EXPECTED}\ngot\n  " + "\n  ".join(out))

        os.remove(os.path.join(root, SELF_TEST_BAD_FILE))
        # A path relative to the includer resolves to the folder it reaches.
        write(root, "src/ops/cpu/norm.cpp", "#include \"../../model/layer.inc\"\n")
        rc, out, err = run(root)
        expected = ("src/ops/cpu/norm.cpp:1: module 'ops' includes 'model' (../../model/layer.inc), "
                    "which is above it")
        if rc != 1 or len(out) != 1 or not out[0].startswith(expected):
            failures.append(f"a relative include into a later module: expected exit 1 and one line "
                            f"starting '{expected}', got {rc}: {out}")
        os.remove(os.path.join(root, "src/ops/cpu/norm.cpp"))

        write(root, "src/training/trainer.cpp", "#include \"core/tensor.h\"\n")
        rc, out, err = run(root)
        if rc != 1 or len(out) != 1 or not out[0].startswith("src/training/: folder 'training'"):
            failures.append(f"a folder missing from the table: expected one 'not a module' "
                            f"line and exit 1, got {rc}: {out}")
        os.remove(os.path.join(root, "src/training/trainer.cpp"))

        write(root, ARCH_DOC, "# fake architecture\n\nno table here\n")
        rc, out, err = run(root)
        if rc != 2 or TABLE_HEADING not in err:
            failures.append(f"missing table: expected exit 2 naming '{TABLE_HEADING}', got {rc}: "
                            f"{err}")

    if failures:
        print("check_layering --self-test FAILED:\n" + "\n".join(failures))
        return 1
    print("check_layering --self-test: OK")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       os.pardir),
                        help="repository root (default: the folder above scripts/)")
    parser.add_argument("--self-test", action="store_true",
                        help="check this script on a temporary tree and exit")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    return run_check(args.root)


if __name__ == "__main__":
    sys.exit(main())
