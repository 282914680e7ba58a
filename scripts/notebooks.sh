#!/usr/bin/env bash
# Executes every notebook under notebooks/ headless in the evcxr Jupyter
# kernel, failing on any cell error (each notebook's last cell asserts its
# expected values). Installs what is missing: Jupyter's nbconvert and
# kernel machinery from PyPI, and evcxr_jupyter with cargo (a debug build:
# ~10 min cold instead of ~23 min for a release one; the kernel only drives
# rustc, so its own speed does not matter).
#   scripts/notebooks.sh [NOTEBOOK...]
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*" >&2; }

if ! python3 -c 'import nbconvert, nbclient, ipykernel' >/dev/null 2>&1; then
    log "installing Jupyter (nbconvert, nbclient, ipykernel) from PyPI"
    python3 -m pip install --quiet jupyter nbconvert nbclient ipykernel
    hash -r
fi
if ! command -v evcxr_jupyter >/dev/null 2>&1; then
    log "installing evcxr_jupyter (cargo install --locked --debug; ~10 min cold)"
    cargo install --locked --debug evcxr_jupyter
fi
if ! jupyter kernelspec list 2>/dev/null | grep -q '^ *rust '; then
    evcxr_jupyter --install
fi

notebooks=("$@")
if [ ${#notebooks[@]} -eq 0 ]; then
    notebooks=(notebooks/*.ipynb)
fi
out=$(mktemp -d)
status=0
for nb in "${notebooks[@]}"; do
    log "executing $nb"
    name=$(basename "$nb")
    # --allow-errors so that the compiler's messages are kept in the output
    # (nbconvert hides them otherwise); the check below fails the run.
    if ! jupyter nbconvert --to notebook --execute --allow-errors \
        --ExecutePreprocessor.timeout=900 --ExecutePreprocessor.kernel_name=rust \
        --output-dir "$out" "$nb" >/dev/null 2>"$out/$name.log"; then
        cat "$out/$name.log" >&2
        status=1
        continue
    fi
    python3 - "$out/$name" <<'PY' || status=1
import json, sys
nb = json.load(open(sys.argv[1]))
errors = []
for i, cell in enumerate(nb["cells"]):
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            errors.append((i, output.get("ename", ""), output.get("evalue", ""), "\n".join(output.get("traceback", []))))
        elif output.get("name") == "stderr" and "panicked" in "".join(output.get("text", "")):
            errors.append((i, "panic", "".join(output.get("text", "")), ""))
for i, name, value, trace in errors:
    print(f"cell {i}: {name}: {value}\n{trace}", file=sys.stderr)
if errors:
    sys.exit(1)
last = "".join(o.get("text", "") if isinstance(o.get("text", ""), str) else "".join(o["text"]) for o in nb["cells"][-1].get("outputs", []))
if "all checks passed" not in last:
    print(f"{sys.argv[1]}: the last cell did not report its checks: {last!r}", file=sys.stderr)
    sys.exit(1)
print(f"{sys.argv[1]}: ok")
PY
done
rm -rf "$out"
exit $status
