#!/usr/bin/env bash
# docs/rules.md lists every rule id the programs can print, and nothing else: the ids are taken
# from the string literals of src/ and apps/ (the rule files pass them to Diagnostics::error as
# "V-22", "V-19, G-2", ...; a few messages spell them inline, "... [M-31]", "R-1 (...)") and from
# the anchors `<a id="V-22"></a>` of docs/rules.md. Fails naming each id missing on one side.
set -uo pipefail
src=$2
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
exec python3 - "$src" <<'EOF'
import os, re, sys

src = sys.argv[1]
# Rule families (docs/rules.md): Megatron's V/B/C/G/R, MegaDLMs' D, FSDP's F, megadlm's M and MOE, the FP8 family
RULE = re.compile(r"(?<![A-Za-z0-9_-])((?:V|B|C|D|F|G|M|R|MOE|FP8)-[0-9]+)(?![0-9A-Za-z_])")
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')

printed = {}
for top in ("src", "apps"):
    for root, _, files in os.walk(os.path.join(src, top)):
        for name in files:
            if not name.endswith((".cpp", ".h", ".cu", ".cuh")):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    code = line.strip()
                    if code.startswith("//") or code.startswith("*"):
                        continue  # comments cite ids too; only strings reach the user
                    for literal in LITERAL.finditer(line):
                        for rule in RULE.findall(literal.group(1)):
                            printed.setdefault(rule, f"{os.path.relpath(path, src)}:{number}")

doc_path = os.path.join(src, "docs", "rules.md")
with open(doc_path, encoding="utf-8") as f:
    doc = f.read()
documented = set(re.findall(r'<a id="([A-Z][A-Z0-9]*-[0-9]+)"></a>', doc))

problems = []
for rule in sorted(set(printed) - documented):
    problems.append(f"{rule} (printed at {printed[rule]}) has no entry <a id=\"{rule}\"></a> in docs/rules.md")
for rule in sorted(documented - set(printed)):
    problems.append(f"docs/rules.md documents {rule}, which no source prints any more: "
                    f"move it to its family's 'Not printed' paragraph")
if len(printed) < 100:
    problems.append(f"only {len(printed)} rule ids found in the sources: the extraction is broken")
if problems:
    print("FAIL:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"OK: {len(printed)} rule ids printed by the sources, each documented in docs/rules.md")
EOF
